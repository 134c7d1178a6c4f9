"""Liveness: heartbeats to every peer, and the verdict on a peer that has
been silent for ``failure_timeout_seconds``; failure notices to every peer.

Every message from a peer counts as a sign of life. A rank that was itself
stopped (SIGSTOP, swapped out, starved) does not count the time it did not
run against its peers, and when the others give up on it, it is told so.
"""

from __future__ import annotations

import logging
import time

from ..core.messages import Failure, Heartbeat
from ..errors import HvdPartialError, RankFailedError
from ..transport.tags import TAG_FAILURE, TAG_HEARTBEAT

log = logging.getLogger("hvd_partial.engine")

# Seconds between two checks (and observer ticks).
CHECK_SECONDS = 0.01
# A gap this long between two liveness checks means this process itself did
# not run (stopped, swapped out, starved): peers' silence then is no evidence.
_FROZEN_SECONDS = 0.25


class Liveness:
    def __init__(self, transport, rank: int, size: int, config):
        self.transport = transport
        self.rank = rank
        self.size = size
        self.config = config
        now = time.monotonic()
        self._last_heard = [now] * size
        self._next_heartbeat = now
        self.next_check = now
        self._last_check = now

    def heard(self, source: int) -> None:
        self._last_heard[source] = time.monotonic()

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float) -> RankFailedError | None:
        """Send heartbeats when due; the failure of a silent peer, if any."""
        self.next_check = now + CHECK_SECONDS
        gap = now - self._last_check
        self._last_check = now
        if gap > _FROZEN_SECONDS:
            # Count only the silence this rank saw while it ran: a rank that was
            # stopped and resumed must not blame the peers it could not hear.
            self._last_heard = [min(now, heard + gap) for heard in self._last_heard]
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_seconds
            for dest in range(self.size):
                if dest != self.rank:
                    self.transport.send(dest, TAG_HEARTBEAT, Heartbeat(self.rank))
        limit = self.config.failure_timeout_seconds
        for peer, heard in enumerate(self._last_heard):
            if peer != self.rank and now - heard > limit:
                return RankFailedError(peer, f"no message from it for {now - heard:.1f} s "
                                             f"(failure_timeout_seconds={limit:g}): it died, hung or was stopped")
        return None

    def failure_notice(self, source: int, notice: Failure) -> RankFailedError:
        """The error a failure notice from ``source`` means on this rank."""
        if notice.rank == self.rank:  # the others gave up on this rank (it was stopped, say)
            return RankFailedError(self.rank, f"declared failed by rank {source}: {notice.reason}")
        return RankFailedError(notice.rank, notice.reason)

    def notify(self, error: HvdPartialError) -> None:
        """Tell every peer about ``error`` (best effort)."""
        reason = getattr(error, "reason", str(error))
        origin = getattr(error, "rank", self.rank)
        if not isinstance(error, RankFailedError) or error.rank is None:
            origin = self.rank
        # The accused rank is told too: if it was only stopped, it learns on
        # resuming that it is the one that failed instead of blaming a peer.
        for dest in range(self.size):
            if dest != self.rank:
                try:
                    self.transport.send(dest, TAG_FAILURE, Failure(origin, reason))
                except Exception:  # noqa: BLE001 - best effort towards a broken peer
                    pass

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
