"""Horovod's TensorFlow collectives and the Keras learning-rate callbacks on 3
ranks (tests/workers/tf_collectives.py)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
SIZE = 3


@pytest.fixture(scope="module")
def run():
    return run_mpi("tf_collectives.py", SIZE, timeout=240).results


def test_allreduce_ops_and_horovod_arguments(run):
    ranks = range(SIZE)
    total = [SIZE + sum(ranks), 10.0 * sum(ranks)]
    for res in run.values():
        c = res["collectives"]
        assert c["average"] == pytest.approx([t / SIZE for t in total])
        assert c["sum_average_false"] == total and c["scaled"] == total and c["fp16"] == total
        assert c["min"] == [1.0, 0.0] and c["max"] == [SIZE, 10.0 * (SIZE - 1)]
        assert c["product"] == [math.factorial(SIZE), 0.0]
        assert c["grouped"] == [total, [[float(sum(ranks))]]]
        assert c["keras_allreduce"] == [float(sum(ranks))]
        assert c["sparse"] == [[float(r)] for r in ranks]


def test_allgather_reducescatter_alltoall_broadcast(run):
    gathered = [[r, r] for r in range(SIZE) for _ in range(r + 1)]
    s = SIZE * (SIZE + 1) / 2
    for rank, res in run.items():
        c = res["collectives"]
        assert c["allgather"] == gathered
        assert c["reducescatter"] == [[s, s]] * (3 if rank == 0 else 2)  # 7 rows over 3 ranks: 3, 2, 2
        assert c["alltoall"] == [v for src in range(SIZE) for v in (2 * rank + 100 * src, 2 * rank + 1 + 100 * src)]
        assert c["alltoall_splits"] == [[src for src in range(SIZE) for _ in range(rank + 1)], [rank + 1] * SIZE]
        assert c["broadcast_bool"] == [True, False]
        assert c["graph"] == [[SIZE, 10.0 * (SIZE - 1)], [v for r in range(SIZE) for v in (1.0 + r, 10.0 * r)]]
        assert c["topology"] == [0, 1, True, rank, SIZE]


def test_gradients_flow_through_every_collective_as_in_horovod(run):
    n = 3 * SIZE
    for rank, res in run.items():
        g = res["semantics"]["grads"]
        # the upstream gradients (ones) summed over the ranks, times this rank's own factor (r + 1)
        assert g["allreduce_sum"] == pytest.approx([SIZE * (rank + 1.0)] * n)
        assert g["allreduce_scaled"] == pytest.approx([float(SIZE)] * n)  # pre * post = 1, summed over ranks
        assert g["grouped"] == pytest.approx([3.0] * n)
        assert g["allgather"] == pytest.approx([1.0] * n)  # the averaged gradient, cut at this rank's rows
        assert g["broadcast"] == ([1.0] * n if rank == 1 else [0.0] * n)  # the root only
        assert g["reducescatter"] == pytest.approx([float(SIZE)] * n)  # Horovod counts Sum's gradient size times
        assert g["alltoall"] == [1.0] * n


def test_integers_are_prescaled_and_truncated_per_rank_and_alltoall_returns_as_horovod(run):
    for res in run.values():
        s = res["semantics"]
        assert s["int_prescale"] == [SIZE * 1, SIZE * 2]  # 3 * 0.5 -> 1, 5 * 0.5 -> 2 on every rank
        assert s["alltoall_no_splits_type"] == "EagerTensor"


def test_errors_have_horovods_tensorflow_classes(run):
    for res in run.values():
        assert res["semantics"]["errors"] == {"mismatch": "FailedPreconditionError",
                                              "bad_split": "InvalidArgumentError"}


def test_a_tf1_graph_runs_collectives_in_the_order_built_and_broadcast_assigns(run):
    for res in run.values():
        s = res["semantics"]
        assert s["graph_order"] == [[float(n * sum(r + 1 for r in range(SIZE)))] * (n + 1) for n in range(6)]
        assert s["graph_broadcast_"] == [float(SIZE - 1)] * 2


def test_a_registered_local_source_keeps_its_own_gradient(run):
    for rank, res in run.items():
        g_local, g_shared = res["semantics"]["local_source"]
        assert len(g_local) == 2 + rank  # this rank's own shape and gradient, scaled by 1/size
        assert [v for row in g_local for v in row] == pytest.approx([(rank + 1) / SIZE] * 2 * (2 + rank))
        assert g_shared == pytest.approx([sum(r + 1 for r in range(SIZE)) / SIZE] * (3 * SIZE))


def test_join_returns_the_same_rank_everywhere(run):
    last = {res["collectives"]["join"] for res in run.values()}
    assert len(last) == 1 and last.pop() in range(SIZE)


def test_mismatched_allgather_fails_on_every_rank(run):
    for res in run.values():
        assert res["collectives"]["mismatch"] and "MismatchError" in res["collectives"]["mismatch"]
        assert "shape" in res["collectives"]["mismatch"]


def test_per_batch_rate_callbacks_keep_replicas_identical(run):
    digests = {res["schedules"]["digest"] for res in run.values()}
    rates = {res["schedules"]["lr"] for res in run.values()}
    assert len(digests) == 1 and len(rates) == 1, run


def test_a_rate_set_per_local_batch_by_hand_keeps_replicas_identical_in_solo(run):
    parts = [res["schedules"]["per_batch"] for res in run.values()]
    assert len({p["digest"] for p in parts}) == 1, parts
    for part in parts:  # each rank reads back the rate it set last
        assert part["lr"] == pytest.approx(0.01 * part["batches"])
