"""Makes ``model.fit`` flush a ``DistributedOptimizer`` at every epoch end.

Keras gives an optimizer no epoch hook, so the first ``DistributedOptimizer``
created installs a small wrapper around ``keras.callbacks.CallbackList.__init__``:
when ``fit`` builds its callback list (the only caller that passes
``add_history=True``) for a model whose optimizer is a ``DistributedOptimizer``,
an :class:`~hvd_partial.keras.callbacks.FlushCallback` is put first in the list
(unless the user already added one). Every other callback list is left as it
was. If a future Keras changes this constructor, the hook stays out of the way
and ``fit`` still flushes once at the end of training
(``finalize_variable_values``); add ``FlushCallback()`` yourself then.

Example::

    from hvd_partial.keras import fit_hooks
    fit_hooks.install()      # done by DistributedOptimizer(...)
"""

from __future__ import annotations

import functools
import inspect
import logging

import keras

log = logging.getLogger("hvd_partial.keras")

_MARK = "_hvd_partial_epoch_flush"


def install() -> bool:
    """Install the hook once per process; returns whether it is active."""
    cls = keras.callbacks.CallbackList
    original = cls.__init__
    if getattr(original, _MARK, False):
        return True
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = []
    if "add_history" not in names or "model" not in names:
        log.warning("keras.callbacks.CallbackList has an unexpected signature %s: model.fit will flush the "
                    "DistributedOptimizer only at the end of training; add "
                    "hvd_partial.keras.callbacks.FlushCallback() to flush every epoch", names)
        return False

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            bound = inspect.signature(original).bind(self, *args, **kwargs)
        except TypeError:
            return
        if bound.arguments.get("add_history") and bound.arguments.get("model") is not None:
            _attach(self, bound.arguments["model"])

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__
    return True


def _attach(callback_list, model) -> None:
    from .callbacks import FlushCallback
    from .optimizer import DistributedOptimizer

    if not isinstance(getattr(model, "optimizer", None), DistributedOptimizer):
        return
    if any(isinstance(cb, FlushCallback) for cb in callback_list.callbacks):
        return
    flush = FlushCallback()
    flush.set_model(model)
    if getattr(callback_list, "params", None):
        flush.set_params(callback_list.params)
    # First, so that later callbacks (checkpoints, metric averaging) see flushed weights.
    callback_list.callbacks.insert(0, flush)
    from .callbacks import LearningRateGuard

    guard = LearningRateGuard(flush)
    guard.set_model(model)
    if getattr(callback_list, "params", None):
        guard.set_params(callback_list.params)
    # Last: it sees the rate every other callback left before the step.
    callback_list.callbacks.append(guard)
