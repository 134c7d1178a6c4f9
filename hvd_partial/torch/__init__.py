"""PyTorch adapter with Horovod's names: change ``import horovod.torch as hvd``
to ``import hvd_partial.torch as hvd`` and pick a mode.

Every public name of ``horovod.torch`` 0.28 exists here; docs/horovod-torch.md
says, name by name, what is supported and how it differs.

Example::

    import torch
    import hvd_partial.torch as hvd

    hvd.init()
    model = torch.nn.Linear(64, 10)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), mode=hvd.Solo())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ...
    opt.flush()  # before evaluation and checkpoints
"""

from .. import (ConfigError, DuplicateNameError, EngineError, HostsUpdatedInterrupt, HvdPartialError, Majority,
                MismatchError, NotInitializedError, NotSupportedError, ProcessSetError, RankFailedError, Solo, StreamConflictError,
                Sync, UnsupportedInputError, init, is_initialized, local_rank, local_size, rank, shutdown, size, stats)
from ..collectives.process_sets import ProcessSet, global_process_set
from ..collectives.set_changes import add_process_set, remove_process_set
from . import elastic
from .basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,
                     mpi_enabled, mpi_threads_supported, nccl_built, rocm_built, start_timeline, stop_timeline)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import (Adasum, Average, Max, Min, Product, Sum, TorchHandle, allgather, allgather_async, allreduce,
                      allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async, join, poll, reducescatter,
                      reducescatter_async, sparse_allreduce_async, synchronize)
from .optimizer import DistributedOptimizer, SynchronizationError
from .sync_batch_norm import SyncBatchNorm

#: Horovod's error for a failed collective; every hvd_partial error is one (``hvd.elastic.run`` recovers
#: from ``hvd_partial.HorovodInternalError``, the world-change error, a subclass).
HorovodInternalError = HvdPartialError

__all__ = [
    # process
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "stats", "start_timeline", "stop_timeline",
    # flags
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built",
    # modes and ops
    "Sync", "Solo", "Majority", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    # process sets
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # training
    "DistributedOptimizer", "SyncBatchNorm", "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object", "elastic",
    # tensor collectives
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "barrier", "poll", "synchronize", "TorchHandle",
    # errors
    "HorovodInternalError", "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError",
    "StreamConflictError", "DuplicateNameError", "MismatchError", "RankFailedError", "EngineError",
    "NotSupportedError", "ProcessSetError", "SynchronizationError", "HostsUpdatedInterrupt",
]
