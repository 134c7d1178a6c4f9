"""``hvd.elastic.run``: run a training function again after each world change,
from a state every survivor agrees on.

Each pass: ``state.sync()`` (unless the last interrupt said to skip it), then
``func(state, ...)``. ``HorovodInternalError`` (a helper collective failed or
was refused because the world changed): ``state.restore()``, then reset.
``HostsUpdatedInterrupt``: reset, and skip the next sync if it says so.
Reset: :func:`hvd_partial.acknowledge_world_change`, then ``state.on_reset()``.

``HOROVOD_ELASTIC_RESET_LIMIT`` (Horovod's variable) bounds the resets of one
call: one more raises :class:`ResetLimitError`.

Example::

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(hvd.elastic.TorchState(model, optimizer, epoch=0))
"""

from __future__ import annotations

import functools
import logging
import os

from ..errors import ConfigError, HorovodInternalError, HostsUpdatedInterrupt, HvdPartialError

log = logging.getLogger("hvd_partial.elastic")

RESET_LIMIT_VARIABLE = "HOROVOD_ELASTIC_RESET_LIMIT"


class ResetLimitError(HvdPartialError):
    """``hvd.elastic.run`` reset more often than ``HOROVOD_ELASTIC_RESET_LIMIT`` allows."""


def reset_limit(environ=os.environ) -> int | None:
    """The most resets one ``run`` call may make, or None (no limit)."""
    text = environ.get(RESET_LIMIT_VARIABLE, "").strip()
    if not text:
        return None
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ConfigError(f"{RESET_LIMIT_VARIABLE} must be an integer >= 0, got {text!r}")
    return limit


def run(func):
    """Decorate ``func(state, *args, **kwargs)`` so that it survives world
    changes (see the module docstring)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        limit = reset_limit()
        resets = 0
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as err:
                log.info("elastic run: %s; restoring the last committed state", err)
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                log.info("elastic run: %s", interrupt)
                skip_sync = interrupt.skip_sync
            resets += 1
            if limit is not None and resets > limit:
                raise ResetLimitError(f"hvd.elastic.run: reset {resets} times, more than {RESET_LIMIT_VARIABLE}="
                                      f"{limit} allows")
            state.collectives.acknowledge_world_change()
            state.on_reset()

    return wrapper
