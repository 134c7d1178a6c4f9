"""Makes ``model.fit`` flush a ``DistributedOptimizer`` at every epoch end.

Keras gives an optimizer no epoch hook, so importing :mod:`hvd_partial.keras`
installs a small wrapper around ``keras.callbacks.CallbackList.__init__``:
when ``fit`` builds its callback list (the only caller that passes
``add_history=True``), ``attach(callback_list, model)`` runs; the one
installed, :func:`hvd_partial.keras.callbacks.attach_epoch_flush`, puts a
:class:`~hvd_partial.keras.callbacks.FlushCallback` first in the list when the
model's optimizer is a ``DistributedOptimizer`` (unless the user already added
one). Every other callback list is left as it was. If a future Keras changes
this constructor, the hook stays out of the way and ``fit`` still flushes once
at the end of training (``finalize_variable_values``); add ``FlushCallback()``
yourself then. This module knows nothing of the optimizer or the callbacks:
they import it, not the other way round.

Example::

    from hvd_partial.keras import callbacks, fit_hooks
    fit_hooks.install(callbacks.attach_epoch_flush)      # done by ``import hvd_partial.keras``
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

import keras

log = logging.getLogger("hvd_partial.keras")

_MARK = "_hvd_partial_epoch_flush"


def install(attach: Callable[[Any, Any], None]) -> bool:
    """Install the hook once per process, calling ``attach(callback_list, model)``
    for every callback list ``fit`` builds; returns whether it is active."""
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
            attach(self, bound.arguments["model"])

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__
    return True
