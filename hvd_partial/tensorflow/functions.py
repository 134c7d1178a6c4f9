"""Horovod-style collectives on TensorFlow tensors and variables (synchronous;
every rank calls them in the same order). They work eagerly and inside
``tf.function``, with Horovod's signatures; arguments that only make sense in
Horovod (devices) are accepted at their default values and refused with
``ConfigError`` otherwise. ``process_set=`` runs a collective among the set's
members (:mod:`hvd_partial.collectives.process_sets`): a set that was never
added raises ``ProcessSetError`` (a ``ValueError``) at the call, and on a
rank outside the set the op fails when it runs (``InvalidArgumentError``, as
in Horovod). Gradients are reduced within the set too.

Example::

    import hvd_partial.tensorflow as hvd

    hvd.init()
    hvd.broadcast_variables(model.variables, root_rank=0)
    mean_loss = hvd.allreduce(loss)
    everyone = hvd.allgather(tf.constant([hvd.rank()]))
    evens = hvd.add_process_set([0, 2])
    if evens.included():
        evens_mean = hvd.allreduce(loss, process_set=evens)
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

import hvd_partial as _core
from ..errors import ConfigError, MismatchError, NotSupportedError, UnsupportedInputError
from . import numpy_ops
from .basics import check_usable, global_process_set, require_default, resolve_op
from .compression import Compression
from .exchange import rank_label, source_name


#: graph -> the latest collective op built in it (TF1-style graphs only).
_LATEST_IN_GRAPH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _run(fn, inputs, dtypes, label):
    """``fn`` as a stateful ``tf.numpy_function``. In a TF1-style graph each
    collective gets a control dependency on the one built before it, so that
    every rank runs them in the order its graph built them (ranks build the
    same graph; ``tf.function`` orders stateful ops by itself)."""
    eager = tf.executing_eagerly()

    def checked(*values):
        # Horovod's errors: FailedPreconditionError where ranks disagree,
        # InvalidArgumentError for arguments the op cannot take. Eagerly an
        # OpError raised here keeps its class; in a graph TensorFlow keeps
        # only ValueError's (as InvalidArgumentError) and reports any other
        # exception as UnknownError with its message.
        try:
            return fn(*values)
        except MismatchError as err:
            raise tf.errors.FailedPreconditionError(None, None, f"{type(err).__name__}: {err}") from err
        except ValueError as err:
            if not eager:
                raise
            raise tf.errors.InvalidArgumentError(None, None, f"{type(err).__name__}: {err}") from err

    if tf.executing_eagerly() or tf.inside_function():
        return tf.numpy_function(checked, inputs, dtypes, stateful=True, name=label)
    graph = tf.compat.v1.get_default_graph()
    latest = _LATEST_IN_GRAPH.get(graph)
    with tf.control_dependencies([latest] if latest is not None else []):
        out = tf.numpy_function(checked, inputs, dtypes, stateful=True, name=label)
    _LATEST_IN_GRAPH[graph] = (out[0] if isinstance(out, (list, tuple)) else out).op
    return out


def _with_gradient(inputs: list, forward, backward):
    """``forward(*inputs)`` whose gradient is ``backward(outputs, *output_grads)``,
    Horovod's rule for each collective (a missing output gradient is zeros)."""
    @tf.custom_gradient
    def op(*xs):
        out = forward(*xs)
        outs = out if isinstance(out, (list, tuple)) else [out]

        def grad(*dys):
            dys = [tf.zeros_like(o) if d is None else d for o, d in zip(outs, dys)]
            return backward(outs, *dys)

        return out, grad

    return op(*inputs)


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
    process_set = check_usable(process_set, "allreduce")
    op = resolve_op(op, average, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        # Gathered, not summed: as in Horovod, only Average and Sum, unscaled.
        if op not in (_core.Average, _core.Sum):
            raise NotSupportedError(f"rank {rank_label()}: allreduce of tf.IndexedSlices supports Average and "
                                    f"Sum, got {op!r}")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotSupportedError(f"rank {rank_label()}: allreduce of tf.IndexedSlices takes no prescale_factor "
                                    "or postscale_factor (its values are gathered, not summed)")
        values = allgather(tensor.values, name=name, process_set=process_set)
        indices = allgather(tensor.indices, name=None if name is None else f"{name}.indices", process_set=process_set)
        if op is _core.Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    def forward(x):
        return _scaled_reduction(x, compression, prescale_factor, postscale_factor,
                                 lambda value, pre, post: numpy_ops.allreduce(value, op, name, pre, post,
                                                                              process_set),
                                 "hvd_partial_allreduce", lambda shape: shape)

    def backward(_, dy):  # every rank's output depends on this input: reduce the gradients alike
        return allreduce(dy, op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         process_set=process_set)

    return _with_gradient([tf.convert_to_tensor(tensor)], forward, backward)


def _scaled_reduction(tensor, compression, prescale_factor, postscale_factor, reduce, label, result_shape):
    """Compress ``tensor``, reduce it on the engine with ``reduce(array,
    prescale, postscale)`` (which scales as Horovod does: integers in double
    precision, truncated; float16 in float32), then decompress the result,
    whose static shape is ``result_shape(wire shape)`` (allreduce and
    reducescatter)."""
    tensor = tf.convert_to_tensor(tensor)
    wire, context = compression.compress(tensor)
    pre, post = float(prescale_factor), float(postscale_factor)
    out = _run(lambda value: reduce(np.ascontiguousarray(value), pre, post), [wire], wire.dtype, label)
    out.set_shape(result_shape(wire.shape))
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
    process_set = check_usable(process_set, "grouped_allreduce")
    op = resolve_op(op, average, "grouped_allreduce")
    tensors = list(tensors)
    if not tensors:
        return []
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, op=op, compression=compression, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, name=None if name is None else f"{name}.{i}",
                          process_set=process_set)
                for i, t in enumerate(tensors)]
    pre, post = float(prescale_factor), float(postscale_factor)

    def forward(*inputs):
        wires, contexts = zip(*(compression.compress(t) for t in inputs))

        def run(*values):
            return numpy_ops.grouped_allreduce([np.ascontiguousarray(v) for v in values], op, name, pre, post,
                                               process_set)

        outs = _run(run, list(wires), [w.dtype for w in wires], "hvd_partial_grouped_allreduce")
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        result = []
        for out, wire, context in zip(outs, wires, contexts):
            out.set_shape(wire.shape)
            result.append(compression.decompress(out, context))
        return result

    def backward(_, *dys):
        return grouped_allreduce(list(dys), op=op, prescale_factor=pre, postscale_factor=post,
                                 process_set=process_set)

    return _with_gradient([tf.convert_to_tensor(t) for t in tensors], forward, backward)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along the first axis; first
    dimensions may differ between ranks, the others must match.

    Example::

        labels = hvd.allgather(local_labels)      # (sum of the ranks' rows, ...)
    """
    process_set = check_usable(process_set, "allgather")
    tensor = tf.convert_to_tensor(tensor)

    def forward(x):
        out = _run(lambda value: numpy_ops.allgather(np.ascontiguousarray(value), name, process_set), [x], x.dtype,
                   "hvd_partial_allgather")
        out.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None)
        return out

    def backward(_, dy):
        # Horovod's rule: the averaged gradient of the whole (over the set), cut at this rank's rows.
        reduced = allreduce(dy, op=_core.Average, process_set=process_set)
        rows = allgather(tf.shape(tensor, out_type=tf.int64)[:1], process_set=process_set)
        return tf.split(reduced, rows, num=process_set.size(), axis=0)[process_set.rank()]

    return _with_gradient([tensor], forward, backward)


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
    process_set = check_usable(process_set, "reducescatter")
    op = resolve_op(op, None, "reducescatter")
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ConfigError(f"rank {rank_label()}: reducescatter needs a tensor of rank 1 or more (it splits the first "
                          "axis), got a scalar")

    def forward(x):
        return _scaled_reduction(x, compression, prescale_factor, postscale_factor,
                                 lambda value, pre, post: numpy_ops.reducescatter(value, op, name, pre, post,
                                                                                  process_set),
                                 "hvd_partial_reducescatter",
                                 lambda shape: tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else None)

    def backward(_, dy):
        # Horovod's rule: this rank's block of every member's input got dy here; Sum counts it size times.
        factor = (process_set.size() if op is _core.Sum else 1.0) * prescale_factor * postscale_factor
        return allgather(dy * tf.cast(factor, dy.dtype) if factor != 1.0 else dy, process_set=process_set)

    return _with_gradient([tensor], forward, backward)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=_core.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """:func:`reducescatter` of each tensor of a list."""
    return [reducescatter(t, device_dense=device_dense, compression=compression, op=op, process_set=process_set,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor) for t in tensors]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Send block i of the first axis (``splits[i]`` rows; equal blocks by
    default) to rank i. As in Horovod, returns the received tensor, and with
    ``splits`` given ``(received, received_splits)``.

    Example::

        received = hvd.alltoall(tf.range(4 * hvd.size()))
        received, counts = hvd.alltoall(rows, splits=[1, 3])
    """
    process_set = check_usable(process_set, "alltoall")
    tensor = tf.convert_to_tensor(tensor)
    inputs = [tensor] if splits is None else [tensor, tf.cast(tf.convert_to_tensor(splits), tf.int32)]

    def run(value, *maybe_splits):
        received, counts = numpy_ops.alltoall(np.ascontiguousarray(value),
                                              maybe_splits[0] if maybe_splits else None, name, process_set)
        return received, np.asarray(counts, dtype=np.int32)

    def forward(*xs):
        received, counts = _run(run, list(xs), [tensor.dtype, tf.int32], "hvd_partial_alltoall")
        received.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else None)
        counts.set_shape([None])
        return received, counts

    def backward(outs, d_received, _):
        # The gradient goes back where the rows came from: an alltoall with the received counts.
        grad, _ = alltoall(d_received, splits=outs[1], process_set=process_set)
        return [grad] + [None] * (len(inputs) - 1)

    received, counts = _with_gradient(inputs, forward, backward)
    return received if splits is None else (received, counts)


