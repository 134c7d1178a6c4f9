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


def allreduce(array: np.ndarray, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> np.ndarray:
    return _core.allreduce(array, name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor)


def grouped_allreduce(arrays: list, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list:
    return list(_core.grouped_allreduce(arrays, name=name, op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor))


def allgather(array: np.ndarray, name: str | None) -> np.ndarray:
    return _core.allgather(array, name=name)


def reducescatter(array: np.ndarray, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    return _core.reducescatter(array, name=name, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor)


def alltoall(array: np.ndarray, splits, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    return _core.alltoall(array, splits=None if splits is None else np.asarray(splits), name=name)


def join() -> int:
    return _core.join()
