"""The numpy-level helper collectives that the TensorFlow functions run in
their ``tf.numpy_function``: the package's own (``hvd_partial.allgather``,
``alltoall``, ...) where it has them, else built here on its object
collectives, which check shapes and dtypes across ranks and raise
``MismatchError`` on every rank instead of hanging.

Example::

    gathered = allgather(np.arange(3.0) * hvd.rank(), name="x")
"""

from __future__ import annotations

import numpy as np

import hvd_partial as _core
from ..errors import ConfigError, MismatchError, UnsupportedInputError
from ..modes import ReduceOp

_NUMPY_REDUCE = {ReduceOp.MIN: np.minimum.reduce, ReduceOp.MAX: np.maximum.reduce,
                 ReduceOp.PRODUCT: np.multiply.reduce}


def _core_function(name: str):
    return getattr(_core, name, None)


def _gather(array: np.ndarray, what: str) -> list:
    parts = _core.allgather_object(np.ascontiguousarray(array))
    dtypes = {p.dtype.str for p in parts}
    if len(dtypes) > 1:
        detail = ", ".join(f"rank {j}: {p.dtype.name}" for j, p in enumerate(parts))
        raise MismatchError(f"rank {_core.rank()}: {what}: ranks passed different dtypes ({detail})")
    return parts


def _same_shapes(parts: list, what: str) -> None:
    shapes = {p.shape for p in parts}
    if len(shapes) > 1:
        detail = ", ".join(f"rank {j}: {list(p.shape)}" for j, p in enumerate(parts))
        raise MismatchError(f"rank {_core.rank()}: {what}: ranks passed different shapes ({detail})")


def allreduce(array: np.ndarray, op: ReduceOp, name: str | None) -> np.ndarray:
    """Average and Sum through the package's allreduce; Min, Max, Product here."""
    if op in (ReduceOp.AVERAGE, ReduceOp.SUM):
        return _core.allreduce(array, name=name, op=op)
    found = _core_function("allreduce")
    if op in _NUMPY_REDUCE:
        try:
            return found(array, name=name, op=op)
        except _core.ConfigError:
            pass  # this build's allreduce has only Average and Sum
        what = f"allreduce({name or ''}, op={op.value})"
        parts = _gather(array, what)
        _same_shapes(parts, what)
        return np.ascontiguousarray(_NUMPY_REDUCE[op](np.stack(parts), axis=0))
    raise UnsupportedInputError(f"rank {_core.rank()}: allreduce op {op!r} is not supported")


def allgather(array: np.ndarray, name: str | None) -> np.ndarray:
    """Concatenate every rank's ``array`` along the first axis (first
    dimensions may differ, the others must match)."""
    found = _core_function("allgather")
    if found is not None:
        return found(array, name=name)
    what = f"allgather({name or ''})"
    if array.ndim == 0:
        raise UnsupportedInputError(f"rank {_core.rank()}: {what} needs a tensor of rank >= 1")
    parts = _gather(array, what)
    tails = {p.shape[1:] for p in parts}
    if len(tails) > 1:
        detail = ", ".join(f"rank {j}: {list(p.shape)}" for j, p in enumerate(parts))
        raise MismatchError(f"rank {_core.rank()}: {what}: shapes differ beyond the first dimension ({detail})")
    return np.concatenate(parts, axis=0)


def reducescatter(array: np.ndarray, op: ReduceOp, name: str | None) -> np.ndarray:
    """Reduce across ranks, then give each rank its block of the first axis
    (the first ``dim % size`` ranks get one row more, as in Horovod)."""
    found = _core_function("reducescatter")
    if found is not None:
        return found(array, op=op, name=name)
    if array.ndim == 0:
        raise UnsupportedInputError(f"rank {_core.rank()}: reducescatter needs a tensor of rank >= 1")
    reduced = allreduce(array, op, name)
    size, me = _core.size(), _core.rank()
    rows = [array.shape[0] // size + (1 if r < array.shape[0] % size else 0) for r in range(size)]
    start = sum(rows[:me])
    return np.ascontiguousarray(reduced[start:start + rows[me]])


def alltoall(array: np.ndarray, splits: np.ndarray | None, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Send block i of the first axis (``splits[i]`` rows, equal blocks by
    default) to rank i; returns what this rank received and the rows from each."""
    found = _core_function("alltoall")
    if found is not None:
        return found(array, splits=splits, name=name)
    size, me = _core.size(), _core.rank()
    what = f"alltoall({name or ''})"
    if array.ndim == 0:
        raise UnsupportedInputError(f"rank {me}: {what} needs a tensor of rank >= 1")
    if splits is None:
        if array.shape[0] % size:
            raise UnsupportedInputError(f"rank {me}: {what}: first dimension {array.shape[0]} is not divisible "
                                        f"by size {size}; pass splits=")
        splits = np.full(size, array.shape[0] // size, dtype=np.int32)
    splits = np.asarray(splits, dtype=np.int64).reshape(-1)
    if splits.size != size or (splits < 0).any() or splits.sum() != array.shape[0]:
        raise UnsupportedInputError(f"rank {me}: {what}: splits {splits.tolist()} must be {size} non-negative "
                                    f"numbers summing to the first dimension {array.shape[0]}")
    blocks = np.split(array, np.cumsum(splits)[:-1], axis=0)
    everyone = _core.allgather_object([np.ascontiguousarray(b) for b in blocks])
    received = [theirs[me] for theirs in everyone]
    if len({b.dtype.str for b in received}) > 1 or len({b.shape[1:] for b in received}) > 1:
        detail = ", ".join(f"rank {j}: {b.dtype.name}{list(b.shape)}" for j, b in enumerate(received))
        raise MismatchError(f"rank {me}: {what}: ranks sent blocks of different dtypes or shapes ({detail})")
    return np.concatenate(received, axis=0), np.array([b.shape[0] for b in received], dtype=np.int32)


def join() -> int:
    """Horovod's ``join``: the package's, where it has one. A barrier would not
    do: a joined rank must keep taking part in the others' collectives."""
    found = _core_function("join")
    if found is None:
        raise ConfigError("join() is not available in this build of hvd_partial (it needs the engine's "
                          "negotiated collectives); make every rank run the same number of steps")
    return found()
