"""Horovod's process-level names for the TensorFlow adapter: ``init`` with
Horovod's arguments, node topology (``cross_rank``, ``cross_size``,
``is_homogeneous``), what the build supports (``mpi_built``, ``nccl_built``,
...), rank and size as tensors, and the checks of Horovod arguments that
hvd_partial accepts only at their default values; Horovod's process sets
(:mod:`hvd_partial.collectives.process_sets`) with their ``process_set_id``
ops.

Example::

    import hvd_partial.tensorflow as hvd

    hvd.init()
    print(hvd.rank(), hvd.cross_rank(), hvd.cross_size(), hvd.mpi_enabled())
"""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

import hvd_partial as _core
from ..collectives.process_sets import ProcessSet, by_id, check_usable, global_process_set  # noqa: F401
from ..collectives.set_changes import add_process_set, remove_process_set  # noqa: F401
from ..build_flags import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,  # noqa: F401
                           mpi_enabled, mpi_threads_supported, nccl_built, rocm_built)
from ..errors import ConfigError, NotSupportedError
from ..modes import ReduceOp

log = logging.getLogger("hvd_partial.tensorflow")


def require_default(where: str, **given) -> None:
    """Raise ``ConfigError`` naming every Horovod argument not at its default.

    ``given`` maps a name to ``(value, default)``.
    """
    bad = [f"{name}={value!r}" for name, (value, default) in given.items()
           if not (value == default if not isinstance(default, (list, tuple)) else value in default)]
    if bad:
        raise ConfigError(f"{where}: {', '.join(bad)} not supported by hvd_partial (only the default value is)")


def resolve_op(op, average, where: str) -> ReduceOp:
    """Horovod's ``op`` / deprecated ``average`` pair: ``average=True`` is
    Average, ``False`` Sum; both given is an error; neither is Average."""
    if average is not None and op is not None:
        raise ConfigError(f"{where}: give op= or the deprecated average=, not both")
    if average is not None:
        return _core.Average if average else _core.Sum
    op = _core.Average if op is None else op
    if not isinstance(op, ReduceOp):
        raise ConfigError(f"{where}: op must be hvd.Average, Sum, Min, Max or Product, got {op!r}")
    if op is ReduceOp.ADASUM:
        raise NotSupportedError(f"{where}: op=Adasum is not implemented in hvd_partial; use Average or Sum")
    return op


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper: the op that ``op``/``average`` mean (Average if neither)."""
    return resolve_op(op, average, "allreduce")


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """True if ``num_rank`` is a power of two (Horovod's Adasum check)."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


# -- init and topology ------------------------------------------------------------------

_topology_lock = threading.Lock()
_topology: dict | None = None


def init(comm=None, process_sets=None, **config) -> None:
    """Horovod's ``init``: start hvd_partial (collective). ``comm`` is an mpi4py
    communicator (default ``MPI.COMM_WORLD``); ``process_sets`` a list of
    :class:`ProcessSet` (or of rank lists) to add at start-up, as
    ``add_process_set`` does; other keywords are hvd_partial's configuration fields.

    Example::

        hvd.init()                       # Horovod's call
        hvd.init(max_staleness=4)        # with an hvd_partial setting
        hvd.init(process_sets=[hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])])
    """
    global _topology
    if isinstance(comm, (list, tuple)):
        raise ConfigError("init(comm=[ranks]) is not supported; pass an mpi4py communicator")
    _core.init(comm, process_sets=process_sets, **config)
    with _topology_lock:
        _topology = None
    _load_topology()


def _load_topology() -> dict:
    """Ranks grouped by node (collective the first time after each init)."""
    global _topology
    with _topology_lock:
        if _topology is not None and _topology["generation"] is _core.config():
            return _topology
    everyone = _core.allgather_object((_core.local_rank(), _core.local_size()))
    me = _core.rank()
    local_rank = everyone[me][0]
    peers = [r for r, (lr, _) in enumerate(everyone) if lr == local_rank]
    info = {"generation": _core.config(), "cross_rank": peers.index(me), "cross_size": len(peers),
            "homogeneous": len({ls for _, ls in everyone}) == 1}
    with _topology_lock:
        _topology = info
    return info


def cross_rank() -> int:
    """This process's rank among the processes with the same local rank (its
    node's index, on homogeneous clusters)."""
    return _load_topology()["cross_rank"]


def cross_size() -> int:
    """The number of processes with this process's local rank (the number of
    nodes, on homogeneous clusters)."""
    return _load_topology()["cross_size"]


def is_homogeneous() -> bool:
    """True if every node runs the same number of processes."""
    return _load_topology()["homogeneous"]


def rank_op(name=None):
    """``rank()`` as an int32 tensor."""
    return tf.constant(_core.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    """``local_rank()`` as an int32 tensor."""
    return tf.constant(_core.local_rank(), dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name=None):
    """The size of the process set ``process_set_id`` (0: the global set) as an
    int32 tensor; an id no added set has raises ``ProcessSetError`` (a ``ValueError``)."""
    return tf.constant(by_id(process_set_id, "size_op").size(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    """``local_size()`` as an int32 tensor."""
    return tf.constant(_core.local_size(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id: int = 0, name=None):
    """1 if this process belongs to the process set ``process_set_id``, else 0 (an int32 tensor)."""
    return tf.constant(int(by_id(process_set_id, "process_set_included_op").included()), dtype=tf.int32, name=name)


# -- the timeline ---------------------------------------------------------------------------

def start_timeline(file_path, mark_cycles: bool = False):
    """Not supported at run time: the timeline is chosen at ``init``
    (``HOROVOD_TIMELINE``, ``HVD_PARTIAL_TIMELINE_FILENAME`` or
    ``hvd-partial-run --timeline-filename``)."""
    raise ConfigError("start_timeline is not supported at run time: set HOROVOD_TIMELINE (or "
                      "HVD_PARTIAL_TIMELINE_FILENAME, or hvd-partial-run --timeline-filename) before init")


def stop_timeline():
    """Not supported at run time (see :func:`start_timeline`)."""
    raise ConfigError("stop_timeline is not supported at run time: the timeline set at init is written until "
                      "shutdown")
