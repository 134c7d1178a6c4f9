"""Starting the data collective of a negotiated name.

Every rank calls :func:`start` for the same names in the same order, with the
same view of every rank's signature and info, so each can size its receive
buffers without another exchange (an allgather knows every rank's first
dimension, an alltoall every rank's splits). A rank that joined without
submitting the name takes part in an allreduce with zeros (the negotiator
refuses the other data collectives while a rank has joined, as Horovod does).

Signatures are tuples of ``(field, value)`` pairs; the fields read here are
``dtype`` (numpy dtype string), ``shape`` (or ``row_shape``), ``op`` and
``root`` (see :mod:`hvd_partial.collectives.functions`).
"""

from __future__ import annotations

import numpy as np

from ..errors import MismatchError, PartialResultError
from . import requests as kinds
from .reduce_ops import wire_dtype


def start(channel, entry, request, rank: int, size: int):
    """Start ``entry``'s collective; returns (MPI requests, completion).

    Where ``channel.count_parts`` (elastic training), the completion raises
    :class:`PartialResultError` unless every rank's part arrived: a sum
    allreduce carries a count of contributors in its buffers, any other
    collective is followed by a one-element count of its own."""
    requests, complete = _start(channel, entry, request, rank, size)
    if not channel.count_parts or entry.kind == kinds.BARRIER:
        return requests, complete
    if entry.kind in (kinds.ALLREDUCE, kinds.GROUPED_ALLREDUCE):
        return requests, complete  # counted in their own buffers (_counted)
    count = np.ones(1, np.int64)
    total = np.zeros(1, np.int64)
    requests = [*requests, channel.allreduce(count, total, "sum")]

    def checked():
        _check_count(int(total[0]), size, entry)
        return complete()

    return requests, checked


def _check_count(count: int, size: int, entry) -> None:
    if count != size:
        raise PartialResultError(f"{entry.kind} {entry.name!r} completed with the parts of {count} of {size} ranks")


def _start(channel, entry, request, rank: int, size: int):
    """The collective proper of ``entry``: (MPI requests, completion).

    ``request`` is this rank's request, or None where the rank joined
    without submitting the name. The completion returns the raw result that
    the request's ``finish`` turns into the caller's value.
    """
    reference = dict(entry.sigs[min(entry.sigs)])
    kind = entry.kind
    if kind == kinds.BARRIER:
        return [], lambda: None
    if kind == kinds.ALLREDUCE:
        return _allreduce(channel, reference, request)
    if kind == kinds.GROUPED_ALLREDUCE:
        return _grouped_allreduce(channel, reference, request)
    if kind == kinds.ALLGATHER:
        return _allgather(channel, entry, reference, request, size)
    if kind == kinds.BROADCAST:
        return _broadcast(channel, entry, reference, request, rank)
    if kind == kinds.ALLTOALL:
        return _alltoall(channel, entry, reference, request, rank, size)
    if kind == kinds.REDUCESCATTER:
        return _reducescatter(channel, reference, request, rank, size)
    raise MismatchError(f"unknown helper collective {kind!r} under name {entry.name!r}")


def _zeros(shape, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=wire_dtype(np.dtype(dtype)))


def _allreduce(channel, ref, request):
    send = request.arrays[0] if request is not None else _zeros(ref["shape"], ref["dtype"])
    reqs, results = _counted(channel, [send], ref["wire_op"])
    return reqs, lambda: results()[0]


def _grouped_allreduce(channel, ref, request):
    sends = request.arrays if request is not None else [_zeros(s, d) for s, d in ref["arrays"]]
    return _counted(channel, sends, ref["wire_op"])