def join():
    """Horovod's ``join`` (eager): see :func:`hvd_partial.tensorflow.numpy_ops.join`."""
    return numpy_ops.join()


def broadcast(tensor, root_rank: int, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return ``root_rank``'s value of ``tensor`` on every rank.

    Example::

        seed = hvd.broadcast(tf.constant(seed), root_rank=0)
    """
    process_set = check_usable(process_set, "broadcast")
    tensor = tf.convert_to_tensor(tensor)

    def run(value):
        flat = np.ascontiguousarray(value)
        return _core.broadcast(_portable(flat), root_rank, name=name,
                               process_set=process_set).view(flat.dtype).reshape(flat.shape)

    def forward(x):
        out = _run(run, [x], x.dtype, "hvd_partial_broadcast")
        out.set_shape(x.shape)
        return out

    def backward(_, dy):
        # Horovod's rule: the averaged gradient (over the set) on the root, zero elsewhere.
        reduced = allreduce(dy, op=_core.Average, process_set=process_set)
        return reduced if _core.rank() == root_rank else reduced * 0

    return _with_gradient([tensor], forward, backward)


def broadcast_(variables, root_rank: int, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: assign ``root_rank``'s values to ``variables``."""
    process_set = check_usable(process_set, "broadcast_")
    variables = list(variables)
    assigned = _broadcast_assign(variables, root_rank, process_set)
    return variables if tf.executing_eagerly() else assigned


def broadcast_global_variables(root_rank: int):
    """Horovod's TF1 call: broadcast ``tf.compat.v1.global_variables()``.
    Eagerly (TensorFlow 2) it raises ``ConfigError`` as Horovod raises, naming
    the replacement, ``broadcast_variables``."""
    if tf.executing_eagerly():
        raise ConfigError("broadcast_global_variables() does not support eager execution (TensorFlow 2); use "
                          "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_variables(variables, root_rank: int = 0, process_set=global_process_set, inplace: bool = False):
    """Assign ``root_rank``'s values to ``variables`` (tf or Keras variables) on
    every rank, one fused broadcast per dtype. Ranks must pass variables of the
    same shapes and dtypes in the same order, or every rank raises
    ``MismatchError``. Eagerly it returns None; in a TF1-style graph, the op
    that assigns (as Horovod's).

    Example::

        hvd.broadcast_variables(model.weights + optimizer.variables, root_rank=0)
    """
    process_set = check_usable(process_set, "broadcast_variables")
    assigned = _broadcast_assign(list(variables), root_rank, process_set)
    return None if tf.executing_eagerly() else tf.group(*assigned)


def _broadcast_assign(variables: list, root_rank: int, process_set) -> list:
    """Broadcast and assign; the assignments' results, one per variable."""
    if not variables:
        return []
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
            out.append(_core.broadcast(_portable(flat), root_rank, name=f"variables[{names}...]",
                                       process_set=process_set).view(flat.dtype))
        return out

    fused = _run(run, values, dtypes, "hvd_partial_broadcast_variables")
    if not isinstance(fused, (list, tuple)):
        fused = [fused]
    assigned = [None] * len(variables)
    for idx, flat in zip(groups, fused):
        sizes = [int(np.prod(values[i].shape.as_list(), dtype=np.int64)) for i in idx]
        pieces = tf.split(flat, sizes) if len(idx) > 1 else [flat]
        for i, piece in zip(idx, pieces):
            assigned[i] = variables[i].assign(tf.reshape(piece, values[i].shape))
    return assigned


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
    return _core.broadcast_object(obj, root_rank, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session=None, name=None, process_set=global_process_set):
    """Horovod's helper: a function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank``.

    Example::

        bcast = hvd.broadcast_object_fn(root_rank=0)
        epoch = bcast(epoch)
    """
    check_usable(process_set, "broadcast_object_fn")
    return lambda obj: _core.broadcast_object(obj, root_rank, process_set=process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set) -> list:
    """Every rank's picklable ``obj``, in rank order (eager).

    Example::

        digests = hvd.allgather_object(weights_digest)
    """
    return _core.allgather_object(obj, process_set=process_set)
