"""Sync mode's overlap of reductions with the backward pass for TensorFlow and
Keras, under mpiexec on 2 ranks (tests/workers/tf_overlap.py): a bucket's post
runs while the backward pass still computes, every bucket travels on its own
stream, and training equals overlap off bit for bit (a sum of two does not
depend on the buffers' layout); ranks that disagree on ``overlap_backward``
get ``MismatchError`` on every rank. Three ranks against single-process training:
``test_tf_mpi.py``'s sync cases, run with two buckets."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

CASES = ("fit", "passes2", "spe3", "fp16", "tape", "eager")
BUCKETS = {"fp16": 2}  # float16 on the wire: half the bytes, so half the groups; the others 4


@pytest.fixture(scope="module")
def overlap_run():
    return run_mpi("tf_overlap.py", 2, timeout=240).results


def test_a_bucket_is_posted_while_the_backward_pass_still_computes(overlap_run):
    for rank, rep in overlap_run.items():
        probe = rep["probe"]
        assert probe["waits"] == 3, (rank, probe)  # one per step: the probe sat in the backward pass
        assert probe["posted_in_time"] == 3, f"rank {rank}: the first bucket was posted only after the backward pass"


@pytest.mark.parametrize("case", CASES)
def test_overlap_on_equals_off_bitwise(overlap_run, case):
    for rank, rep in overlap_run.items():
        on, off = rep[f"{case}/on"], rep[f"{case}/off"]
        assert on["buckets"] == BUCKETS.get(case, 4) and off["buckets"] is None, rank
        assert on["digest"] == off["digest"], f"rank {rank}: {case} with overlap differs from without"
        assert (on["updates"], on["rounds"]) == (off["updates"], off["rounds"]), rank
    assert len({rep[f"{case}/on"]["digest"] for rep in overlap_run.values()}) == 1, f"{case}: replicas differ"


def test_flush_takes_every_bucket_stream_and_leaves_nothing(overlap_run):
    for rep in overlap_run.values():
        for case in ("tape", "eager"):
            # six steps and the flush's synchronous round, which nobody contributed to
            assert (rep[f"{case}/on"]["updates"], rep[f"{case}/on"]["rounds"]) == (6, 7)
            assert rep[f"{case}/on"]["flush_updates"] == 0


def test_each_bucket_travels_on_a_stream_of_its_own(overlap_run):
    for rep in overlap_run.values():
        streams = rep["fit/on"]["streams"]
        stream = next(s for s in streams if ".overlap." not in s)
        assert streams == [stream] + [f"{stream}.overlap.{k}" for k in range(3)]
        assert rep["fit/off"]["streams"] == [s for s in rep["fit/off"]["streams"] if ".overlap." not in s]


def test_ranks_that_disagree_on_overlap_fail_on_every_rank(overlap_run):
    for rank, rep in overlap_run.items():
        assert rep["mismatch"].startswith(f"rank {rank}: ranks disagree on stream 'keras."), rep["mismatch"]
