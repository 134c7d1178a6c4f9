"""Process sets (hvd.add_process_set, process_set=) in real multi-process runs
of 3 and 4 ranks: collectives run among the set's members only (results
numbered by set rank), names are matched per set, misuse raises
ProcessSetError naming the rank and the set, and nothing hangs."""

from __future__ import annotations

import pytest

from mpi_run import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=[3, 4])
def numpy_run(request):
    return run_mpi("process_sets_cases.py", request.param, "numpy", timeout=120)


def _members(n, r):
    return [m for m in range(n) if m % 2 == r % 2]


def test_collectives_run_among_the_set(numpy_run):
    n = numpy_run.nprocs
    for r, rep in numpy_run.results.items():
        ms = _members(n, r)
        k, me = len(ms), ms.index(r)
        assert rep["ids"] == [1, 2] and rep["set_rank"] == me and rep["set_size"] == k
        assert rep["included"] == [r % 2 == 0, r % 2 == 1]
        assert rep["str"] == f"ProcessSet(process_set_id={1 + r % 2}, ranks={ms}, mpi_comm=None)"
        assert rep["allreduce"] == [sum(ms), k]
        assert rep["average"] == [sum(ms) / k]
        assert rep["grouped"] == [[float(sum(ms))] * 2, [k]]
        assert rep["allgather"] == [m for m in ms for _ in range(m + 1)]
        assert rep["broadcast"] == [ms[-1] * 10] and rep["object"] == {"from": ms[-1]}
        assert rep["objects"] == ms
        assert rep["alltoall"] == [[100 * m + me for m in ms], [1] * k]
        rows = (2 * k + 1) // k + (1 if me < (2 * k + 1) % k else 0)
        assert rep["reducescatter"] == [[float(k)] * 2] * rows
        assert rep["same_name"] == [float(k)] and rep["global"] == [float(n)]


def test_remove_and_add_again(numpy_run):
    n = numpy_run.nprocs
    for r, rep in numpy_run.results.items():
        assert rep["removed"] == [True, True, False] and rep["cleared"] == [None, None]
        assert rep["again"] == [1, [0, n - 1]]  # the smallest free id is reused
        assert rep.get("again_sum") == ([2] if r in (0, n - 1) else None)
        assert rep["after"] == [n]


def test_misuse_raises_process_set_errors_without_hanging():
    result = run_mpi("process_sets_cases.py", 3, "misuse", timeout=120)
    for r, rep in result.results.items():
        for key in ("outside", "root_outside", "never_added", "duplicate", "duplicate_global", "out_of_range",
                    "removed_use"):
            name, message, is_value_error = rep[key]
            assert name == "ProcessSetError" and is_value_error, (r, key, rep[key])
            assert f"rank {r}" in message, (key, message)
        assert "not in ProcessSet(process_set_id=" in rep["outside"][1]
        assert "root_rank" in rep["root_outside"][1]
        assert "never added" in rep["never_added"][1] and "never added" in rep["removed_use"][1]
        assert "duplicate of process set 1" in rep["duplicate"][1]
        assert "duplicate of the global process set" in rep["duplicate_global"][1]
        assert rep["comm"][0] == "NotSupportedError"
        assert rep["mismatch"][0] == "MismatchError" and "disagree on ranks" in rep["mismatch"][1]
        assert rep["after"] == [3]


def test_init_adds_the_listed_sets_in_order():
    result = run_mpi("process_sets_cases.py", 3, "init_sets", timeout=120)
    for r, rep in result.results.items():
        assert rep["ids"] == [1, 2] and rep["global"] == [0, 1, 2]
        assert rep["sums"] == [[1] if r in (0, 1) else None, [3] if r in (1, 2) else None]
