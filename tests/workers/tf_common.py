"""Shared set-up for the TensorFlow / Keras worker scripts: quiet TensorFlow,
one thread per op pool (up to 4 ranks share 2 cores), small models, data and
fingerprints."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # also silences the oneDNN banner
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

from support import digest  # noqa: E402


def mlp(seed: int, inputs: int = 16, hidden: int = 12, classes: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(hidden, activation="tanh"),
                             keras.layers.Dense(classes)])


def classification_data(n: int, inputs: int = 16, classes: int = 3, seed: int = 123):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, inputs)).astype(np.float32)
    y = rng.integers(0, classes, size=n)
    x = centers[y] + 0.8 * rng.normal(size=(n, inputs)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


def interleaved_shard(x, y, rank: int, size: int, batch: int):
    """Rank ``rank``'s rows such that global step t is the concatenation of
    every rank's t-th batch (so a sync run equals one process on batches of
    size * batch, taken in order)."""
    steps = len(x) // (size * batch)
    idx = np.concatenate([np.arange(t * size * batch + rank * batch, t * size * batch + (rank + 1) * batch)
                          for t in range(steps)])
    return x[idx], y[idx]


def state_digest(model, optimizer) -> str:
    arrays = [np.asarray(v) for v in model.weights]
    arrays += [np.asarray(v) for v in optimizer.variables]
    return digest(arrays)


def weights(model) -> list:
    return [np.asarray(v).astype(np.float64) for v in model.weights]


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
