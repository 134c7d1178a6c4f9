"""What Horovod's own test file (test/parallel/test_torch.py) checks of
Horovod's semantics, from Horovod's documented behaviour, on 2 and 3 ranks in
sync mode: the gradient of every collective (allgather and broadcast average
the result's gradient over ranks; alltoall sends it back where the rows came
from; reducescatter allgathers it, times the ranks for Sum), join refusing
allgather, broadcast, alltoall and reducescatter while a rank has joined and
returning the last rank to join, the sparse allreduce handle, 0-dim tensors,
sparse embeddings with SparseAdam, and broadcast_optimizer_state with
parameters that have no gradient."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=[2, 3])
def grads_run(request):
    return run_mpi("torch_horovod_grads.py", request.param, "grads", timeout=150)


def _scatter_rows(n: int) -> list[int]:
    """Rows of each rank's reducescatter share of n + 1 rows."""
    return [2 if q == 0 else 1 for q in range(n)]


def test_allgather_gradient_is_the_average_of_this_ranks_rows(grads_run):
    n = grads_run.nprocs
    for r, rep in grads_run.results.items():
        assert rep["allgather"] == [[float(r + 1)] * 2] * (r + 1)
        assert rep["grouped_allgather"] == [[[(n + 1) / 2] * 3] * (r + 1), [[1.0]] * 2]


def test_alltoall_gradient_goes_back_where_the_rows_came_from(grads_run):
    n = grads_run.nprocs
    for r, rep in grads_run.results.items():
        grad, splits, differentiable = rep["alltoall"]
        assert grad == [float(j + 2) for j in range(n) for _ in range(r + 1)]
        assert splits == [q + 1 for q in range(n)] and differentiable is True
        assert rep["alltoall_equal"] == [float(j + 2) for j in range(n) for _ in range(2)]


def test_grouped_allreduce_gradient_is_reduced_with_the_same_op(grads_run):
    n = grads_run.nprocs
    for rep in grads_run.results.values():
        assert rep["grouped_allreduce_Sum"] == [[n * (n + 1) / 2] * 2, [float(n)] * 3]
        assert rep["grouped_allreduce_Average"] == [[(n + 1) / 2] * 2, [1.0] * 3]


def test_reducescatter_gradient_is_allgathered_times_ranks_for_sum(grads_run):
    n = grads_run.nprocs
    for rep in grads_run.results.values():
        for op, factor in (("Sum", n), ("Average", 1)):
            expected = [[float((q + 1) * factor)] * 2 for q in range(n) for _ in range(_scatter_rows(n)[q])]
            assert rep[f"reducescatter_{op}"] == expected, op
        assert rep["reducescatter_scaled"] == [[float(n)]] * n  # Sum, prescale 2, postscale 0.5
        assert rep["grouped_reducescatter"] == [[[float((q + 1) * n)] for q in range(n)],
                                                [[float(n)] * 2] * (2 * n)]


def test_broadcast_gradient_is_the_average_on_the_root_and_zero_elsewhere(grads_run):
    n = grads_run.nprocs
    for r, rep in grads_run.results.items():
        assert rep["broadcast"] == [[(n + 1) / 2 if r == root else 0.0] * 3 for root in range(n)]


def test_zero_dim_tensors_keep_their_shape(grads_run):
    for rep in grads_run.results.values():
        assert rep["zero_dim"] == [[], 3.0, [], []]


@pytest.mark.parametrize("nprocs", [2, 3])
def test_join_refuses_data_collectives_and_returns_the_last_rank(nprocs):
    result = run_mpi("torch_horovod_grads.py", nprocs, "join", timeout=120)
    for r, rep in result.results.items():
        assert rep["refused"] == [["NotSupportedError"] * 4] * (nprocs - 1)
        for first, (ret, everyone) in enumerate(zip(rep["returned"], rep["everyone"])):
            assert ret != first and everyone == [ret] * nprocs
            if nprocs == 2:
                assert ret == 1 - first
        assert rep["after"] == list(range(nprocs))


def test_sparse_handle_is_callable_and_sparse_embeddings_train_with_sparse_adam():
    result = run_mpi("torch_horovod_grads.py", 2, "sparse", timeout=120)
    reps = result.results
    for rep in reps.values():
        assert rep["handle_call"] == [[0.5] * 2, [1.0] * 2, [0.0] * 2, [0.0] * 2]
        for as_dense in (False, True):
            case = rep[f"embedding_as_dense_{as_dense}"]
            assert case["grad_sparse"] is True and case["rows"] == [0, 1, 2]
    for as_dense in (False, True):
        key = f"embedding_as_dense_{as_dense}"
        assert reps[0][key]["weights"] == reps[1][key]["weights"]


def test_optimizer_state_broadcast_gives_parameters_without_gradient_a_zero_one():
    result = run_mpi("torch_horovod_grads.py", 2, "state", timeout=120)
    for rep in result.results.values():
        assert rep["kept_grad"] is True and rep["zero_grads"] == [True, True] and rep["frozen_grad"] is True
        assert rep["params_untouched"] is True
        assert rep["adam_step_dims"] == [0] and rep["adam_steps"] == [1.0]
