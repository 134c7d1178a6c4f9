"""Negotiated helper collectives with Horovod's semantics (numpy level).

Every call is matched across ranks by name before any data moves: the
engines exchange what each rank submitted, compare the fields that must agree
(collective, shape or row shape, dtype, op, root, scale factors, process set)
and either run the collective or raise the same
:class:`~hvd_partial.errors.MismatchError` on every rank, naming the ranks
and the field. Unnamed calls are named ``<kind>.noname.<n>``, numbered in
call order per kind (``allgather_object`` and ``broadcast_object`` in
sequences of their own), identically on every rank that makes the same calls. A
second call under a name still in flight on a rank raises
:class:`~hvd_partial.errors.DuplicateNameError` there. A name that some ranks
never submit is reported after ``stall_warning_seconds`` and fails every rank
after ``stall_shutdown_seconds`` (if set). All of it runs on one MPI
communicator, whatever the number of names (a process set's data collectives
on the set's own communicator).

Signatures (``op`` is one of ``Average`` (default), ``Sum``, ``Min``, ``Max``,
``Product``; ``Adasum`` raises :class:`~hvd_partial.errors.UnsupportedInputError`;
``process_set``: ``global_process_set`` or a set from ``add_process_set``, see
:mod:`hvd_partial.collectives.process_sets`)::

    allreduce(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set) -> ndarray
    grouped_allreduce(arrays, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set) -> list[ndarray]
    allgather(array, name=None, process_set=global_process_set) -> ndarray   # first dim may differ
    broadcast(array, root_rank, name=None, process_set=global_process_set) -> ndarray
    alltoall(array, splits=None, name=None, process_set=global_process_set) -> (ndarray, received_splits)
    reducescatter(array, name=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> ndarray    # Average or Sum
    broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set) -> object
    allgather_object(obj, name=None, process_set=global_process_set) -> list
    barrier(process_set=global_process_set) -> None
    join(device=-1) -> int                                                   # the rank that joined last

Each has an ``*_async`` form with the same arguments (except ``join``)
returning a :class:`~hvd_partial.Handle`; ``hvd_partial.synchronize(handle)``
returns the result (``handle.wait()`` also blocks), ``hvd_partial.poll(handle)``
tells whether it is ready. Results are new arrays the caller owns; inputs are
copied at the call, so they may be modified at once.

Integer ``Average`` is truncated toward zero, as Horovod does (see
:mod:`hvd_partial.collectives.reduce_ops`). A rank that called ``join`` takes
part in the others' allreduces with zeros until every rank has joined; as in
Horovod, an allgather, alltoall, broadcast or reducescatter negotiated while
some ranks have joined raises ``NotSupportedError`` on the ranks that called it.

Example::

    import numpy as np
    import hvd_partial as hvd

    hvd.init()
    total = hvd.allreduce(np.array([hvd.rank()]), op=hvd.Sum)
    rows = hvd.allgather(np.full((hvd.rank() + 1, 2), hvd.rank()))
    hvd.shutdown()
"""

from ..modes import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .functions import (allgather, allgather_async, allgather_object, allgather_object_async, allreduce,
                        allreduce_async, alltoall, alltoall_async, barrier, barrier_async, broadcast, broadcast_async,
                        broadcast_object, broadcast_object_async, grouped_allreduce, grouped_allreduce_async, join,
                        reducescatter, reducescatter_async)
from .negotiator import Negotiator
from .process_sets import ProcessSet, global_process_set
from .set_changes import add_process_set, remove_process_set

__all__ = [
    "allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather", "allgather_async",
    "broadcast", "broadcast_async", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "broadcast_object", "broadcast_object_async", "allgather_object", "allgather_object_async", "barrier",
    "barrier_async", "join", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Negotiator", "ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum",
]
