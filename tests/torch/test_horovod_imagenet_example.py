"""Horovod's ImageNet example (per-batch learning-rate warm-up set in
``param_groups``, metrics through ``hvd.allreduce``, rank 0's checkpoints),
unchanged but for its import, on 4 ranks in every mode: it runs to the end and
the replicas are bitwise identical after a flush
(tests/workers/horovod_imagenet.py). Needs a Horovod checkout in
``HOROVOD_SOURCE``; skipped without one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpi_run import run_mpi

pytest.importorskip("torch")

EXAMPLE = Path(os.environ.get("HOROVOD_SOURCE", "/nonexistent")) / "examples/pytorch/pytorch_imagenet_resnet50.py"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="HOROVOD_SOURCE does not point to a Horovod checkout")
@pytest.mark.parametrize("mode", ["solo", "majority", "sync"])
def test_horovods_imagenet_example_runs_unchanged(mode):
    result = run_mpi("horovod_imagenet.py", 4, str(EXAMPLE), "--epochs", "2", "--batch-size", "4",
                     "--val-batch-size", "8", "--warmup-epochs", "1.5", "--no-cuda",
                     timeout=240, env={"HVD_PARTIAL_MODE": mode})
    for rank, rep in result.results.items():
        assert rep["identical"] is True and rep["mode"] == mode
        assert rep["updates"] >= 8  # 4 batches per rank per epoch, 2 epochs: at least 8 rounds with data
        if rank == 0:
            assert rep["checkpoints"] == ["checkpoint-1.pth.tar", "checkpoint-2.pth.tar"]
