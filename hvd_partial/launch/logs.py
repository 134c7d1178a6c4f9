"""Make hvd_partial's INFO messages (the slow-rank report) visible in a
script that configured no logging: Python's last-resort handler prints only
warnings, so ``--verbose`` / ``HVD_PARTIAL_LOG_LEVEL=INFO`` would show nothing.

Example::

    ensure_handler("INFO")      # called by init(); a no-op if logging is configured
"""

from __future__ import annotations

import logging

#: The handler this module attaches (so it is attached once and can be recognized).
_HANDLER_NAME = "hvd_partial.default"


def ensure_handler(level: str, logger_name: str = "hvd_partial") -> logging.Handler | None:
    """If ``level`` is below WARNING and neither the ``hvd_partial`` logger nor
    its ancestors have a handler, attach one that writes to stderr; returns it
    (None when nothing was needed). A handler the user configures later (e.g.
    ``logging.basicConfig``) is not displaced: hvd_partial's records then also
    reach the root's handlers.

    Example::

        ensure_handler("INFO")
    """
    logger = logging.getLogger(logger_name)
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int) or numeric >= logging.WARNING:
        return None
    for handler in logger.handlers:
        if handler.get_name() == _HANDLER_NAME:
            return handler
    if logger.hasHandlers():
        return None
    handler = logging.StreamHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    return handler
