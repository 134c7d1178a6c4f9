"""Liveness without all-to-all: ring heartbeats, and failure notices flooded
over the hypercube.

The engine's side of the design proved in
:class:`hvd_partial.core.decentral.liveness.RingLiveness` (see
docs/control-plane.md, "Liveness"):

- every ``heartbeat_seconds`` a rank sends one ``Heartbeat`` to its ring
  successor ``(rank + 1) % P`` and watches only its predecessor; any message
  from the predecessor (a protocol message, a status) counts as life too;
- when the predecessor has been silent for ``failure_timeout_seconds`` of this
  rank's own running time, this rank (the reporter) names it: the
  ``Failure`` notice goes to the accused rank itself (if it was only stopped,
  it learns on resuming that it is the one declared failed) and is flooded:
  on first hearing, a rank passes it on to its hypercube neighbours, to the
  accused rank's neighbours when the accused is one of its own (so that no
  path needs it), and to its next live ring successor (so that the news also
  goes around the ring when several ranks are gone). A local error (a rank
  that raised, a crash) is flooded the same way from the rank where it arose.

Per rank and period: one heartbeat sent, one received. Per failure: at most
``2 * ceil(log2 P) + 2`` notices sent by each rank (the reporter's one to the
accused included), whatever P is.

Differences from ``RingLiveness``, because an engine stops at its first
failure: a heartbeat carries no failure (a failed engine sends none), and
the successor is told instead. A rank that was itself stopped (SIGSTOP,
swapped out, starved) does not count the time it did not run against its
predecessor: a gap of more than ``_FROZEN_SECONDS`` between two of its own
checks moves the predecessor's silence clock on by that gap.
"""

from __future__ import annotations

import logging
import time

from ..core.activation import hypercube_neighbours
from ..core.messages import Failure, Heartbeat
from ..errors import HvdPartialError, RankFailedError
from ..transport.tags import TAG_FAILURE, TAG_HEARTBEAT

log = logging.getLogger("hvd_partial.engine")

# Seconds between two checks (and observer ticks).
CHECK_SECONDS = 0.01
# A gap this long between two liveness checks means this process itself did
# not run (stopped, swapped out, starved): peers' silence then is no evidence.
_FROZEN_SECONDS = 0.25


def flood_targets(rank: int, size: int, failed: int, source: int | None) -> list[int]:
    """Where ``rank`` passes on, on first hearing, a notice that ``failed``
    failed, received from ``source`` (None: it arose here)."""
    targets = set(hypercube_neighbours(rank, size))
    if failed in targets:  # route around it: its neighbours may have no other path
        targets.update(hypercube_neighbours(failed, size))
    successor = (rank + 1) % size
    if successor == failed:
        successor = (successor + 1) % size
    targets.add(successor)
    targets -= {rank, failed, source}
    return sorted(targets)


class Liveness:
    """One engine's heartbeats, its watch on its ring predecessor, and the
    failure flood. ``transport.send(dest, tag, message)`` is all it needs."""

    def __init__(self, transport, rank: int, size: int, config):
        self.transport = transport
        self.rank = rank
        self.size = size
        self.config = config
        ring = size > 1
        self.successor = (rank + 1) % size if ring else None
        self.predecessor = (rank - 1) % size if ring else None
        now = time.monotonic()
        self._last_heard = now  # from the predecessor
        self._next_heartbeat = now
        self.next_check = now
        self._last_check = now
        self._passed_on: set[int] = set()  # ranks whose failure notice this rank has flooded

    def heard(self, source: int) -> None:
        """A message from ``source`` arrived: life, if it is the predecessor."""
        if source == self.predecessor:
            self._last_heard = time.monotonic()

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float) -> RankFailedError | None:
        """Send the heartbeat when due; the predecessor's failure, if it has
        been silent too long (the caller then floods it with :meth:`notify`)."""
        self.next_check = now + CHECK_SECONDS
        gap = now - self._last_check
        self._last_check = now
        if gap > _FROZEN_SECONDS:
            # Count only the silence this rank saw while it ran: a rank that was
            # stopped and resumed must not blame the predecessor it could not hear.
            self._last_heard = min(now, self._last_heard + gap)
        if self.successor is None:
            return None
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_seconds
            self.transport.send(self.successor, TAG_HEARTBEAT, Heartbeat(self.rank))
        limit = self.config.failure_timeout_seconds
        silent = now - self._last_heard
        if silent > limit:
            return RankFailedError(self.predecessor, f"no message from it for {silent:.1f} s "
                                                     f"(failure_timeout_seconds={limit:g}): it died, hung or "
                                                     f"was stopped")
        return None

    def failure_notice(self, source: int, notice: Failure) -> RankFailedError:
        """The error a failure notice from ``source`` means on this rank; the
        notice is passed on the first time (the flood)."""
        if notice.rank == self.rank:  # the others gave up on this rank (it was stopped, say)
            return RankFailedError(self.rank, f"declared failed by rank {source}: {notice.reason}")
        if notice.rank not in self._passed_on:
            self._passed_on.add(notice.rank)
            self._send_all(flood_targets(self.rank, self.size, notice.rank, source), notice)
        return RankFailedError(notice.rank, notice.reason)

    def notify(self, error: HvdPartialError) -> None:
        """Flood ``error``, which arose on this rank, to every rank (best effort)."""
        if self.size < 2:
            return
        reason = getattr(error, "reason", str(error))
        origin = getattr(error, "rank", self.rank)
        if not isinstance(error, RankFailedError) or error.rank is None:
            origin = self.rank
        self._passed_on.add(origin)
        notice = Failure(origin, reason)
        targets = flood_targets(self.rank, self.size, origin, None)
        if origin != self.rank:
            # The accused is told too: if it was only stopped, it learns on
            # resuming that it is the one that failed instead of blaming a peer.
            targets.append(origin)
        self._send_all(targets, notice)

    def _send_all(self, targets, notice: Failure) -> None:
        for dest in targets:
            try:
                self.transport.send(dest, TAG_FAILURE, notice)
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
