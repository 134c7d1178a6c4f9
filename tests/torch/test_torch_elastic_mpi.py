"""hvd.elastic with PyTorch on 2 ranks under mpiexec (no rank dies here):
TorchState.sync makes every rank's model, optimizer, sampler and values
rank 0's, and Horovod's elastic MNIST loop (synthetic data) trains to
identical replicas in solo and sync mode."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi


def test_torch_state_sync_makes_every_rank_rank_0s():
    result = run_mpi("elastic_torch.py", 2, "sync", timeout=120)
    zero, one = result.results[0], result.results[1]
    for key in ("fingerprint", "optimizer", "lr", "epoch", "batch"):
        assert zero[key] == one[key], key
    assert (zero["epoch"], zero["batch"], zero["lr"]) == (5, 0, 0.01)
    assert zero["processed"] == one["processed"] == sorted(set(zero["mine"]) | set(one["mine"]))
    shards = set(zero["shard"]) | set(one["shard"])  # the rest, dealt over both ranks
    assert not set(zero["shard"]) & set(one["shard"])
    assert sorted(shards | set(zero["processed"])) == list(range(40)) and not shards & set(zero["processed"])


@pytest.mark.parametrize("mode", ["solo", "sync"])
def test_elastic_loop_trains_identical_replicas_over_the_whole_epoch(mode):
    result = run_mpi("elastic_torch.py", 2, "train", "--mode", mode, timeout=150)
    reps = [result.results[r] for r in (0, 1)]
    assert reps[0]["fingerprint"] == reps[1]["fingerprint"]
    for rep in reps:
        assert rep["world"] == {"version": 0, "size": 2, "lost": [], "original_rank": rep["world"]["original_rank"]}
        assert rep["resets"] == []
    for epoch in ("0", "1"):
        taken = reps[0]["trained"][epoch] + reps[1]["trained"][epoch]
        assert sorted(taken) == list(range(96)), epoch  # each sample once per epoch
