"""The numpy-level helper collectives that the TensorFlow functions run in
their ``tf.numpy_function``: the package's negotiated collectives
(:mod:`hvd_partial.collectives`), called with the TensorFlow layer's
arguments (``process_set``: the set's members only).

Example::

    gathered = allgather(np.arange(3.0) * hvd.rank(), name="x")
    evens_sum = allreduce(np.ones(2), hvd.Sum, None, process_set=evens)
"""

from __future__ import annotations

import numpy as np

import hvd_partial as _core
from ..collectives.process_sets import global_process_set
from ..modes import ReduceOp


def allreduce(array: np.ndarray, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set=global_process_set) -> np.ndarray:
    return _core.allreduce(array, name=name, op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce(arrays: list, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set=global_process_set) -> list:
    return list(_core.grouped_allreduce(arrays, name=name, op=op, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, process_set=process_set))


def allgather(array: np.ndarray, name: str | None, process_set=global_process_set) -> np.ndarray:
    return _core.allgather(array, name=name, process_set=process_set)


def reducescatter(array: np.ndarray, op: ReduceOp, name: str | None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, process_set=global_process_set) -> np.ndarray:
    return _core.reducescatter(array, name=name, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, process_set=process_set)


def alltoall(array: np.ndarray, splits, name: str | None,
             process_set=global_process_set) -> tuple[np.ndarray, np.ndarray]:
    return _core.alltoall(array, splits=None if splits is None else np.asarray(splits), name=name,
                          process_set=process_set)


def join() -> int:
    return _core.join()
