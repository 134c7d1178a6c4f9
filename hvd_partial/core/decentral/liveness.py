"""Liveness without all-to-all: ring heartbeats and a failure flood.

Every ``heartbeat_s`` a rank sends one :class:`~.messages.Heartbeat` to its
successor ``(rank + 1) % P`` and watches only its predecessor. When nothing
has come from the predecessor for more than ``failure_timeout_s`` of the
watcher's own running time, the watcher names it in a
:class:`~.messages.Failed` notice, flooded like an activation: on first
hearing, a rank sends it to its hypercube neighbours and, when the failed
rank is one of them, to the failed rank's neighbours too, so that no path
needs the failed rank. Heartbeats also carry the first failure a rank knows,
so the news goes around the ring when several ranks are gone.

Per rank and period: one heartbeat sent, one received. Per failure: at most
``2 * ceil(log2 P)`` notices sent and received by each rank.

Bounds, with ticks at most ``tick_s`` apart and messages delayed at most
``delay_s`` (``failure_timeout_s > heartbeat_s + tick_s + delay_s``):

- a rank that dies or is stopped at time ``t`` is named by its successor by
  ``t + failure_timeout_s + tick_s + delay_s``, and on every live rank
  ``ceil(log2 P) * delay_s`` later (one failure at a time);
- a healthy rank is never named: its heartbeats are never more than
  ``heartbeat_s + tick_s + delay_s`` apart at the watcher;
- a rank that was itself stopped (or starved) does not blame its healthy
  predecessor: when its own activity has a gap of more than ``pause_s``, it did
  not run in between, and it restarts the predecessor's silence clock
  instead of counting that time against it. Its own activity (ticks and
  messages handled) is the clock.

Example::

    ring = RingLiveness(rank=2, world_size=5, heartbeat_s=1.0, failure_timeout_s=10.0)
    ring.tick(0.0)   # -> [Send(3, Heartbeat(2))]
"""

from __future__ import annotations

from ..activation import hypercube_neighbours
from .messages import Failed, Heartbeat, PeerFailed, Send


class RingLiveness:
    """One rank's side of the ring and the failure flood."""

    def __init__(self, rank: int, world_size: int, heartbeat_s: float, failure_timeout_s: float,
                 pause_s: float | None = None):
        self.rank = rank
        self.world_size = world_size
        self.heartbeat_s = heartbeat_s
        self.failure_timeout_s = failure_timeout_s
        self.pause_s = 2 * heartbeat_s if pause_s is None else pause_s
        ring = world_size > 1
        self.successor = (rank + 1) % world_size if ring else None
        self.predecessor = (rank - 1) % world_size if ring else None
        self.last_heard: float | None = None
        self.last_active: float | None = None  # the last tick or message: when this rank last ran
        self.next_beat: float | None = None
        self.failed: dict[int, Failed] = {}  # failed rank -> the first notice about it
        self.sent = 0
        self.received = 0

    def tick(self, now: float) -> list:
        out: list = []
        self._wake(now)
        if self.successor is not None and (self.next_beat is None or now >= self.next_beat):
            self.next_beat = now + self.heartbeat_s
            first = next(iter(self.failed.values()), None)
            out.append(self._send(self.successor, Heartbeat(self.rank, first)))
        pred = self.predecessor
        if pred is not None and pred not in self.failed and now - self.last_heard > self.failure_timeout_s:
            reason = (f"rank {self.rank} heard nothing from it for {now - self.last_heard:.1f} s "
                      f"(failure_timeout_seconds={self.failure_timeout_s:g}): it died, hung or was stopped")
            out += self._learn(Failed(pred, reason, self.rank), source=None)
        return out

    def on_message(self, now: float, source: int, msg) -> list:
        self.received += 1
        self._wake(now)
        if isinstance(msg, Heartbeat):
            if source == self.predecessor:
                self.last_heard = max(self.last_heard, now)
            return self._learn(msg.failed, source) if msg.failed is not None else []
        if isinstance(msg, Failed):
            return self._learn(msg, source)
        raise TypeError(f"not a liveness message: {msg!r}")  # pragma: no cover

    def _wake(self, now: float) -> None:
        """Every call (tick or message) shows this rank running at ``now``."""
        if self.last_active is not None and now - self.last_active > self.pause_s:
            self.last_heard = now  # this rank did not run: that silence proves nothing about the predecessor
        self.last_active = now
        if self.last_heard is None:
            self.last_heard = now

    def _learn(self, notice: Failed, source: int | None) -> list:
        if notice.rank in self.failed:
            return []
        self.failed[notice.rank] = notice
        P = self.world_size
        targets = set(hypercube_neighbours(self.rank, P))
        if notice.rank in targets:  # route around it: its neighbours may have no other path
            targets.update(hypercube_neighbours(notice.rank, P))
        targets -= {self.rank, notice.rank}
        if source is not None:
            targets.discard(source)
        return [self._send(t, notice) for t in sorted(targets)] + [PeerFailed(notice.rank, notice.reason)]

    def _send(self, dest: int, msg) -> Send:
        self.sent += 1
        return Send(dest, msg)
