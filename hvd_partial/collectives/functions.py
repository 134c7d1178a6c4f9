"""The negotiated helper collectives on numpy arrays (compute-thread side).

Each function builds a request, hands it to the engine, and either waits
(``allreduce``) or returns a :class:`~hvd_partial.Handle` at once
(``allreduce_async``) that :func:`hvd_partial.synchronize` and
:func:`hvd_partial.poll` accept (``handle.wait()`` blocks too). See the
package docstring for the signatures and semantics.
"""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np

from .. import session
from ..engine.handle import Handle
from ..errors import DuplicateNameError, ProcessSetError, UnsupportedInputError
from ..modes import ReduceOp
from . import requests as kinds
from .process_sets import global_process_set, members_size, resolve
from .reduce_ops import check_op, check_reducible, finish_reduction, scale, wire_dtype, wire_op
from .requests import Request

Average = ReduceOp.AVERAGE


class _Names:
    """Per session: auto-name counters and the names in flight on this rank."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counters: dict[str, int] = {}
        self.in_flight: set[str] = set()

    def claim(self, kind: str, name: str | None, rank: int, set_id: int = 0) -> str:
        """A name for the call (numbered per kind and process set where None), marked in flight."""
        with self.lock:
            if name is None:
                key = kind if set_id == 0 else f"{kind}@{set_id}"
                number = self.counters.get(key, 0)
                self.counters[key] = number + 1
                name = f"{kind}.noname.{number}"
            elif not isinstance(name, str) or not name:
                raise TypeError(f"{kind}: name must be a non-empty str or None, got {name!r}")
            if (set_id, name) in self.in_flight:
                where = "" if set_id == 0 else f" on process set {set_id}"
                raise DuplicateNameError(
                    f"rank {rank}: {kind} {name!r}: a collective under this name is already in flight{where} on "
                    "this rank; synchronize it first or use another name")
            self.in_flight.add((set_id, name))
            return name

    def restart_set(self, set_id: int) -> None:
        """A set was just added under ``set_id`` (on every rank): its unnamed calls number from 0."""
        with self.lock:
            for key in [k for k in self.counters if k.endswith(f"@{set_id}")]:
                del self.counters[key]

    def releaser(self, name: str, set_id: int = 0):
        def release():
            with self.lock:
                self.in_flight.discard((set_id, name))

        return release


def _submit(kind: str, name, signature: tuple, info, arrays, finish=None, counter: str | None = None,
            set_id: int = 0) -> Handle:
    """``counter`` names the sequence an unnamed call is numbered in (default: ``kind``);
    ``set_id``: the process set it runs on (0: every rank)."""
    current = session.require()
    engine = current.engine
    names = current.adapter_state("collectives", _Names)
    name = names.claim(counter or kind, name, engine.rank, set_id)
    handle = Handle(f"{kind}({name})")
    request = Request(name, kind, (("collective", kind),) + signature + (("process_set", set_id),), info, arrays,
                      handle, finish=finish, release=names.releaser(name, set_id), submitted_at=time.monotonic(),
                      process_set=set_id)
    try:
        engine.submit_helper(request)
    except BaseException:
        request.release()
        raise
    return handle


def _array(array, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        if np.isscalar(array) or isinstance(array, (list, tuple)):
            array = np.asarray(array)
        else:
            raise UnsupportedInputError(f"{what} expects a numpy array, got {type(array).__name__}")
    if array.dtype.kind not in "biufc" or array.dtype.hasobject:
        raise UnsupportedInputError(f"{what}: arrays of dtype {array.dtype} cannot be sent")
    return array


def _factor(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number, got {value!r}") from None


def _reduction_input(array, op, prescale, what) -> np.ndarray:
    check_reducible(array, what)
    send = np.array(array, dtype=wire_dtype(array.dtype), copy=True, order="C")
    return scale(send, prescale) if prescale != 1.0 else send


def _one_reduction(array, op, prescale_factor, postscale_factor, what, size: int):
    """What allreduce and reducescatter send for ``array``: the wire buffer,
    the signature all ranks must agree on, and the function that makes the result
    (``size``: the number of ranks it runs among)."""
    pre, post = _factor(prescale_factor, "prescale_factor"), _factor(postscale_factor, "postscale_factor")
    send = _reduction_input(array, op, pre, what)
    dtype = array.dtype
    signature = (("dtype", dtype.str), ("shape", tuple(array.shape)), ("op", op.value), ("wire_op", wire_op(op)),
                 ("prescale_factor", pre), ("postscale_factor", post))
    return send, signature, lambda recv: finish_reduction(recv, op, size, post, dtype)


# ===== allreduce ==========================================================================

def allreduce_async(array, name: str | None = None, op: ReduceOp = Average, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set=global_process_set) -> Handle:
    """Start an allreduce of ``array``; ``synchronize(handle)`` returns a new array.

    Example::

        handle = hvd.allreduce_async(np.array([loss]), name="loss")
        mean = hvd.synchronize(handle)
    """
    what = f"allreduce({name or ''})"
    array = _array(array, what)
    op = check_op(op, what)
    set_id, ranks = resolve(process_set, what)
    send, signature, finish = _one_reduction(array, op, prescale_factor, postscale_factor, what, members_size(ranks))
    return _submit(kinds.ALLREDUCE, name, signature, None, [send], finish=finish, set_id=set_id)


def allreduce(array, name: str | None = None, op: ReduceOp = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=global_process_set) -> np.ndarray:
    """Reduce ``array`` over all ranks (``op``: Average, Sum, Min, Max, Product);
    returns a new array of the same shape and dtype.

    Example::

        mean_loss = hvd.allreduce(np.array([loss]), name="loss")[0]
    """
    return session.wait(allreduce_async(array, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(arrays, name: str | None = None, op: ReduceOp = Average, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set=global_process_set) -> Handle:
    """Start one negotiated allreduce of a list of arrays; ``synchronize``
    returns the list of reduced arrays.

    Example::

        w, b = hvd.synchronize(hvd.grouped_allreduce_async([w_grad, b_grad], name="layer1"))
    """
    what = f"grouped_allreduce({name or ''})"
    arrays = [_array(a, f"{what}[{i}]") for i, a in enumerate(arrays)]
    if not arrays:
        raise UnsupportedInputError(f"{what} needs at least one array")
    op = check_op(op, what)
    set_id, ranks = resolve(process_set, what)
    pre, post = _factor(prescale_factor, "prescale_factor"), _factor(postscale_factor, "postscale_factor")
    sends = [_reduction_input(a, op, pre, f"{what}[{i}]") for i, a in enumerate(arrays)]
    size, dtypes = members_size(ranks), [a.dtype for a in arrays]
    signature = (("arrays", tuple((tuple(a.shape), a.dtype.str) for a in arrays)), ("op", op.value),
                 ("wire_op", wire_op(op)), ("prescale_factor", pre), ("postscale_factor", post))
    return _submit(kinds.GROUPED_ALLREDUCE, name, signature, None, sends,
                   finish=lambda recvs: [finish_reduction(r, op, size, post, d) for r, d in zip(recvs, dtypes)],
                   set_id=set_id)


def grouped_allreduce(arrays, name: str | None = None, op: ReduceOp = Average, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=global_process_set) -> list:
    """Blocking :func:`grouped_allreduce_async`.

    Example::

        w, b = hvd.grouped_allreduce([w_grad, b_grad], op=hvd.Sum)
    """
    return session.wait(grouped_allreduce_async(arrays, name, op, prescale_factor, postscale_factor, process_set))


# ===== allgather, broadcast, alltoall, reducescatter ===========================================

def allgather_async(array, name: str | None = None, process_set=global_process_set) -> Handle:
    """Start gathering every rank's ``array`` along the first dimension (which
    may differ across ranks; the others must agree).

    Example::

        rows = hvd.synchronize(hvd.allgather_async(np.arange(hvd.rank() + 1)))
    """
    what = f"allgather({name or ''})"
    array = np.ascontiguousarray(_array(array, what))
    set_id, _ = resolve(process_set, what)
    if array.ndim == 0:
        raise UnsupportedInputError(f"{what}: needs an array of at least one dimension, got a scalar")
    signature = (("dtype", array.dtype.str), ("row_shape", tuple(array.shape[1:])))
    return _submit(kinds.ALLGATHER, name, signature, int(array.shape[0]), [array.copy()],
                   finish=lambda result: result[0], set_id=set_id)


def allgather(array, name: str | None = None, process_set=global_process_set) -> np.ndarray:
    """Concatenate every rank's ``array`` along the first dimension, in rank order.

    Example::

        everyone = hvd.allgather(np.array([hvd.rank()]))  # [0, 1, ..., size-1]
    """
    return session.wait(allgather_async(array, name, process_set))


def broadcast_async(array, root_rank: int, name: str | None = None, process_set=global_process_set) -> Handle:
    """Start a broadcast of ``root_rank``'s ``array``; ``synchronize`` returns a new array.

    Example::

        weights = hvd.synchronize(hvd.broadcast_async(weights, root_rank=0))
    """
    what = f"broadcast({name or ''})"
    array = _array(array, what)
    set_id, ranks = resolve(process_set, what)
    _check_root(root_rank, what, ranks)
    signature = (("dtype", array.dtype.str), ("shape", tuple(array.shape)), ("root", int(root_rank)))
    arrays = [np.array(array, copy=True, order="C")] if session.require().transport.rank == root_rank else []
    return _submit(kinds.BROADCAST, name, signature, None, arrays, set_id=set_id)


def broadcast(array, root_rank: int, name: str | None = None, process_set=global_process_set) -> np.ndarray:
    """Return ``root_rank``'s ``array`` on every rank (a new array).

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    return session.wait(broadcast_async(array, root_rank, name, process_set))


