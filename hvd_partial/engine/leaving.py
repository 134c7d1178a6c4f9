"""This rank's shutdown as the engine sees it: who asked, who waits, and
whether its last control messages have left.

The last ones (rank 0's ``Closed``, say) may still be queued in MPI when the
rest of the shutdown is done, and only MPI calls move them: an engine that
stopped then would leave its peers waiting for them. So the engine stops once
they are out, or once a peer has had ``failure_timeout_seconds`` to take them.

Example::

    leaving = Leaving(transport, rank, config.failure_timeout_seconds)
    leaving.requested = True          # compute thread, in Engine.shutdown()
    if driver.left and leaving.last_sends_out():
        leaving.handle.set_result(None)
"""

from __future__ import annotations

import logging
import time

from .handle import Handle

log = logging.getLogger("hvd_partial.engine")


class Leaving:
    """Shutdown state of one engine (``transport``: its :class:`~hvd_partial.transport.protocol.Transport`)."""

    def __init__(self, transport, rank: int, failure_timeout: float):
        self._transport = transport
        self._rank = rank
        self._failure_timeout = failure_timeout
        self.requested = False  # set by the compute thread in Engine.shutdown(): no new calls
        self.handle: Handle | None = None  # what shutdown() waits on, once the engine thread took it
        self._sends_wait_since: float | None = None  # shutdown done but for unsent messages

    def last_sends_out(self) -> bool:
        """True once this rank's control messages have all left, or a peer
        has had ``failure_timeout_seconds`` to take them."""
        outstanding = self._transport.progress_sends()
        if outstanding == 0:
            return True
        now = time.monotonic()
        if self._sends_wait_since is None:
            self._sends_wait_since = now
        waited = now - self._sends_wait_since
        if waited < self._failure_timeout:
            return False
        log.warning("rank %d: %d control messages still unsent after %.1f s at shutdown; stopping without them",
                    self._rank, outstanding, waited)
        return True
