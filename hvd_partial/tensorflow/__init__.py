"""TensorFlow 2 adapter with Horovod's names: change ``import horovod.tensorflow
as hvd`` to ``import hvd_partial.tensorflow as hvd`` and pick a mode.

Example::

    import tensorflow as tf
    import hvd_partial.tensorflow as hvd

    hvd.init()
    hvd.broadcast_variables(model.variables, root_rank=0)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    tape = hvd.DistributedGradientTape(tape, mode=hvd.Solo())
    tape.gradient_rounds(loss, model.trainable_variables).apply(optimizer)
    ...
    hvd.flush_gradients().apply(optimizer, model.trainable_variables)

Keras users: see :mod:`hvd_partial.keras`.
"""

from .. import (Average, ConfigError, EngineError, HvdPartialError, Majority, MismatchError, NotInitializedError,
                RankFailedError, Solo, StreamConflictError, Sum, Sync, UnsupportedInputError, barrier, config, init,
                is_initialized, local_rank, local_size, rank, shutdown, size, stats)
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .exchange import GradientExchange, RoundGradients
from .functions import allgather_object, allreduce, broadcast, broadcast_object, broadcast_variables
from .gradient_tape import DEFAULT_TAPE_STREAM, DistributedGradientTape, flush_gradients

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "config", "barrier", "stats",
    "Sync", "Solo", "Majority", "Average", "Sum",
    "DistributedGradientTape", "RoundGradients", "GradientExchange", "flush_gradients", "DEFAULT_TAPE_STREAM",
    "Compression", "Compressor", "NoneCompressor", "FP16Compressor",
    "allreduce", "broadcast", "broadcast_variables", "broadcast_object", "allgather_object",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "RankFailedError", "EngineError",
]
