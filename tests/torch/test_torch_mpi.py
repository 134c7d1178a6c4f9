"""The PyTorch adapter in real multi-process runs under mpiexec.

Each worker runs once per module (fixtures) and several tests assert on its
report: sync mode against single-process training, solo and majority replicas
round by round, conservation and staleness, and bad input.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import ROOT, run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

TAU = 8  # tests/workers/torch_partial.py


def same_on_all_ranks(result, key):
    values = [result.results[r][key] for r in sorted(result.results)]
    assert all(v == values[0] for v in values), f"{key} differs across ranks: {values}"
    return values[0]


# ===== sync mode: Horovod's averaging, on 3 ranks (an odd size) ================================

@pytest.fixture(scope="module")
def sync_run():
    return run_mpi("torch_sync.py", 3, timeout=150)


@pytest.mark.parametrize("case,tolerance", [("sgd", 1e-12), ("adamw", 1e-12), ("adam32", 1e-6),
                                            ("passes2", 1e-12), ("clip", 1e-12)])
def test_sync_matches_single_process_on_concatenated_batches(sync_run, case, tolerance):
    for rank, rep in sync_run.results.items():
        assert rep[case]["diff"] < tolerance, f"rank {rank}: {case} differs from the single-process reference"
        assert rep[case]["rounds"] == rep[case]["updates"] == 5
    assert len({rep[case]["fingerprint"] for rep in sync_run.results.values()}) == 1


def test_sync_lr_schedule_on_the_wrapper_and_clipping_took_effect(sync_run):
    rep = sync_run.results[0]
    assert rep["sgd"]["lr"] == pytest.approx(rep["sgd"]["ref_lr"]) and rep["sgd"]["lr"] < 0.1 * 0.8 ** 4
    assert rep["clip"]["clipped"] == 5  # the reference norm exceeded the bound every step


def test_fp16_compression_is_close_but_not_exact(sync_run):
    for rep in sync_run.results.values():
        assert 1e-9 < rep["fp16"]["diff"] < 1e-3
    assert len({rep["fp16"]["fingerprint"] for rep in sync_run.results.values()}) == 1


def test_tensor_collectives(sync_run):
    t = same_on_all_ranks(sync_run, "tensors")
    assert t["average"] == [1.0, 2.0] and t["sum"] == [3.0, 6.0] and t["int_sum"] == [3, 3]
    assert t["reused_name_other_shape"] == [1.0, 1.0, 1.0]
    assert t["async"] == [1.0, 10.0] and t["inplace"] == [6.0, True]
    assert t["fp16"] == pytest.approx(1.0 / 3.0 + 1.0, abs=1e-3) and t["fp16_dtype"] == "torch.float64"
    assert t["bf16"] == 1.0 and t["scaled"] == 3.0
    assert t["broadcast"] == [2, 2] and t["broadcast_"] == [1.0, 1.0, 1.0]
    assert t["broadcast_object"] == 1 and t["allgather_object"] == [0, 10, 20]


def test_broadcast_parameters_and_optimizer_state(sync_run):
    b = same_on_all_ranks(sync_run, "broadcasts")
    assert b["params_equal_root"] is True  # parameters and buffers (int64, bool, bfloat16)
    assert b["opt_lr"] == pytest.approx(0.002)  # the root's (rank 1) hyperparameters
    assert b["opt_state_len"] == 4  # the root's state reached ranks that had none


def test_checkpoint_round_trip_resumes_exactly(sync_run):
    for rep in sync_run.results.values():
        ck = rep["checkpoint"]
        assert ck["identical"] is True
        assert ck["restored_rounds"] == ck["saved_rounds"] > 0 and ck["saved_flushed"] is True
        assert ck["rounds_after"][0] == ck["rounds_after"][1]


# ===== solo and majority with injected delays, 4 ranks =========================================

@pytest.fixture(scope="module", params=["solo", "majority"])
def partial_run(request):
    return request.param, run_mpi("torch_partial.py", 4, request.param, timeout=150)


def test_replicas_identical_after_every_round_and_after_flush(partial_run):
    mode, res = partial_run
    per_round = same_on_all_ranks(res, "per_round")
    rounds = same_on_all_ranks(res, "rounds")
    same_on_all_ranks(res, "final")
    same_on_all_ranks(res, "updates")
    assert len(per_round) == res.results[0]["updates"] > 40
    assert max(int(r) for r in per_round) <= rounds
    if mode == "solo":  # the forced catch-up makes this certain (see the next tests)
        assert any(k > 1 for rep in res.results.values() for k in rep["ks"])


def test_conservation_after_final_flush(partial_run):
    _, res = partial_run
    for rank, rep in res.results.items():
        assert rep["conservation"] < 1e-12 * max(1.0, rep["scale"]) * 100, \
            f"rank {rank}: applied results differ from the sum of all local gradients / P"
        assert rep["scale"] > 0.01


def test_staleness_within_bound(partial_run):
    mode, res = partial_run
    for rank, rep in res.results.items():
        assert rep["max_staleness"] <= TAU, f"rank {rank}"
        if mode == "solo":  # the forced catch-up's gradient missed >= 2 rounds
            assert rep["max_staleness"] >= 2, f"rank {rank}"
    stale = same_on_all_ranks(res, "stale")
    if mode == "solo":
        assert stale[max(res.results)] > 0


def test_solo_slow_rank_catches_up_and_horovod_clip_pattern_is_guarded(partial_run):
    mode, res = partial_run
    if mode != "solo":
        pytest.skip("the forced catch-up has the last rank wait outside any call, which majority's designated "
                    "initiator could not")
    last = max(res.results)
    assert res.results[last]["catch_up_k"] >= 2
    guard = res.results[last]["guard"]
    assert guard["k"] >= 2 and "took" in guard["error"] and "register_step_pre_hook" in guard["error"]
    assert all(res.results[r]["guard"]["error"] is None for r in res.results if r != last)


# ===== bad input, 2 ranks ==========================================================================

@pytest.fixture(scope="module")
def bad_run():
    return run_mpi("torch_bad_input.py", 2, timeout=120)


def test_different_parameter_shapes_fail_on_every_rank_naming_the_parameter(bad_run):
    for rank, rep in bad_run.results.items():
        err = rep["mismatch"]
        assert err["type"] == "MismatchError"
        assert f"rank {rank}:" in err["message"] and "'0.weight' [17, 12]" in err["message"] and "[16, 12]" in \
            err["message"]
        assert rep["broadcast_mismatch"]["type"] == "MismatchError" and "0.weight" in rep["broadcast_mismatch"][
            "message"]


def test_sparse_gradients_refused_in_solo_allgathered_in_sync_or_densified(bad_run):
    for rep in bad_run.results.values():
        assert rep["sparse"]["type"] == "UnsupportedInputError" and "sparse_as_dense" in rep["sparse"]["message"]
        assert rep["sparse_as_dense_grad"] == [0.5, 0.5, 0.0, 1.0] and rep["sparse_as_dense_is_sparse"] is True
        assert rep["sparse_sync_is_sparse"] is True and rep["sparse_sync_grad"] == [0.5, 0.5, 0.0, 1.0]
    same_on_all_ranks(bad_run, "sparse_sync_fp")
    same_on_all_ranks(bad_run, "sparse_as_dense_fp")


def test_misuse_is_reported(bad_run):
    for rep in bad_run.results.values():
        assert rep["skip_without_sync"]["type"] == "SynchronizationError"
        assert rep["backward_twice"]["type"] == "SynchronizationError" and "2 times" in rep["backward_twice"][
            "message"]
        assert rep["passes2_twice"] is None
        assert rep["add_group_after_step"]["type"] == "UnsupportedInputError"
        assert rep["unfrozen"]["type"] == "UnsupportedInputError" and "'0.weight'" in rep["unfrozen"]["message"]
        assert rep["not_an_optimizer"]["type"] == "TypeError"
        assert rep["lbfgs"]["type"] == "UnsupportedInputError"
        assert rep["bad_passes"]["type"] == "ConfigError"
        assert rep["scheduler_on_wrapper"] is None  # the wrapper is a torch.optim.Optimizer
        assert rep["after_shutdown"]["type"] == "NotInitializedError"


def test_parameters_without_gradient_get_horovods_zeros(bad_run):
    for rep in bad_run.results.values():
        assert rep["c_grad_before"] is True  # never used: no local gradient ...
        assert rep["c_grad_zero"] is True  # ... reduced as zeros
        assert rep["b_grad_is_rank0_over_size"] is True  # used on rank 0 only
    same_on_all_ranks(bad_run, "heads_fp")


# ===== the example ===================================================================================

def test_pytorch_straggler_example_runs_and_checks_replicas():
    res = run_mpi(str(ROOT / "examples" / "pytorch_straggler.py"), 4, "--epochs", "2", "--delay", "0.02",
                  timeout=150, require_reports=False)
    assert "replicas identical on all 4 ranks (parameters and optimizer state): yes" in res.stdout
    assert "epoch  2" in res.stdout and "participation over" in res.stdout


# ===== CUDA (only where a GPU exists) ==================================================================

def test_cuda_tensors_are_staged_and_come_back_on_their_device():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    res = run_mpi("torch_cuda.py", 2, timeout=150)
    for rep in res.results.values():
        assert rep["sync_diff"] < 1e-10  # float64: GPU and CPU training agree
        assert all(d.startswith("cuda") for d in rep["grad_devices"])
        assert rep["allreduce"][0].startswith("cuda") and rep["allreduce"][1] == [0.5, 0.5, 0.5]
    same_on_all_ranks(res, "solo_fp")
