"""Keras 3 adapter with Horovod's names: change ``import
horovod.tensorflow.keras as hvd`` to ``import hvd_partial.keras as hvd`` and
pick a mode. Needs Keras 3 on the TensorFlow backend.

Example::

    import keras
    import hvd_partial.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), mode=hvd.Solo())
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_shard, y_shard, epochs=5,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback()])
"""

from .backend import KerasBackendError

# Each module below checks the Keras backend when it is imported.
from .. import (Average, ConfigError, EngineError, HvdPartialError, Majority, MismatchError,  # noqa: E402
                NotInitializedError, RankFailedError, Solo, StreamConflictError, Sum, Sync, UnsupportedInputError,
                barrier, config, init, is_initialized, local_rank, local_size, rank, shutdown, size, stats)
from ..tensorflow import (Compression, allgather_object, allreduce, broadcast, broadcast_object,  # noqa: E402
                          broadcast_variables)
from . import callbacks  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402
from .saving import load_model  # noqa: E402

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "config", "barrier", "stats",
    "Sync", "Solo", "Majority", "Average", "Sum",
    "DistributedOptimizer", "callbacks", "load_model", "Compression",
    "allreduce", "broadcast", "broadcast_variables", "broadcast_object", "allgather_object",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "RankFailedError", "EngineError", "KerasBackendError",
]
