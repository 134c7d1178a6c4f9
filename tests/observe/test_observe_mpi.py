"""Slow-rank report, timeline, stall inspector and Horovod communicator
sharing, in real multi-process runs.

Each scenario is a case of tests/workers/observe_cases.py, which asserts on
every rank what that rank can tell; these tests check that the run succeeded
(or failed as it must), the job's log, and what only several ranks show."""

import re

import pytest

from workers.support import run_case_job

from hvd_partial.observe.timeline import load_events, merge, rank_files

pytestmark = pytest.mark.mpi

CASES = "observe_cases.py"


@pytest.mark.timing
@pytest.mark.parametrize("mode", ["solo", "sync"])
def test_report_names_the_slow_rank_on_every_rank_and_rank0_logs_it(mode):
    nprocs = 4
    res = run_case_job(CASES, nprocs, "report", mode, timeout=90)
    if mode == "sync":  # snapshots may differ by a round in solo
        assert len({res.results[r]["rounds"] for r in range(nprocs)}) == 1, res.results
    logged = [block for block in res.stderr.split("INFO hvd_partial.report: ")[1:]]
    assert len(logged) >= 3, res.tail()  # every 0.4 s over 2 s, plus the final one
    naming = [block for block in logged if "holding others back: rank 2" in block]
    assert "holding others back: rank 2" in logged[-1] and len(naming) >= len(logged) // 2, logged
    assert re.search(r"\d+ rounds, [\d.]+ rounds/s", logged[-1])


def test_timeline_has_the_spans_of_every_rank_and_round(tmp_path):
    nprocs = 3
    filename = str(tmp_path / "tl.json")
    res = run_case_job(CASES, nprocs, "timeline", timeout=90, env={"HVD_PARTIAL_TIMELINE_FILENAME": filename})
    files = rank_files(filename)
    assert [f.rsplit(".rank", 1)[1] for f in files] == ["0.json", "1.json", "2.json"]
    for stream in ("solo", "sync"):  # same rounds, same facts on every rank
        per_rank = [res.results[rank]["reductions"][stream] for rank in range(nprocs)]
        assert per_rank[0] == per_rank[1] == per_rank[2], stream
    out, count, total = merge(filename)
    assert count == nprocs and total == sum(len(load_events(f)) for f in files)
    assert total == sum(res.results[rank]["events"] for rank in range(nprocs))


def test_stall_warning_names_the_rank_on_every_rank_and_not_an_idle_phase():
    res = run_case_job(CASES, 3, "stall_warn", timeout=90)
    warnings = [line for line in res.stderr.splitlines() if "hvd_partial.stall" in line]
    assert warnings, res.tail()
    warners = {int(re.search(r"stall: rank (\d+): stall:", line).group(1)) for line in warnings}
    assert warners == {0, 1, 2}, warnings
    assert all("stall: rank 1 has called no hvd_partial function" in line for line in warnings), warnings
    # Nothing was said while every rank was idle (before the stall phase).
    before = res.stderr.split("MARK stall-start")[0]
    assert "hvd_partial.stall" not in before, before


@pytest.mark.timing
def test_stall_shutdown_fails_every_rank_naming_the_stalled_one():
    res = run_case_job(CASES, 3, "stall_shutdown", timeout=90, expect_success=False, keep_survivors=True)
    assert res.returncode != 0
    assert sorted(res.results) == [0, 1, 2], res.tail()
    assert all(rep["rank"] == 1 for rep in res.results.values()), res.results  # each checked its error and time


@pytest.mark.timing
def test_deadlock_of_every_rank_is_reported_with_each_ranks_call():
    res = run_case_job(CASES, 3, "deadlock", timeout=90, expect_success=False, keep_survivors=True)
    assert res.returncode != 0
    assert sorted(res.results) == [0, 1, 2], res.tail()
    assert all("deadlock" in rep["error"] for rep in res.results.values()), res.results  # each checked its call
    assert "hvd_partial.stall: rank 0: deadlock" in res.stderr  # warned before failing


def test_init_shares_an_initialized_horovod_communicator():
    """Shift 0: horovod.torch has the same ranks, init shares its
    communicator; shift 1: other ranks, a clear error naming the way out."""
    for shift in ("0", "1"):
        run_case_job(CASES, 2, "horovod_share", shift, timeout=60)
