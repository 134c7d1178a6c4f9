"""Horovod-style collectives on TensorFlow tensors and variables (synchronous;
every rank calls them in the same order). They work eagerly and inside
``tf.function``.

Example::

    import hvd_partial.tensorflow as hvd

    hvd.init()
    hvd.broadcast_variables(model.variables, root_rank=0)
    mean_loss = hvd.allreduce(loss)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import hvd_partial as _core
from ..errors import UnsupportedInputError
from ..modes import ReduceOp
from .exchange import rank_label, source_name


def allreduce(tensor, op: ReduceOp = _core.Average, name: str | None = None):
    """Synchronous allreduce of ``tensor``; returns a tensor of the same shape
    and dtype (``op=Average`` needs a floating-point tensor).

    Example::

        total = hvd.allreduce(tf.constant([correct, seen], tf.float64), op=hvd.Sum)
    """
    tensor = tf.convert_to_tensor(tensor)

    def run(value):
        return _core.allreduce(np.ascontiguousarray(value), name=name, op=op)

    out = tf.numpy_function(run, [tensor], tensor.dtype, stateful=True, name="hvd_partial_allreduce")
    out.set_shape(tensor.shape)
    return out


def broadcast(tensor, root_rank: int, name: str | None = None):
    """Return ``root_rank``'s value of ``tensor`` on every rank.

    Example::

        seed = hvd.broadcast(tf.constant(seed), root_rank=0)
    """
    tensor = tf.convert_to_tensor(tensor)

    def run(value):
        return _core.broadcast(np.ascontiguousarray(value), root_rank, name=name)

    out = tf.numpy_function(run, [tensor], tensor.dtype, stateful=True, name="hvd_partial_broadcast")
    out.set_shape(tensor.shape)
    return out


def broadcast_variables(variables, root_rank: int = 0) -> None:
    """Assign ``root_rank``'s values to ``variables`` (tf or Keras variables) on
    every rank, one fused broadcast per dtype. Ranks must pass variables of the
    same shapes and dtypes in the same order, or every rank raises
    ``MismatchError``.

    Example::

        hvd.broadcast_variables(model.weights + optimizer.variables, root_rank=0)
    """
    variables = list(variables)
    if not variables:
        return
    values = []
    for var in variables:
        if not hasattr(var, "assign"):
            raise UnsupportedInputError(
                f"rank {rank_label()}: broadcast_variables needs variables, got {type(var).__name__}")
        values.append(tf.convert_to_tensor(var))
    dtypes = []
    for value in values:
        if value.dtype not in dtypes:
            dtypes.append(value.dtype)
    groups = [[i for i, v in enumerate(values) if v.dtype == dtype] for dtype in dtypes]
    names = ",".join(source_name(v) for v in variables[:3])

    def run(*arrays):
        out = []
        for idx in groups:
            flat = np.concatenate([np.ravel(arrays[i]) for i in idx]) if len(idx) > 1 else \
                np.ascontiguousarray(np.ravel(arrays[idx[0]]))
            # numpy has no bfloat16: such variables travel as their raw bits.
            out.append(_core.broadcast(_portable(flat), root_rank, name=f"variables[{names}...]").view(flat.dtype))
        return out

    fused = tf.numpy_function(run, values, dtypes, stateful=True, name="hvd_partial_broadcast_variables")
    if not isinstance(fused, (list, tuple)):
        fused = [fused]
    for idx, flat in zip(groups, fused):
        sizes = [int(np.prod(values[i].shape.as_list(), dtype=np.int64)) for i in idx]
        pieces = tf.split(flat, sizes) if len(idx) > 1 else [flat]
        for i, piece in zip(idx, pieces):
            variables[i].assign(tf.reshape(piece, values[i].shape))


def _portable(array: np.ndarray) -> np.ndarray:
    if array.dtype.name in ("float16", "float32", "float64", "int32", "int64", "uint8", "int8"):
        return array
    if array.dtype == np.bool_:
        return array.view(np.uint8)
    if array.dtype.itemsize in (1, 2, 4, 8):
        # Same bytes, a dtype the engine carries (a broadcast does no arithmetic).
        return array.view({1: np.uint8, 2: np.float16, 4: np.int32, 8: np.int64}[array.dtype.itemsize])
    raise UnsupportedInputError(f"rank {rank_label()}: cannot broadcast a variable of dtype {array.dtype}")


def broadcast_object(obj, root_rank: int = 0):
    """Return ``root_rank``'s picklable ``obj`` on every rank (eager).

    Example::

        epoch = hvd.broadcast_object(epoch, root_rank=0)
    """
    return _core.broadcast_object(obj, root_rank)


def allgather_object(obj) -> list:
    """Every rank's picklable ``obj``, in rank order (eager).

    Example::

        digests = hvd.allgather_object(weights_digest)
    """
    return _core.allgather_object(obj)
