"""The engine's liveness: the I/O around :class:`hvd_partial.core.liveness.Liveness`.

The decisions (ring heartbeats, the watch on the ring predecessor, who gets
a failure notice, which failure this rank declares) are the core's, the
same class the simulator's property tests run (docs/control-plane.md,
"Liveness"). This driver reads the clock, checks every ``CHECK_SECONDS``,
sends the core's messages (a ``Heartbeat`` on ``TAG_HEARTBEAT``, a
``Failure`` notice on ``TAG_FAILURE``, best effort towards a broken peer),
hands the engine the error a declared failure means, and gives the last
notices time to leave before the engine stops.
"""

from __future__ import annotations

import logging
import time

from ..core.liveness import Liveness as _Decisions
from ..core.messages import Failure, Heartbeat, Send
from ..errors import HvdPartialError, RankFailedError
from ..transport.tags import TAG_FAILURE, TAG_HEARTBEAT

log = logging.getLogger("hvd_partial.engine")

# Seconds between two checks (and observer ticks).
CHECK_SECONDS = 0.01


class Liveness:
    """One engine's heartbeats, its watch on its ring predecessor, and the
    failure flood. ``transport.send(dest, tag, message)`` is all it needs."""

    def __init__(self, transport, rank: int, size: int, config):
        self.transport = transport
        # Elastic training: a declared rank is ended and then survived, so notices are not flooded:
        # the accuser ends the silent process (same host) and MPI then reports it to everyone.
        self.elastic = config.elastic
        self.rank = rank
        self.size = size
        self.config = config
        now = time.monotonic()
        self.core = _Decisions(rank, size, config.heartbeat_seconds, config.failure_timeout_seconds, now)
        self.next_check = now
        self._predecessor = self.core.predecessor

    def heard(self, source: int) -> None:
        """A message from ``source`` arrived (called for every message)."""
        if source == self._predecessor:  # the only one that counts: read the clock for it alone
            self.core.heard(source, time.monotonic())

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float) -> RankFailedError | None:
        """Send the heartbeat when due; the predecessor's failure, if it has
        been silent too long (its notices are already out)."""
        self.next_check = now + CHECK_SECONDS
        actions = self.core.tick(now)
        if not self.elastic:
            return self._carry_out(actions)
        for action in actions:
            if type(action) is Send:
                if type(action.message) is Heartbeat:
                    self.transport.send(action.dest, TAG_HEARTBEAT, action.message)
            elif self.transport.end_process(action.error.rank):
                log.warning("rank %d: rank %d stopped answering (%s); ended it, to go on without it",
                            self.rank, action.error.rank, action.error.reason)
            else:  # on another host: nothing here can end it, and a shrink would wait for it
                return action.error
        return None

    def failure_notice(self, source: int, notice: Failure) -> HvdPartialError | None:
        """The error a failure notice from ``source`` means on this rank; the
        notice is passed on the first time (the flood)."""
        if self.elastic and notice.rank != self.rank:
            return None  # the rank that raised or was ended dies; MPI reports it to every survivor
        error = self._carry_out(self.core.on_notice(source, notice))
        # Not this rank's first failure: the engine has stopped on that one already.
        return error if error is not None else self.core.failure

    def notify(self, error: HvdPartialError) -> None:
        """Flood ``error``, which arose on this rank, to every rank (best effort)."""
        self._carry_out(self.core.notify(error))

    def _carry_out(self, actions) -> RankFailedError | None:
        declared = None
        for action in actions:
            if type(action) is Send:
                message = action.message
                if type(message) is Heartbeat:
                    self.transport.send(action.dest, TAG_HEARTBEAT, message)
                else:
                    try:
                        self.transport.send(action.dest, TAG_FAILURE, message)
                    except Exception:  # noqa: BLE001 - best effort towards a broken peer
                        pass
            else:  # Declared
                declared = action.error
        return declared

    def drain_notices(self) -> None:
        """Give the failure notices ``abort_grace_seconds`` to leave, then keep
        whatever is still queued alive for the life of the process."""
        deadline = time.monotonic() + self.config.abort_grace_seconds
        while time.monotonic() < deadline:
            try:
                if self.transport.progress_sends() == 0:
                    return
            except Exception:  # noqa: BLE001 - a dead peer may fail its sends
                break
            time.sleep(0.001)
        self.transport.retain_unfinished_sends()
