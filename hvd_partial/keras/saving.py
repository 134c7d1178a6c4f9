"""Loading models whose optimizer is (or should become) a ``DistributedOptimizer``.

``model.save(...)`` stores the wrapper with its settings and the inner
optimizer's state; ``keras.models.load_model`` restores it once
``hvd_partial.keras`` is imported (the class is registered as
``hvd_partial>DistributedOptimizer``). :func:`load_model` is Horovod's helper
on top: it can also wrap a plain saved optimizer, or change the settings.

Example::

    import hvd_partial.keras as hvd

    if hvd.rank() == 0:
        model.save("model.keras")
    hvd.barrier()
    model = hvd.load_model("model.keras")                    # as saved
    model = hvd.load_model("plain.keras", mode=hvd.Solo())   # wraps a plain optimizer
"""

from __future__ import annotations

from .backend import require_tensorflow_backend

require_tensorflow_backend()

import keras  # noqa: E402

from .optimizer import DistributedOptimizer  # noqa: E402


def load_model(filepath, custom_objects=None, compile: bool = True, safe_mode: bool = True, **distributed):
    """Load a Keras model; its optimizer comes back as a ``DistributedOptimizer``.

    Keyword arguments in ``distributed`` (``mode``, ``op``, ``compression``,
    ``backward_passes_per_step``, ``max_staleness``, ...) override the saved
    wrapper settings, or are used to wrap a saved plain optimizer. The inner
    optimizer keeps the state that was saved.

    Example::

        model = hvd.load_model("ckpt.keras", mode=hvd.Majority(seed=2))
        model.fit(x, y)   # continues from the saved weights and optimizer state
    """
    model = keras.models.load_model(filepath, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return model
    if isinstance(optimizer, DistributedOptimizer):
        if not distributed:
            return model
        settings = optimizer.get_config()
        settings.pop("optimizer")
        settings.pop("mode"), settings.pop("op"), settings.pop("compression")
        settings.update(mode=optimizer.mode, op=optimizer.op, compression=optimizer.compression)
        settings.update(distributed)
        inner = optimizer.inner_optimizer
    else:
        settings, inner = dict(distributed), optimizer
    model.optimizer = DistributedOptimizer(inner, **settings)
    return model
