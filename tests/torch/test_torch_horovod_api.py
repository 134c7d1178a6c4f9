"""Horovod's torch API, from Horovod's documented behaviour, on 2 and 3 ranks:
flags, integer average, every tensor collective, mismatches raising on every
rank within a time bound (never a hang), broadcast of optimizer state without
gradients, Horovod's optimizer arguments and warning, learning rates set
per local step in solo and sync, SyncBatchNorm, join, elastic and process
sets refused clearly, and init/shutdown/init."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

MISMATCH_SECONDS = 5.0  # negotiation takes milliseconds; room for a loaded machine


@pytest.fixture(scope="module", params=[2, 3])
def api_run(request):
    return run_mpi("torch_horovod_api.py", request.param, "api", timeout=150)


def test_flags_and_process_queries(api_run):
    for rank, rep in api_run.results.items():
        assert rep["flags"] == {"mpi_enabled": True, "mpi_built": True, "mpi_threads_supported": True,
                                "gloo_enabled": False, "gloo_built": False, "nccl_built": False,
                                "ddl_built": False, "ccl_built": False, "cuda_built": False, "rocm_built": False,
                                "is_initialized": True}
        cross_rank, cross_size, local_rank, local_size = rep["cross"]
        assert local_size == api_run.nprocs and local_rank == rank  # one node
        assert (cross_rank, cross_size) == (0, 1)


def test_integer_average_truncates_like_horovod(api_run):
    n = api_run.nprocs
    total = sum(3 * r + 1 for r in range(n))
    for rep in api_run.results.values():
        for dtype in ("torch.int32", "torch.int64"):
            assert rep[f"int_average_{dtype}"] == [[int(total / n), -int(total / n)], dtype]


def test_reductions_and_tensor_collectives(api_run):
    n = api_run.nprocs
    for me, rep in api_run.results.items():
        assert rep["average_false"] == [float(n), n * (n - 1) / 2]
        prod = 0.0  # rank 0 contributes 0
        assert rep["min_max_product"] == [0.0, float(n - 1), prod]
        assert rep["bf16"] == [[float(n)] * 2, "torch.bfloat16"]
        assert rep["inplace"] == [float(n)] * 3
        assert rep["grouped"] == [[n * (n - 1) / 2], [float(n)] * 2]
        assert abs(rep["fp16_compression"] - 1 / 3) < 1e-3
        assert rep["allgather"] == [[r, r] for r in range(n) for _ in range(r + 1)]
        assert rep["grouped_allgather"] == [list(range(n)), [[r] for r in range(n)]]
        assert rep["broadcast_"] == [n - 1, n - 1]
        assert rep["alltoall"] == [[10 * r + me for r in range(n)], [1] * n]
        assert rep["alltoall_nosplits"] == [10 * r + me for r in range(n)]
        assert rep["reducescatter"] == [[float(n)] * 2] * (2 if me == 0 else 1)
        assert rep["duplicate"] == "DuplicateNameError" and rep["dup_result"] == [float(1)] * 2
        assert rep["poll"] is True
        assert rep["autograd_allreduce"] == [float(n * (me + 1))] * 2  # Horovod: the gradient is allreduced
        assert rep["sparse"] == [1.0] * n
        assert rep["objects"] == [{"r": n - 1}, list(range(n))]
        assert rep["global_set"] == float(n)


def test_join_lets_ranks_run_different_numbers_of_steps(api_run):
    n = api_run.nprocs
    for me, rep in api_run.results.items():
        steps, last = rep["join"]
        assert steps == [float(n - i) for i in range(me + 1)] and last == n - 1


def test_unadded_process_sets_and_adasum_fail_clearly(api_run):
    for rank, rep in api_run.results.items():
        refused = rep["refused"]
        assert refused["other_set"][0] == "ProcessSetError"
        assert f"rank {rank}" in refused["other_set"][1] and "never added" in refused["other_set"][1]
        assert refused["adasum"][0] == "UnsupportedInputError" and "op=Average" in refused["adasum"][1]


def test_timeline_and_sync_batch_norm(api_run):
    for rep in api_run.results.values():
        assert rep["timeline_events"] >= 4  # a valid, closed trace file
        sbn = rep["sync_batch_norm"]
        assert sbn["output"] < 1e-12 and sbn["grad_input"] < 1e-12 and sbn["grad_weight_sum"] < 1e-12
        assert sbn["running_mean"] < 1e-12


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mismatched_tensors_raise_on_every_rank_without_hanging(nprocs):
    result = run_mpi("torch_horovod_api.py", nprocs, "mismatch", timeout=120)
    for key, field in {"shape": "shape", "dtype": "dtype", "allgather_dtype": "dtype",
                       "broadcast_root": "root", "optimizer_model": None}.items():
        messages = set()
        for rank, rep in result.results.items():
            case = rep[key]
            assert case["error"] is not None, f"rank {rank}: {key}: no error"
            assert case["seconds"] < MISMATCH_SECONDS, f"rank {rank}: {key} took {case['seconds']:.1f} s"
            messages.add(case["error"])
        assert len(messages) == 1, messages
        if field is not None:
            assert f"disagree on {field}" in messages.pop()
    for rep in result.results.values():
        assert rep["after"] == [float(nprocs)] * 2


def test_optimizer_state_broadcast_without_gradients_and_horovods_arguments():
    result = run_mpi("torch_horovod_api.py", 2, "optimizer", timeout=120)
    for rep in result.results.values():
        assert rep["state_len"] == 4  # Adam state created for all 4 parameters, none had a gradient
        assert rep["lr"] == pytest.approx(0.02)  # root rank 1's hyperparameters
        assert rep["params_untouched"] is True and rep["zero_grads"] is True  # Horovod leaves zero gradients
        assert rep["state_steps"] == [1.0]
        assert len(rep["warning"]) == 1 and "skip_synchronize" in rep["warning"][0]
        assert rep["refused"] == {"adasum": "UnsupportedInputError", "predivide_sum": "ConfigError",
                                  "process_set": "ProcessSetError", "solo_on_removed_set": "ProcessSetError"}
    assert result.results[0]["fingerprint"] == result.results[1]["fingerprint"]


def test_learning_rate_per_local_step_works_in_solo_and_sync():
    result = run_mpi("torch_horovod_api.py", 2, "schedule", timeout=120)
    for rank, rep in result.results.items():
        for mode in ("solo", "sync"):  # each rank sets its own value; each reads it back after step()
            assert rep[mode]["error"] is None and rep[mode]["read_back"] == [True] * 3
    for mode in ("solo", "sync"):  # replicas identical after the flushes
        assert result.results[0][mode]["fingerprint"] == result.results[1][mode]["fingerprint"]


def test_torch_adapter_survives_init_shutdown_init():
    result = run_mpi("torch_horovod_api.py", 2, "reinit", timeout=90)
    for rep in result.results.values():
        assert rep["results"] == [1.0, 1, 3.0, 1]
