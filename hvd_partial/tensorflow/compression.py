"""Gradient compression for the TensorFlow and Keras adapters (Horovod's names).

A compressor decides the dtype a gradient travels in; results are cast back
to the variable's dtype before they are applied.

Example::

    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(), compression=hvd.Compression.fp16)
"""

from __future__ import annotations

import tensorflow as tf


class Compressor:
    """Base compressor: gradients travel in their own dtype."""

    #: Name stored in a saved model's optimizer config.
    name = "none"

    def wire_dtype(self, dtype: tf.DType) -> tf.DType:
        """The dtype a gradient of ``dtype`` is reduced in."""
        return dtype

    def compress(self, tensor):
        """Horovod's interface: returns ``(tensor_on_the_wire, context)``."""
        wire = self.wire_dtype(tensor.dtype)
        return (tensor if wire == tensor.dtype else tf.cast(tensor, wire)), tensor.dtype

    def decompress(self, tensor, context):
        """Horovod's interface: cast ``tensor`` back to the dtype in ``context``."""
        return tensor if tensor.dtype == context else tf.cast(tensor, context)

    def __repr__(self) -> str:
        return f"hvd_partial.Compression.{self.name}"


class NoneCompressor(Compressor):
    """No compression (the default)."""


class FP16Compressor(Compressor):
    """float32 and float64 gradients travel as float16 (half the bytes; the
    sum is computed in float16, so very large gradients can overflow)."""

    name = "fp16"

    def wire_dtype(self, dtype: tf.DType) -> tf.DType:
        return tf.float16 if dtype in (tf.float32, tf.float64) else dtype


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``.

    Example::

        hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
    """

    none = NoneCompressor()
    fp16 = FP16Compressor()

    @staticmethod
    def by_name(name: str) -> Compressor:
        """The compressor saved as ``name`` (``"none"`` or ``"fp16"``)."""
        for compressor in (Compression.none, Compression.fp16):
            if compressor.name == name:
                return compressor
        raise ValueError(f"unknown compression {name!r}: expected 'none' or 'fp16'")
