"""PyTorch adapter with Horovod's names: change ``import horovod.torch as hvd``
to ``import hvd_partial.torch as hvd`` and pick a mode.

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

from .. import (Average, ConfigError, EngineError, HvdPartialError, Majority, MismatchError, NotInitializedError,
                RankFailedError, Solo, StreamConflictError, Sum, Sync, UnsupportedInputError, barrier, init,
                is_initialized, local_rank, local_size, rank, shutdown, size, stats)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import (TorchHandle, allgather_object, allreduce, allreduce_, allreduce_async, allreduce_async_,
                        broadcast, broadcast_, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                        poll, synchronize)
from .optimizer import DistributedOptimizer, SynchronizationError

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "barrier", "stats",
    "Sync", "Solo", "Majority", "Average", "Sum",
    "DistributedOptimizer", "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "synchronize", "poll", "TorchHandle",
    "broadcast", "broadcast_", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "RankFailedError", "EngineError", "SynchronizationError",
]
