"""The collectives of Horovod's Keras module, with its argument order
(``allreduce(value, name, average, ...)``); values may be anything
``tf.constant`` accepts. They return tensors (eager) and run the TensorFlow
adapter's functions.

Example::

    import hvd_partial.keras as hvd

    mean = hvd.allreduce(np.array([loss]), name="loss")
"""

from __future__ import annotations

import tensorflow as tf

import hvd_partial as _core
from ..tensorflow import functions as _tf
from ..tensorflow.compression import Compression


def _value(value, name):
    return value if isinstance(value, (tf.Tensor, tf.Variable)) else tf.constant(value)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Allreduce ``value`` (Average unless ``op``/``average`` say otherwise)."""
    return _tf.allreduce(_value(value, name), average=average, compression=compression, op=op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def allgather(value, name=None):
    """Concatenate every rank's ``value`` along the first axis."""
    return _tf.allgather(_value(value, name), name=name)


def broadcast(value, root_rank, name=None):
    """``root_rank``'s ``value`` on every rank."""
    return _tf.broadcast(_value(value, name), root_rank, name=name)


def reducescatter(value, name=None, op=_core.Average):
    """Reduce ``value`` across ranks; each rank gets its block of the first axis."""
    return _tf.reducescatter(_value(value, name), op=op, name=name)


def broadcast_global_variables(root_rank):
    """Horovod's TF1 call; eagerly (Keras 3) it raises ``ConfigError`` naming
    the replacement (``BroadcastGlobalVariablesCallback`` or ``broadcast_variables``)."""
    return _tf.broadcast_global_variables(root_rank)
