"""Sync mode's overlap of reductions with the backward pass, under mpiexec on 2
and 3 ranks (tests/workers/torch_overlap.py): buckets posted during backward,
replicas bitwise identical, results equal to overlap off and to single-process
training; ``backward_passes_per_step=2``, a parameter used twice in forward, an
unused one, clipping between ``synchronize()`` and ``step()``, buckets whose
copies to the host finish late, and misuse refused."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

EQUIVALENT = ("plain", "passes2", "clip", "deferred")


@pytest.fixture(scope="module", params=[2, 3])
def overlap_run(request):
    return request.param, run_mpi("torch_overlap.py", request.param, timeout=150)


def test_replicas_bitwise_identical_after_every_step(overlap_run):
    _, run = overlap_run
    reps = list(run.results.values())
    for case in reps[0]:
        assert len({tuple(rep[case]["per_step"]) for rep in reps}) == 1, f"{case}: replicas differ"
        assert len({rep[case]["fingerprint"] for rep in reps}) == 1, f"{case}: replicas differ after flush"


@pytest.mark.parametrize("case", EQUIVALENT + ("misuse",))
def test_overlap_equals_single_process_training(overlap_run, case):
    _, run = overlap_run
    for rank, rep in run.results.items():
        assert rep[f"{case}/on"]["diff"] < 1e-12, f"rank {rank}: {case} with overlap differs from the reference"


@pytest.mark.parametrize("case", EQUIVALENT)
def test_overlap_on_equals_off(overlap_run, case):
    size, run = overlap_run
    for rep in run.results.values():
        on, off = rep[f"{case}/on"], rep[f"{case}/off"]
        assert on["updates"] == off["updates"] == 6 and on["rounds"] == off["rounds"] == 7  # and the flush round
        if size == 2:  # a sum of two is the same in any buffer layout: bitwise equal
            assert on["per_step"] == off["per_step"]
        assert on["spare"] == off["spare"]  # the unused parameter: zeros reduced, weight decay applied alike
        assert off["diff"] < 1e-12


def test_buckets_posted_during_backward_only_after_the_last_pass(overlap_run):
    _, run = overlap_run
    for rep in run.results.values():
        assert rep["plain/on"]["buckets"] == 4 and rep["plain/off"]["buckets"] is None
        # the first step settles the layout and posts at step(); then two buckets go out in backward,
        # and the third waits for the unused parameter (posted by step(), with the last)
        assert rep["plain/on"]["posted_in_backward"] == [0, 2, 2, 2, 2, 2]
        assert rep["passes2/on"]["posted_after_first_pass"] == [0] * 6
        assert rep["passes2/on"]["posted_in_backward"] == [0, 2, 2, 2, 2, 2]
        assert rep["plain/off"]["posted_in_backward"] == [0] * 6
        assert rep["plain/on"]["sent_in_backward"] == rep["plain/on"]["posted_in_backward"]  # CPU: staged is sent


def test_a_bucket_whose_copies_are_not_done_is_posted_later_in_order(overlap_run):
    """Copies done only at their third query (as a CUDA side stream's may be): both buckets are
    staged during backward, but the second is never done by the backward pass's end, so step()
    posts it; training still equals overlap off and the reference (test above)."""
    _, run = overlap_run
    for rank, rep in run.results.items():
        deferred = rep["deferred/on"]
        assert deferred["posted_in_backward"] == [0, 2, 2, 2, 2, 2], rank
        assert all(sent < 2 for sent in deferred["sent_in_backward"]), (rank, deferred["sent_in_backward"])


def test_misuse_refused_on_every_rank(overlap_run):
    _, run = overlap_run
    for rank, rep in run.results.items():
        errors = rep["misuse/on"]["errors"]
        assert "zero_grad() after backward() posted gradient buckets" in errors["zero_grad"], rank
        assert f"rank {rank}:" in errors["changed"] and "out.weight" in errors["changed"]
        assert rep["misuse/off"]["errors"] == {}
