"""TensorFlow 2 adapter with Horovod's names: change ``import horovod.tensorflow
as hvd`` to ``import hvd_partial.tensorflow as hvd``. Streams run in the mode
set by ``HVD_PARTIAL_MODE`` (solo unless set) or given as ``mode=``.

Example (Horovod's TF2 loop, unchanged)::

    import tensorflow as tf
    import hvd_partial.tensorflow as hvd

    hvd.init()

    @tf.function
    def step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

    ...
    hvd.flush_tapes()        # solo/majority: identical replicas before saving

Keras users: :mod:`hvd_partial.tensorflow.keras` (also ``hvd_partial.keras``).
The compatibility with every Horovod name is listed in docs/horovod-tensorflow.md.
"""

from .. import (Average, ConfigError, DuplicateNameError, EngineError, HvdPartialError, Majority, MismatchError,
                NotInitializedError, NotSupportedError, RankFailedError, Solo, StreamConflictError, Sum, Sync,
                UnsupportedInputError, barrier, config, is_initialized, local_rank, local_size, rank, shutdown, size,
                stats)
from ..modes import Adasum, Max, Min, Product
from .basics import (ProcessSet, add_process_set, ccl_built, check_num_rank_power_of_2, cross_rank, cross_size,
                     cuda_built, ddl_built, global_process_set, gloo_built, gloo_enabled,
                     handle_average_backwards_compatibility, init, is_homogeneous, local_rank_op, local_size_op,
                     mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, process_set_included_op, rank_op,
                     remove_process_set, rocm_built, size_op, start_timeline, stop_timeline)
from . import elastic, util
from .util import executing_eagerly as _executing_eagerly  # Horovod's private name, read by its tests
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .exchange import GradientExchange, RoundGradients
from .functions import (allgather, allgather_object, allreduce, alltoall, broadcast, broadcast_,
                        broadcast_global_variables, broadcast_object, broadcast_object_fn, broadcast_variables,
                        grouped_allgather, grouped_allreduce, grouped_reducescatter, join, reducescatter)
from .gradient_tape import (DEFAULT_TAPE_STREAM, DistributedGradientTape, PartialDistributedGradientTape,
                            flush_gradients, flush_tapes)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "is_homogeneous", "config", "barrier", "stats",
    "Sync", "Solo", "Majority", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "RoundGradients", "GradientExchange", "flush_gradients",
    "flush_tapes", "DEFAULT_TAPE_STREAM", "elastic",
    "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn",
    "allgather_object", "reducescatter", "grouped_reducescatter", "alltoall", "join",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "rank_op", "local_rank_op", "size_op", "local_size_op", "process_set_included_op",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "check_num_rank_power_of_2", "handle_average_backwards_compatibility",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "RankFailedError", "EngineError", "NotSupportedError", "DuplicateNameError",
]


def __getattr__(name):
    # Keras is imported only when the Keras optimizer wrapper is asked for (as in
    # Horovod, hvd.DistributedOptimizer wraps a Keras optimizer in TensorFlow 2).
    if name == "DistributedOptimizer":
        from ..keras.optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
