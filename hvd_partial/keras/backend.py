"""Checks that Keras is Keras 3 running on TensorFlow, the only combination
the Keras adapter supports (the optimizer wrapper runs TensorFlow ops inside
the compiled train step)."""

from __future__ import annotations

import os

from ..errors import ConfigError


class KerasBackendError(ConfigError, ImportError):
    """``hvd_partial.keras`` was imported with a Keras that is not Keras 3 on
    the TensorFlow backend."""


def require_tensorflow_backend() -> None:
    """Raise :class:`KerasBackendError` unless Keras 3 runs on TensorFlow.

    Example::

        require_tensorflow_backend()   # at import of hvd_partial.keras
    """
    try:
        import keras
    except ImportError as err:
        raise KerasBackendError(
            f"hvd_partial.keras needs Keras 3 on the TensorFlow backend, but importing keras failed ({err}; "
            f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '<unset>')!r}); pip install tensorflow and set "
            "KERAS_BACKEND=tensorflow") from err
    version = getattr(keras, "__version__", "0")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    if major < 3:
        raise KerasBackendError(
            f"hvd_partial.keras supports Keras 3 only; found Keras {version} (tf.keras 2 / tf_keras). "
            "Use TensorFlow >= 2.16, which ships Keras 3, or use hvd_partial.tensorflow.DistributedGradientTape")
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise KerasBackendError(
            f"hvd_partial.keras works with the TensorFlow Keras backend only, but Keras runs on {backend!r} "
            f"(KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '<unset>')!r}); set KERAS_BACKEND=tensorflow, "
            "or use hvd_partial.torch for PyTorch")
