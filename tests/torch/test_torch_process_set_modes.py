"""Solo and majority DistributedOptimizers on process sets (4 ranks: evens [0, 2] and odds
[1, 3]), each set a world of its own engine: replicas of a set end bitwise identical after
flush, with everything the set's members posted (nothing lost), while a global stream of
the same mode trains beside them; ranks outside a set step alone; a wait in a global call
parks the set's streams; shutdown() without flush stops the set engines cleanly."""

from __future__ import annotations

import pytest

from mpi_run import run_mpi

pytestmark = pytest.mark.mpi

SETS = {0: (0, 2), 2: (0, 2), 1: (1, 3), 3: (1, 3)}


def test_solo_and_majority_on_sets_train_apart():
    pytest.importorskip("torch")
    result = run_mpi("process_set_modes_cases.py", 4, "train", timeout=240)
    for label in ("solo", "majority"):
        for r, rep in result.results.items():
            got = rep[label]
            peer = result.results[[m for m in SETS[r] if m != r][0]][label]
            assert got["bits"] == peer["bits"], (label, r, got["weight"], peer["weight"])  # the set's replicas
            assert got["rounds"] == peer["rounds"]
            assert got["weight"] == got["expected"], (label, r)  # every member's every post, once
            set_id, n = 1 if r % 2 == 0 else 2, 0 if label == "solo" else 1
            assert got["name"] == f"torch.DistributedOptimizer.set{set_id}.{n}"
            assert got["stats_ranks"] == 2 and got["contributions"] > 0  # the set's engine: a world of two ranks
            assert got["alone"] == got["alone_expected"] and got["outside_mode"] == label  # outside: alone
            assert got["world"] == got["world_expected"]  # the global stream beside it: every rank's posts
        assert len({rep[label]["bits"] for rep in result.results.values()}) == 2  # the two sets differ
    for rep in result.results.values():
        assert rep["world_sum"] == [6.0]
        assert rep["removed"] == [True, True]
        assert rep["stopped_by_remove"] == [True, True]  # the set's engine stopped cleanly
        assert rep["after_remove"] == "ProcessSetError"


def test_wait_in_a_global_call_parks_the_set_streams():
    pytest.importorskip("torch")
    result = run_mpi("process_set_modes_cases.py", 4, "parked", timeout=120)
    for r, rep in result.results.items():
        assert rep["total"] == [6.0]
        assert rep["weight"] == rep["expected"], r
        assert rep["bits"] == result.results[[m for m in SETS[r] if m != r][0]]["bits"]


def test_shutdown_without_flush_stops_the_set_engines():
    pytest.importorskip("torch")
    result = run_mpi("process_set_modes_cases.py", 4, "unflushed", timeout=120)
    for r, rep in result.results.items():
        assert rep["stopped"] and rep["failure"] is None, (r, rep)
        assert rep["rounds"] >= 1
