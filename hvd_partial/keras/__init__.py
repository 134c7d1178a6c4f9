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
from .. import (Average, ConfigError, DuplicateNameError, EngineError, NotSupportedError, HvdPartialError, Majority, MismatchError,  # noqa: E402
                NotInitializedError, RankFailedError, Solo, StreamConflictError, Sum, Sync, UnsupportedInputError,
                barrier, config, is_initialized, local_rank, local_size, rank, shutdown, size, stats)
from ..modes import Adasum, Max, Min, Product  # noqa: E402
from ..tensorflow import (Compression, ProcessSet, add_process_set, allgather_object, broadcast_object,  # noqa: E402
                          broadcast_variables, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                          global_process_set, gloo_built, gloo_enabled, init, is_homogeneous, mpi_built,
                          mpi_enabled, mpi_threads_supported, nccl_built, remove_process_set, rocm_built,
                          start_timeline, stop_timeline)
from . import callbacks, elastic, fit_hooks  # noqa: E402
from .functions import allgather, allreduce, broadcast, broadcast_global_variables, reducescatter  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402
from .partial_optimizer import PartialDistributedOptimizer  # noqa: E402
from .saving import load_model  # noqa: E402

# model.fit flushes a DistributedOptimizer at every epoch end (see fit_hooks).
fit_hooks.install(callbacks.attach_epoch_flush)

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "is_homogeneous", "config", "barrier", "stats",
    "Sync", "Solo", "Majority", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "DistributedOptimizer", "PartialDistributedOptimizer", "callbacks", "elastic", "load_model", "Compression",
    "allreduce", "allgather", "broadcast", "reducescatter", "broadcast_variables", "broadcast_global_variables",
    "broadcast_object", "allgather_object",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
    "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "HvdPartialError", "NotInitializedError", "ConfigError", "UnsupportedInputError", "StreamConflictError",
    "MismatchError", "RankFailedError", "EngineError", "NotSupportedError", "DuplicateNameError", "KerasBackendError",
]
