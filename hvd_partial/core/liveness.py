"""Liveness without all-to-all: ring heartbeats, and failure notices flooded
over the hypercube. Pure: no MPI, no threads, no clocks (every time is an
input); the engine (:mod:`hvd_partial.engine.liveness`) and the simulator
(:mod:`hvd_partial.sim.decentral_world`) run this same class.

- Every ``heartbeat_s`` a rank sends one :class:`~.messages.Heartbeat` to its
  ring successor ``(rank + 1) % P`` and watches only its predecessor; any
  message from the predecessor (a protocol message, a status) counts as life
  too (:meth:`Liveness.heard`).
- When the predecessor has been silent for more than ``failure_timeout_s`` of
  this rank's own running time, this rank (the reporter) declares it failed.
  The :class:`~.messages.Failure` notice goes to the accused rank itself (if
  it was only stopped, it learns on resuming that it is the one declared
  failed) and is flooded: on first hearing, a rank passes it on to its
  hypercube neighbours, to the accused rank's neighbours when the accused is
  one of its own (so that no path needs it), and to its next live ring
  successor (so that the news also goes around the ring when several ranks
  are gone). A local error (a rank that raised, a crash) is flooded the same
  way from the rank where it arose (:meth:`Liveness.notify`).
- A rank stops at its first failure: it declares one failure
  (:class:`~.messages.Declared`), then sends no heartbeat and declares
  nothing more; it still passes on, once, a notice it is handed.
- A rank that was itself stopped (SIGSTOP, swapped out, starved) does not
  count the time it did not run against its predecessor: a gap of more than
  ``frozen_s`` between two of its own ticks moves the predecessor's silence
  clock on by that gap.

Per rank and period: one heartbeat sent, one received. Per failure: at most
``2 * ceil(log2 P) + 2`` notices sent by each rank (the reporter's one to the
accused included), and as many received, whatever P is.

Bounds, with ticks at most ``tick_s`` apart and messages delayed at most
``delay_s`` (``failure_timeout_s > heartbeat_s + tick_s + delay_s``): a rank
that dies or is stopped at time ``t`` is declared failed by its successor by
``t + delay_s + failure_timeout_s + tick_s``, and by every live rank at most
``ceil(log2 P)`` message delays later (one failure at a time); a healthy
rank is never declared failed (its heartbeats are never more than
``heartbeat_s + tick_s + delay_s`` apart at the watcher). docs/control-plane.md
("Liveness") has the argument; tests/unit/test_decentral_properties.py and
tests/unit/test_engine_liveness.py check it.

Example::

    live = Liveness(rank=2, size=5, heartbeat_s=1.0, failure_timeout_s=10.0, now=0.0)
    live.tick(0.0)      # -> [Send(3, Heartbeat(2))]
    live.heard(1, 0.5)  # a message from rank 1, its predecessor
    # ticked every 10 ms and nothing more from rank 1: at 10.51 s,
    # [Send(0, Failure(1, "no message from it for 10.0 s ...")), Send(3, ...), Send(1, ...),
    #  Declared(RankFailedError(1, ...))], and nothing after that
"""

from __future__ import annotations

from ..errors import HvdPartialError, RankFailedError
from .activation import hypercube_neighbours
from .messages import Declared, Failure, Heartbeat, Send

# A gap this long between two ticks means the rank itself did not run (the
# engine ticks every 10 ms).
FROZEN_SECONDS = 0.25


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
    """One rank's heartbeats, its watch on its ring predecessor, and its side
    of the failure flood. Inputs: :meth:`heard`, :meth:`tick`,
    :meth:`on_notice`, :meth:`notify`; outputs: ``Send`` and ``Declared``
    actions. ``now`` is the rank's clock (any origin, never going back)."""

    def __init__(self, rank: int, size: int, heartbeat_s: float, failure_timeout_s: float, now: float,
                 frozen_s: float = FROZEN_SECONDS):
        self.rank = rank
        self.size = size
        self.heartbeat_s = heartbeat_s
        self.failure_timeout_s = failure_timeout_s
        self.frozen_s = frozen_s
        ring = size > 1
        self.successor = (rank + 1) % size if ring else None
        self.predecessor = (rank - 1) % size if ring else None
        self._last_heard = now  # from the predecessor
        self._next_heartbeat = now
        self._last_tick = now
        self._passed_on: set[int] = set()  # ranks whose failure notice this rank has flooded
        # The first failure this rank knows of (declared here, told, or its own error): it stops there.
        self.failure: HvdPartialError | None = None

    def heard(self, source: int, now: float) -> None:
        """A message from ``source`` arrived at ``now``: life, if it is the predecessor."""
        if source == self.predecessor:
            self._last_heard = now

    def tick(self, now: float) -> list:
        """The periodic check: the heartbeat when due; if the predecessor has
        been silent too long, the flood of its failure and ``Declared``."""
        if self.failure is not None:
            return []
        gap = now - self._last_tick
        self._last_tick = now
        if gap > self.frozen_s:
            # Count only the silence this rank saw while it ran: a rank that was stopped and
            # resumed must not blame the predecessor it could not hear.
            self._last_heard = min(now, self._last_heard + gap)
        if self.successor is None:
            return []
        out: list = []
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_s
            out.append(Send(self.successor, Heartbeat(self.rank)))
        limit = self.failure_timeout_s
        silent = now - self._last_heard
        if silent > limit:
            error = RankFailedError(self.predecessor, f"no message from it for {silent:.1f} s "
                                                      f"(failure_timeout_seconds={limit:g}): it died, hung or "
                                                      f"was stopped")
            out += self.notify(error)
            out.append(Declared(error))
        return out

    def on_notice(self, source: int, notice: Failure) -> list:
        """A failure notice from ``source``: passed on the first time this rank
        hears of that rank (the flood), then ``Declared`` with the error it
        means here, if it is this rank's first failure."""
        if notice.rank == self.rank:  # the others gave up on this rank (it was stopped, say)
            out: list = []
            error = RankFailedError(self.rank, f"declared failed by rank {source}: {notice.reason}")
        else:
            out = []
            if notice.rank not in self._passed_on:
                self._passed_on.add(notice.rank)
                out = [Send(dest, notice) for dest in flood_targets(self.rank, self.size, notice.rank, source)]
            error = RankFailedError(notice.rank, notice.reason)
        if self.failure is None:
            self.failure = error
            out.append(Declared(error))
        return out

    def notify(self, error: HvdPartialError) -> list:
        """``error`` arose on this rank, which stops: the notices that flood it
        to every rank (none if this rank has flooded that rank's failure already)."""
        if self.failure is None:
            self.failure = error
        if self.size < 2:
            return []
        reason = getattr(error, "reason", str(error))
        origin = getattr(error, "rank", self.rank)
        if not isinstance(error, RankFailedError) or error.rank is None:
            origin = self.rank
        if origin in self._passed_on:
            return []
        self._passed_on.add(origin)
        notice = Failure(origin, reason)
        targets = flood_targets(self.rank, self.size, origin, None)
        if origin != self.rank:
            # The accused is told too: if it was only stopped, it learns on
            # resuming that it is the one that failed instead of blaming a peer.
            targets.append(origin)
        return [Send(dest, notice) for dest in targets]
