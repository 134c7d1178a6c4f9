"""docs/horovod-torch.md must not drift from hvd_partial.torch: every Horovod
name is listed once with a status, every listed name exists, and every name
hvd_partial.torch exports is listed (no MPI)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch")

from mpi_run import ROOT  # noqa: E402

import hvd_partial.torch as hvd  # noqa: E402

# The public names of horovod.torch 0.28 (its __init__.py).
HOROVOD_TORCH = {
    "elastic", "Compression", "allgather_object", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async",
    "broadcast_", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "init",
    "shutdown", "is_initialized", "start_timeline", "stop_timeline", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "HorovodInternalError", "DistributedOptimizer", "SyncBatchNorm",
}
STATUSES = {"supported", "differs", "not supported"}


def _page():
    text = (ROOT / "docs" / "horovod-torch.md").read_text()
    horovod_part, _, added_part = text.partition("## Names `hvd_partial.torch` adds")
    rows = {}
    for line in horovod_part.splitlines():
        match = re.match(r"\| `([A-Za-z_0-9]+)` \| ([a-z ]+) \|\s*(.*?)\s*\|$", line)
        if match:
            name, status, notes = match.groups()
            assert name not in rows, f"{name} listed twice"
            rows[name] = (status.strip(), notes.strip())
    added = set()
    for line in added_part.splitlines():
        if line.startswith("| `"):
            added.update(re.findall(r"`([A-Za-z_0-9]+)`", line.split("|")[1]))
    return rows, added


def test_every_horovod_name_is_listed_with_a_status():
    rows, _ = _page()
    assert len(HOROVOD_TORCH) == 67
    assert set(rows) == HOROVOD_TORCH
    for name, (status, notes) in rows.items():
        assert status in STATUSES, f"{name}: unknown status {status!r}"
        if status != "supported":
            assert notes, f"{name} is {status!r} without saying how or why"


def test_every_listed_name_exists_and_every_export_is_listed():
    rows, added = _page()
    for name in [*rows, *added]:
        assert hasattr(hvd, name), f"docs/horovod-torch.md lists {name}, which hvd_partial.torch lacks"
    assert set(hvd.__all__) <= set(rows) | added, sorted(set(hvd.__all__) - set(rows) - added)
    assert set(rows) <= set(hvd.__all__)


def test_not_supported_names_fail_clearly_not_with_attribute_errors():
    rows, _ = _page()
    for name, (status, _) in rows.items():
        if status == "not supported":
            assert getattr(hvd, name) is not None
    assert callable(hvd.elastic.run(lambda state: None))  # elastic is supported: decorating refuses nothing
    with pytest.raises(hvd.NotSupportedError, match="list of ranks"):
        hvd.ProcessSet(object())  # Horovod's sets from an MPI communicator
