"""Horovod-style collectives on TensorFlow tensors and variables (synchronous;
every rank calls them in the same order). They work eagerly and inside
``tf.function``, with Horovod's signatures; arguments that only make sense in
Horovod (devices, process sets) are accepted at their default values and
refused with ``ConfigError`` otherwise.

Example::

    import hvd_partial.tensorflow as hvd

    hvd.init()
    hvd.broadcast_variables(model.variables, root_rank=0)
    mean_loss = hvd.allreduce(loss)
    everyone = hvd.allgather(tf.constant([hvd.rank()]))
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import hvd_partial as _core
from ..errors import ConfigError, UnsupportedInputError
from . import numpy_ops
from .basics import global_process_set, require_default, require_global, resolve_op
from .compression import Compression
from .exchange import rank_label, source_name


def _run(fn, inputs, dtypes, label):
    return tf.numpy_function(fn, inputs, dtypes, stateful=True, name=label)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Synchronous allreduce of ``tensor`` (Horovod's signature): ``op`` is
    Average (the default), Sum, Min, Max or Product (``average=True/False``,
    deprecated in Horovod, means Average/Sum). ``prescale_factor`` and
    ``postscale_factor`` multiply before and after the reduction. A
    ``tf.IndexedSlices`` is gathered (values and indices), as in Horovod.

    Example::

        total = hvd.allreduce(tf.constant([correct, seen], tf.float64), op=hvd.Sum)
    """
    require_default("allreduce", device_dense=(device_dense, ""), device_sparse=(device_sparse, ""))
    require_global(process_set, "allreduce")
    op = resolve_op(op, average, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (_core.Average, _core.Sum):
            raise UnsupportedInputError(f"rank {rank_label()}: allreduce of tf.IndexedSlices supports Average and "
                                        f"Sum, got {op!r}")
        values = allgather(tensor.values * prescale_factor if prescale_factor != 1.0 else tensor.values, name=name)
        indices = allgather(tensor.indices, name=None if name is None else f"{name}.indices")
        if op is _core.Average:
            values = values / tf.cast(_core.size(), values.dtype)
        if postscale_factor != 1.0:
            values = values * tf.cast(postscale_factor, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    return _scaled_reduction(tensor, compression, prescale_factor, postscale_factor,
                             lambda value: numpy_ops.allreduce(value, op, name), "hvd_partial_allreduce",
                             lambda shape: shape)


def _scaled_reduction(tensor, compression, prescale_factor, postscale_factor, reduce, label, result_shape):
    """Compress and prescale ``tensor``, reduce it on the engine with
    ``reduce(array)``, then postscale and decompress the result, whose static
    shape is ``result_shape(wire shape)`` (allreduce and reducescatter)."""
    tensor = tf.convert_to_tensor(tensor)
    wire, context = compression.compress(tensor)
    if prescale_factor != 1.0:
        wire = wire * tf.cast(prescale_factor, wire.dtype)
    out = _run(lambda value: reduce(np.ascontiguousarray(value)), [wire], wire.dtype, label)
    out.set_shape(result_shape(wire.shape))
    if postscale_factor != 1.0:
        out = out * tf.cast(postscale_factor, out.dtype)
    return compression.decompress(out, context)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors together (Horovod's signature); returns the
    list of reduced tensors.

    Example::

        w, b = hvd.grouped_allreduce([w_grad, b_grad], op=hvd.Sum)
    """
    require_default("grouped_allreduce", device_dense=(device_dense, ""), device_sparse=(device_sparse, ""))
    require_global(process_set, "grouped_allreduce")
    op = resolve_op(op, average, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, name=None if name is None else f"{name}.{i}")
                for i, t in enumerate(tensors)]
    wires, contexts = [], []
    for t in tensors:
        wire, context = compression.compress(tf.convert_to_tensor(t))
        if prescale_factor != 1.0:
            wire = wire * tf.cast(prescale_factor, wire.dtype)
        wires.append(wire)
        contexts.append(context)

    def run(*values):
        return numpy_ops.grouped_allreduce([np.ascontiguousarray(v) for v in values], op, name)

    outs = _run(run, wires, [w.dtype for w in wires], "hvd_partial_grouped_allreduce")
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    result = []
    for out, wire, context in zip(outs, wires, contexts):
        out.set_shape(wire.shape)
        if postscale_factor != 1.0:
            out = out * tf.cast(postscale_factor, out.dtype)
        result.append(compression.decompress(out, context))
    return result


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along the first axis; first
    dimensions may differ between ranks, the others must match.

    Example::

        labels = hvd.allgather(local_labels)      # (sum of the ranks' rows, ...)
    """
    require_global(process_set, "allgather")
    tensor = tf.convert_to_tensor(tensor)

    def run(value):
        return numpy_ops.allgather(np.ascontiguousarray(value), name)

    out = _run(run, [tensor], tensor.dtype, "hvd_partial_allgather")
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    return out


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """:func:`allgather` of each tensor of a list."""
    return [allgather(t, name=None if name is None else f"{name}.{i}", process_set=process_set)
            for i, t in enumerate(tensors)]


def reducescatter(tensor, device_dense="", compression=Compression.none, op=_core.Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduce ``tensor`` across ranks and give each rank its block of the
    first axis (the first ``dim % size`` ranks get one row more).

    Example::

        mine = hvd.reducescatter(tf.ones([8, 3]), op=hvd.Sum)   # 8 // size rows each
    """
    require_default("reducescatter", device_dense=(device_dense, ""))
    require_global(process_set, "reducescatter")
    op = resolve_op(op, None, "reducescatter")
    return _scaled_reduction(tensor, compression, prescale_factor, postscale_factor,
                             lambda value: numpy_ops.reducescatter(value, op, name), "hvd_partial_reducescatter",
                             lambda shape: tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else None)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=_core.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """:func:`reducescatter` of each tensor of a list."""
    return [reducescatter(t, device_dense=device_dense, compression=compression, op=op, process_set=process_set,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor) for t in tensors]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Send block i of the first axis (``splits[i]`` rows; equal blocks by
    default) to rank i. Returns ``(received, received_splits)`` as in Horovod.

    Example::

        received, counts = hvd.alltoall(tf.range(4 * hvd.size()))
    """
    require_global(process_set, "alltoall")
    tensor = tf.convert_to_tensor(tensor)
    inputs = [tensor] if splits is None else [tensor, tf.cast(tf.convert_to_tensor(splits), tf.int32)]

    def run(value, *maybe_splits):
        received, counts = numpy_ops.alltoall(np.ascontiguousarray(value),
                                              maybe_splits[0] if maybe_splits else None, name)
        return received, np.asarray(counts, dtype=np.int32)

    received, counts = _run(run, inputs, [tensor.dtype, tf.int32], "hvd_partial_alltoall")
    received.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
    counts.set_shape([None])
    return received, counts


def join():
    """Horovod's ``join`` (eager): see :func:`hvd_partial.tensorflow.numpy_ops.join`."""
    return numpy_ops.join()


def broadcast(tensor, root_rank: int, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return ``root_rank``'s value of ``tensor`` on every rank.

    Example::

        seed = hvd.broadcast(tf.constant(seed), root_rank=0)
    """
    require_global(process_set, "broadcast")
    tensor = tf.convert_to_tensor(tensor)

    def run(value):
        flat = np.ascontiguousarray(value)
        return _core.broadcast(_portable(flat), root_rank, name=name).view(flat.dtype).reshape(flat.shape)

    out = _run(run, [tensor], tensor.dtype, "hvd_partial_broadcast")
    out.set_shape(tensor.shape)
    return out


def broadcast_(variables, root_rank: int, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: assign ``root_rank``'s values to ``variables``."""
    require_global(process_set, "broadcast_")
    broadcast_variables(variables, root_rank)
    return variables


def broadcast_global_variables(root_rank: int):
    """Horovod's TF1 call: broadcast ``tf.compat.v1.global_variables()``.
    Eagerly (TensorFlow 2) it raises ``ConfigError`` as Horovod raises, naming
    the replacement, ``broadcast_variables``."""
    if tf.executing_eagerly():
        raise ConfigError("broadcast_global_variables() does not support eager execution (TensorFlow 2); use "
                          "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_variables(variables, root_rank: int = 0, process_set=global_process_set, inplace: bool = False) -> None:
    """Assign ``root_rank``'s values to ``variables`` (tf or Keras variables) on
    every rank, one fused broadcast per dtype. Ranks must pass variables of the
    same shapes and dtypes in the same order, or every rank raises
    ``MismatchError``.

    Example::

        hvd.broadcast_variables(model.weights + optimizer.variables, root_rank=0)
    """
    require_global(process_set, "broadcast_variables")
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


def broadcast_object(obj, root_rank: int = 0, session=None, name=None, process_set=global_process_set):
    """Return ``root_rank``'s picklable ``obj`` on every rank (eager).

    Example::

        epoch = hvd.broadcast_object(epoch, root_rank=0)
    """
    require_global(process_set, "broadcast_object")
    return _core.broadcast_object(obj, root_rank)


def broadcast_object_fn(root_rank: int = 0, session=None, name=None, process_set=global_process_set):
    """Horovod's helper: a function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank``.

    Example::

        bcast = hvd.broadcast_object_fn(root_rank=0)
        epoch = bcast(epoch)
    """
    require_global(process_set, "broadcast_object_fn")
    return lambda obj: _core.broadcast_object(obj, root_rank)


def allgather_object(obj, session=None, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable ``obj``, in rank order (eager).

    Example::

        digests = hvd.allgather_object(weights_digest)
    """
    require_global(process_set, "allgather_object")
    return _core.allgather_object(obj)