def _check_root(root_rank, what: str, ranks: list[int] | None) -> None:
    """``root_rank`` is a global rank; on a process set (``ranks``), one of its members."""
    size = session.require().transport.size
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < size:
        raise ValueError(f"{what}: root_rank must be an int in [0, {size}), got {root_rank!r}")
    if ranks is not None and root_rank not in ranks:
        raise ProcessSetError(f"rank {session.require().transport.rank}: {what}: root_rank {root_rank} is not in "
                              f"the process set (ranks {ranks}); root_rank is a global rank of one of its members")


def alltoall_async(array, splits=None, name: str | None = None, process_set=global_process_set) -> Handle:
    """Start an alltoall: rows ``splits[j]`` of ``array`` (in order) go to rank
    ``j``; ``synchronize`` returns ``(received, received_splits)``.

    Without ``splits`` the first dimension is divided equally (it must be a
    multiple of the number of ranks).

    Example::

        out, counts = hvd.synchronize(hvd.alltoall_async(x, splits=[1, 2]))
    """
    what = f"alltoall({name or ''})"
    array = np.ascontiguousarray(_array(array, what))
    set_id, ranks = resolve(process_set, what)
    size = members_size(ranks)
    if array.ndim == 0:
        raise UnsupportedInputError(f"{what}: needs an array of at least one dimension, got a scalar")
    if splits is None:
        if array.shape[0] % size:
            raise ValueError(f"{what}: without splits the first dimension ({array.shape[0]}) must be a multiple "
                             f"of the number of ranks ({size})")
        splits = [array.shape[0] // size] * size
    splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != array.shape[0]:
        raise ValueError(f"{what}: splits must be {size} non-negative ints that sum to the first dimension "
                         f"({array.shape[0]}), got {splits}")
    signature = (("dtype", array.dtype.str), ("row_shape", tuple(array.shape[1:])))
    return _submit(kinds.ALLTOALL, name, signature, splits, [array.copy()], set_id=set_id)


def alltoall(array, splits=None, name: str | None = None, process_set=global_process_set):
    """Blocking :func:`alltoall_async`: returns ``(received, received_splits)``.

    Example::

        out, counts = hvd.alltoall(np.arange(4), splits=[3, 1])
    """
    return session.wait(alltoall_async(array, splits, name, process_set))


def reducescatter_async(array, name: str | None = None, op: ReduceOp = Average, process_set=global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reduction of ``array`` whose result is split along the first
    dimension: rank ``r`` gets its share (the first ``dim0 % size`` ranks one
    row more). ``op``: Average or Sum, as in Horovod.

    Example::

        mine = hvd.synchronize(hvd.reducescatter_async(grads, op=hvd.Sum))
    """
    what = f"reducescatter({name or ''})"
    array = _array(array, what)
    op = check_op(op, what)
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise UnsupportedInputError(f"{what}: reducescatter supports only op=Average and op=Sum, got {op!r}")
    set_id, ranks = resolve(process_set, what)
    if array.ndim == 0:
        raise UnsupportedInputError(f"{what}: needs an array of at least one dimension, got a scalar")
    send, signature, finish = _one_reduction(array, op, prescale_factor, postscale_factor, what, members_size(ranks))
    return _submit(kinds.REDUCESCATTER, name, signature, None, [send], finish=finish, set_id=set_id)


def reducescatter(array, name: str | None = None, op: ReduceOp = Average, process_set=global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> np.ndarray:
    """Blocking :func:`reducescatter_async`.

    Example::

        mine = hvd.reducescatter(np.ones((4, 3)), op=hvd.Sum)
    """
    return session.wait(reducescatter_async(array, name, op, process_set, prescale_factor, postscale_factor))


# ===== objects, barrier, join ================================================================

def broadcast_object_async(obj, root_rank: int = 0, name: str | None = None,
                           process_set=global_process_set) -> Handle:
    """Start a broadcast of ``root_rank``'s picklable ``obj``.

    Example::

        config = hvd.synchronize(hvd.broadcast_object_async(config))
    """
    what = f"broadcast_object({name or ''})"
    set_id, ranks = resolve(process_set, what)
    _check_root(root_rank, what, ranks)
    root = session.require().transport.rank == root_rank
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy() if root else None
    signature = (("dtype", "|u1"), ("object", True), ("root", int(root_rank)))

    def finish(buffer):
        return obj if root else pickle.loads(buffer.tobytes())

    return _submit(kinds.BROADCAST, name, signature, payload.size if root else None,
                   [payload] if root else [], finish=finish, counter="broadcast_object", set_id=set_id)


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, process_set=global_process_set):
    """Return ``root_rank``'s picklable ``obj`` on every rank.

    Example::

        config = hvd.broadcast_object(config if hvd.rank() == 0 else None)
    """
    return session.wait(broadcast_object_async(obj, root_rank, name, process_set))


def allgather_object_async(obj, name: str | None = None, process_set=global_process_set) -> Handle:
    """Start gathering every rank's picklable ``obj``.

    Example::

        hosts = hvd.synchronize(hvd.allgather_object_async(socket.gethostname()))
    """
    what = f"allgather_object({name or ''})"
    set_id, _ = resolve(process_set, what)
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    signature = (("dtype", "|u1"), ("row_shape", ()), ("object", True))

    def finish(result):
        gathered, rows = result
        out, offset = [], 0
        for n in rows:
            out.append(pickle.loads(gathered[offset:offset + n].tobytes()))
            offset += n
        return out

    return _submit(kinds.ALLGATHER, name, signature, int(payload.size), [payload], finish=finish,
                   counter="allgather_object", set_id=set_id)


def allgather_object(obj, name: str | None = None, process_set=global_process_set) -> list:
    """Return the list of every rank's picklable ``obj``, in rank order.

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    return session.wait(allgather_object_async(obj, name, process_set))


def barrier_async(process_set=global_process_set) -> Handle:
    """Start a barrier; its handle completes once every rank of ``process_set`` has entered it."""
    set_id, _ = resolve(process_set, "barrier")
    return _submit(kinds.BARRIER, None, (), None, [], set_id=set_id)


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank has called ``barrier``.

    Example::

        hvd.barrier()
    """
    session.wait(barrier_async(process_set))


def run_process_set_request(action: str, args: tuple, what: str):
    """Add or remove a process set on every rank (collective: the negotiation
    orders it among the helper collectives; the engine makes or frees the set's
    communicator). Returns ``(the new set's id, its engine's communicator or None on
    a rank outside it)``, or whether a set was removed."""

    current = session.require()
    names = current.adapter_state("collectives", _Names)
    field = "ranks" if action == kinds.ADD else "process_set_id"
    result = session.wait(_submit(kinds.PROCESS_SET, None, (("action", action), (field, args)), None, [],
                                  counter=f"process_set.{action}"))
    if action == kinds.ADD:
        names.restart_set(result[0])
    return result


def name_counters() -> dict[str, int]:
    """This session's counters of unnamed helper calls, per kind (``allreduce.noname.<n>``)."""
    names = session.require().adapter_state("collectives", _Names)
    with names.lock:
        return dict(names.counters)


def adopt_name_counters(counters: dict[str, int]) -> None:
    """Number unnamed helper calls on from ``counters`` (a rank that joined a grown world
    takes rank 0's, so that its next unnamed call has the others' name)."""
    names = session.require().adapter_state("collectives", _Names)
    with names.lock:
        names.counters = dict(counters)


def run_on_engine(function):
    """Run ``function()`` on this rank's engine thread (no communication) and
    return its value: for changes to what only the engine thread may touch.

    Example::

        run_on_engine(lambda: engine_owned_object.close())
    """
    engine = session.require().engine
    handle = Handle("run_on_engine")
    request = Request("", kinds.LOCAL, (), None, [], handle, finish=lambda _: function())
    engine.submit_helper(request)
    return session.wait(handle)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data (Horovod's ``join``).

    Until every rank has joined, this rank's engine takes part in the other
    ranks' allreduces (and grouped allreduces) with zeros; an allgather,
    alltoall, broadcast or reducescatter negotiated meanwhile raises
    ``NotSupportedError`` on the ranks that called it, as Horovod refuses
    them. Returns the rank that joined last (the highest
    rank among those that joined in the same negotiation cycle).
    ``device`` is accepted for Horovod's signature and ignored.

    Example::

        for batch in my_uneven_shard:
            train_step(batch)
        hvd.join()
    """
    return session.wait(_submit(kinds.JOIN, None, (), None, []))