def _counted(channel, sends: list, op: str):
    """Allreduce ``sends``; where ``channel.count_parts``, each buffer one element
    longer, summing a count of contributors (a non-sum op gets a count of its own)."""
    if not channel.count_parts:
        recvs = [np.empty_like(s) for s in sends]
        return [channel.allreduce(s, r, op) for s, r in zip(sends, recvs)], lambda: recvs
    size = channel.size
    if op == "sum":
        longer = [np.concatenate([np.asarray(s).reshape(-1), np.ones(1, s.dtype)]) for s in sends]
        outs = [np.empty_like(b) for b in longer]
        reqs = [channel.allreduce(b, o, op) for b, o in zip(longer, outs)]

        def results():
            for o in outs:
                if int(o[-1]) != size:
                    raise PartialResultError(f"an allreduce completed with the parts of {int(o[-1])} of {size} ranks")
            return [o[:-1].reshape(s.shape) for o, s in zip(outs, sends)]

        return reqs, results
    recvs = [np.empty_like(s) for s in sends]
    count, total = np.ones(1, np.int64), np.zeros(1, np.int64)
    reqs = [channel.allreduce(s, r, op) for s, r in zip(sends, recvs)] + [channel.allreduce(count, total, "sum")]

    def checked():
        if int(total[0]) != size:
            raise PartialResultError(f"an allreduce completed with the parts of {int(total[0])} of {size} ranks")
        return recvs

    return reqs, checked


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, dtype=np.uint8)


def _allgather(channel, entry, ref, request, size):
    dtype = np.dtype(ref["dtype"])
    row_shape = tuple(ref["row_shape"])
    rows = [int(entry.infos.get(r, 0)) for r in range(size)]
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    send = request.arrays[0] if request is not None else np.zeros((0, *row_shape), dtype=dtype)
    recv = np.empty((sum(rows), *row_shape), dtype=dtype)
    counts = [n * row_bytes for n in rows]
    req = channel.allgather_rows(_bytes(send), _bytes(recv) if recv.size else np.zeros(0, np.uint8), counts)
    return [req], lambda: (recv, rows)


def _broadcast(channel, entry, ref, request, rank):
    root = ref["root"]
    if root not in entry.sigs:
        raise MismatchError(f"broadcast {entry.name!r}: root rank {root} joined without submitting it")
    dtype = np.dtype(ref["dtype"])
    if "shape" in ref:
        shape = tuple(ref["shape"])
    else:  # an object: its length in bytes is the root's info
        shape = (int(entry.infos[root]),)
    if request is not None and rank == root:
        buffer = np.array(request.arrays[0], dtype=dtype, copy=True).reshape(shape)
    else:
        buffer = np.empty(shape, dtype=dtype)
    return [channel.broadcast_bytes(_bytes(buffer), root)], lambda: buffer


def _alltoall(channel, entry, ref, request, rank, size):
    dtype = np.dtype(ref["dtype"])
    row_shape = tuple(ref["row_shape"])
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    zero = [0] * size
    send_rows = list(entry.infos.get(rank, zero)) if request is not None else zero
    recv_rows = [int(entry.infos.get(r, zero)[rank]) for r in range(size)]
    send = request.arrays[0] if request is not None else np.zeros((0, *row_shape), dtype=dtype)
    recv = np.empty((sum(recv_rows), *row_shape), dtype=dtype)
    req = channel.alltoall_bytes(_bytes(send), [n * row_bytes for n in send_rows], _bytes(recv),
                                 [n * row_bytes for n in recv_rows])
    return [req], lambda: (recv, np.array(recv_rows, dtype=np.int32))


def scatter_rows(first_dim: int, size: int) -> list[int]:
    """Rows of a reducescatter result per rank: as even as possible, the
    first ``first_dim % size`` ranks one more (Horovod's split)."""
    base, extra = divmod(first_dim, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


def _reducescatter(channel, ref, request, rank, size):
    shape = tuple(ref["shape"])
    send = request.arrays[0] if request is not None else _zeros(shape, ref["dtype"])
    row_elems = int(np.prod(shape[1:], dtype=np.int64))
    rows = scatter_rows(shape[0], size)
    recv = np.empty((rows[rank], *shape[1:]), dtype=send.dtype)
    req = channel.reduce_scatter(send.reshape(-1), recv.reshape(-1), [n * row_elems for n in rows], ref["wire_op"])
    return [req], lambda: recv
