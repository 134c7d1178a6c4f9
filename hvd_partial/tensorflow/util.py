"""Horovod's ``horovod.tensorflow.util`` helper that test files and some
scripts read (``hvd._executing_eagerly()``, ``hvd.util._executing_eagerly()``)."""

from __future__ import annotations

import tensorflow as tf


def executing_eagerly() -> bool:
    """True where the current code runs eagerly (not while a graph is built)."""
    return tf.executing_eagerly()


_executing_eagerly = executing_eagerly  # Horovod's name
