"""The numpy-level helper collectives that the TensorFlow functions run in
their ``tf.numpy_function``: the package's negotiated collectives
(:mod:`hvd_partial.collectives`), called with the TensorFlow layer's
arguments.

Example::

    gathered = allgather(np.arange(3.0) * hvd.rank(), name="x")
"""

from __future__ import annotations

import numpy as np

import hvd_partial as _core
from ..modes import ReduceOp


def allreduce(array: np.ndarray, op: ReduceOp, name: str | None) -> np.ndarray:
    return _core.allreduce(array, name=name, op=op)


def grouped_allreduce(arrays: list, op: ReduceOp, name: str | None) -> list:
    return list(_core.grouped_allreduce(arrays, name=name, op=op))


def allgather(array: np.ndarray, name: str | None) -> np.ndarray:
    return _core.allgather(array, name=name)


def reducescatter(array: np.ndarray, op: ReduceOp, name: str | None) -> np.ndarray:
    return _core.reducescatter(array, name=name, op=op)


def alltoall(array: np.ndarray, splits, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    return _core.alltoall(array, splits=None if splits is None else np.asarray(splits), name=name)


def join() -> int:
    return _core.join()
