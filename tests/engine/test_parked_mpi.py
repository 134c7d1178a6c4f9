"""A rank waiting in a call that needs every rank (here ``hvd.allreduce``)
holds back none of the ranks that still train, in every partial mode; and a
rank that leaves early does not hang the others' shutdown. Without parking,
each of these hangs and the job's timeout fails the test."""

import pytest

from mpi_run import run_mpi

pytestmark = pytest.mark.mpi

TAU = 2  # tests/workers/parked_cases.py
MODES = [("solo", "none"), ("majority", "none"), ("majority", "2")]


@pytest.mark.parametrize("mode,quorum", MODES)
def test_posts_go_on_while_a_rank_waits_in_allreduce(mode, quorum):
    res = run_mpi("parked_cases.py", 2, "numpy_posts", mode, quorum, timeout=90)
    r0, r1 = res.results[0], res.results[1]
    # Nothing lost, nothing doubled: every one-hot post summed exactly once, on both ranks.
    assert r0["summed"] == [1.0] * (1 + TAU + 6) == r1["summed"]
    # Every rank took the same rounds, in order, bitwise identical.
    assert r0["rounds"] == r1["rounds"] == list(range(len(r0["rounds"])))
    assert r0["digest"] == r1["digest"] and r0["flush_last"] and r1["flush_last"]
    # Rank 1 posted more than the staleness bound allows past a rank that holds it back.
    assert r0["took_at_unpark"] >= 1 + (TAU + 5) // 2


@pytest.mark.parametrize("mode,quorum", MODES)
def test_torch_steps_go_on_and_the_parked_rank_applies_them(mode, quorum):
    res = run_mpi("parked_cases.py", 2, "torch_steps", mode, quorum, timeout=120)
    r0, r1 = res.results[0], res.results[1]
    # Rank 0 applied the rounds completed while it waited before hvd.allreduce (under no_grad) returned.
    assert r0["rounds_after_allreduce"] > r0["rounds_before"]
    assert r0["rounds"] == r1["rounds"] and r0["digest"] == r1["digest"]


@pytest.mark.parametrize("mode,quorum", MODES)
def test_a_rank_that_leaves_early_does_not_hang_the_others(mode, quorum):
    res = run_mpi("parked_cases.py", 2, "early_leaver", mode, quorum, timeout=90)
    assert res.results[1] == {"left_at": 10}
    assert res.results[0]["rounds"] > 0
