"""A reference control plane for the simulator and differential tests (the
product runs only the decentralized one): rank 0's coordinator decides, for every solo and majority stream, when each
round starts and what it sums. Pure: no MPI, no threads, no clocks.

Rank 0's engine runs the single coordinator. Every rank reports its posts and
flushes; the coordinator answers with messages that every rank (itself too)
receives in the same order, so all ranks start the same rounds with the same
facts. Decisions use the exact state of every rank, so the staleness bound and
the quorum hold exactly, and concurrent initiators are deduplicated for free.
Sync streams only register and flush here; their rounds need no decision.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from typing import Callable

from ..errors import EngineError
from ..modes import Mode, RoundFacts, mode_from_description
from ..core.messages import (Closed, Flush, FlushBegun, Goodbye, Post, Register, Registered, Rejected, Start,
                       StreamSignature)


@dataclass
class RankView:
    """The coordinator's view of one rank on one stream."""

    taken: int = 0  # rounds taken (or certain to be taken without computing)
    waiting: bool = False  # a post waits for round ``taken``
    included_seq: int = 0  # last post known to be summed in a round
    # posts reported and not yet known to be in a round: (seq, computed_for)
    pending_posts: deque = field(default_factory=deque)
    flushing: bool = False

    @property
    def pending(self) -> bool:
        return bool(self.pending_posts)

    def include(self, last_seq: int) -> None:
        """Posts up to ``last_seq`` have been summed into a round."""
        self.included_seq = max(self.included_seq, last_seq)
        while self.pending_posts and self.pending_posts[0][0] <= self.included_seq:
            self.pending_posts.popleft()


@dataclass
class StreamState:
    name: str
    id: int
    signature: StreamSignature
    views: list[RankView]
    mode: Mode
    started: int = 0
    completed: int = 0
    # facts kept for the participation report
    initiated: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> bool:
        return self.started > self.completed


class Coordinator:
    """Round decisions for all streams of a world of ``world_size`` ranks.

    Each ``on_*`` method takes one event and returns the messages that every
    rank must receive, in order.

    Example (two ranks, solo, scripted)::

        coord = Coordinator(2)
        out = coord.on_register(Register(0, "g", sig)) + coord.on_register(Register(1, "g", sig))
        # -> [Registered("g", 0), Start(stream=0, round=0, ...)]
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.streams: list[StreamState] = []
        self._by_name: dict[str, int] = {}
        self._registering: dict[str, dict[int, StreamSignature]] = {}
        self._leaving: dict[int, set[int]] = {}
        self.closed = False

    # -- registration ---------------------------------------------------------

    def on_register(self, msg: Register) -> list:
        regs = self._registering.setdefault(msg.name, {})
        regs[msg.rank] = msg.signature
        if len(regs) < self.world_size:
            return []
        del self._registering[msg.name]
        reference = regs[0]
        problems = []
        for rank in range(1, self.world_size):
            diffs = reference.differences(regs[rank])
            if diffs:
                problems.append(f"rank {rank} differs from rank 0 in " + "; ".join(diffs))
        if problems:
            return [Rejected(f"ranks disagree on stream {msg.name!r}: " + " | ".join(problems), name=msg.name)]
        sid = len(self.streams)
        # The first post of every rank is the registration itself: round 0
        # therefore waits for (and sums) every rank's first contribution.
        views = [RankView(taken=0, waiting=True, pending_posts=deque([(1, 0)]))
                 for _ in range(self.world_size)]
        state = StreamState(msg.name, sid, reference, views, mode_from_description(reference.mode),
                            initiated=[0] * self.world_size)
        self.streams.append(state)
        self._by_name[msg.name] = sid
        out: list = [Registered(msg.name, sid)]
        if state.mode.decided:
            out += self._start_round(state, initiator=None, flush=False)
        return out

    def unregistered(self) -> dict[str, list[int]]:
        """Streams some ranks posted and others never did: name -> ranks that did."""
        return {name: sorted(regs) for name, regs in self._registering.items()}

    def reject_unregistered(self) -> list:
        out = []
        for name, ranks in self.unregistered().items():
            missing = sorted(set(range(self.world_size)) - set(ranks))
            out.append(Rejected(f"stream {name!r} was posted on ranks {ranks} "
                                f"but never on ranks {missing} before shutdown", name=name))
        self._registering.clear()
        return out

    # -- events ---------------------------------------------------------------

    def on_post(self, msg: Post) -> list:
        state = self.streams[msg.stream]
        view = state.views[msg.rank]
        if msg.seq > view.included_seq:  # else a round already summed it (the report came late)
            view.pending_posts.append((msg.seq, msg.computed_for))
        view.taken = max(view.taken, msg.taken)
        view.waiting = msg.waiting
        if view.waiting and view.taken < state.completed:
            # The round it waits for already completed here: it takes exactly
            # that round as soon as it completes on its own rank.
            view.taken += 1
            view.waiting = False
        return self._maybe_start(state, trigger=msg.rank) + self._maybe_close()

    def on_flush(self, msg: Flush) -> list:
        state = self.streams[msg.stream]
        view = state.views[msg.rank]
        out: list = []
        if not state.mode.decided and not any(v.flushing for v in state.views):
            # The ranks must all have posted as often (msg.taken rounds): tell
            # them, so that one which posted more fails rather than waits.
            out.append(FlushBegun(state.id, msg.rank, msg.taken))
        view.taken = max(view.taken, msg.taken)
        view.waiting = False
        view.flushing = True
        return out + self._maybe_start(state, trigger=None) + self._maybe_close()

    def on_goodbye(self, msg: Goodbye) -> list:
        """A rank shuts down; once all have, and every flush round has started,
        every rank is told ``Closed``."""
        self._leaving[msg.rank] = set(msg.streams)
        return self._maybe_close()

    def _maybe_close(self) -> list:
        if self.closed or len(self._leaving) < self.world_size:
            return []
        # Every Register a rank will ever send came before its goodbye.
        out = self.reject_unregistered()
        for state in self.streams:
            if any(state.id not in self._leaving[j] for j in range(self.world_size)):
                return out
            if any(v.flushing for v in state.views):
                return out
        self.closed = True
        return out + [Closed()]

    def on_round_complete(self, stream: int, round_number: int, included: dict | None = None) -> list:
        """Rank 0's engine completed ``round_number`` of ``stream``; ``included``
        maps each contributing rank to the last post it summed in the round."""
        state = self.streams[stream]
        if not state.mode.decided:
            return []
        state.completed = round_number + 1
        for rank, last_seq in (included or {}).items():
            state.views[rank].include(last_seq)
        for view in state.views:
            if view.waiting and view.taken == round_number:
                view.taken += 1
                view.waiting = False
        return self._maybe_start(state, trigger=None) + self._maybe_close()

    # -- decisions ------------------------------------------------------------

    def _maybe_start(self, state: StreamState, trigger: int | None) -> list:
        if all(v.flushing for v in state.views):
            if not state.mode.decided:  # a sync stream's flush round: no contributors
                for v in state.views:
                    v.flushing = False
                return [Start(state.id, None, None, flush=True)]
            if state.in_flight:
                return []
            return self._start_round(state, initiator=None, flush=True)
        # The next round may start while rank 0 still completes the previous
        # one (a rank that already took it asks for more): never two ahead.
        if not state.mode.decided or state.started - state.completed > 1:
            return []
        initiator = self._ready(state, trigger)
        if initiator is None:
            return []
        return self._start_round(state, initiator=initiator, flush=False)

    def _ready(self, state: StreamState, trigger: int | None) -> int | None:
        """The initiator of the next round if it may start now, else None."""
        r = state.started
        tau = state.signature.max_staleness
        views = state.views
        training = [j for j, v in enumerate(views) if not v.flushing]
        if state.in_flight:
            # Until round r-1's facts come back, a post reported since it started
            # may or may not be in it; only a post made after taking round r-1
            # is surely still pending. Deciding on those alone keeps every rule exact.
            def pending(v: RankView) -> bool:
                return any(computed_for >= r for _, computed_for in v.pending_posts)
        else:
            def pending(v: RankView) -> bool:
                return v.pending
        for j in training:
            v = views[j]
            if not (v.taken >= r - tau + 1 or pending(v)):
                return None
        return state.mode.choose_initiator(RoundFacts(state.name, r, self.world_size, views, training,
                                                      lambda j: pending(views[j]), trigger))

    def _start_round(self, state: StreamState, initiator: int | None, flush: bool) -> list:
        r = state.started
        lag = []
        for v in state.views:
            lag.append(max(0, r - v.taken))
            # Every post reported so far reached its rank's engine before this
            # message will: it is summed in this round (and maybe later ones too).
            if v.pending_posts:
                v.include(v.pending_posts[-1][0])
            if flush:
                v.flushing = False
                v.taken = r
                v.waiting = True
        state.started += 1
        if initiator is not None:
            state.initiated[initiator] += 1
        return [Start(state.id, r, initiator, flush=flush, lag=tuple(lag))]


COORDINATOR_RANK = 0
# The coordinator's method for each report (looked up on the instance, so that a profiler can wrap it).
_REPORTS = {Register: "on_register", Post: "on_post", Flush: "on_flush", Goodbye: "on_goodbye"}


class CentralControl:  # a ControlPolicy (hvd_partial.core.control)
    """Rank 0 decides every round with the :class:`Coordinator`; every other
    rank reports to it, and it sends each decision to every rank (itself too),
    in the same order to all."""

    def __init__(self, rank: int, size: int, send: Callable[[int, object], None]):
        self.rank = rank
        self.size = size
        self._send = send
        self.coordinator = Coordinator(size) if rank == COORDINATOR_RANK else None

    def report(self, message) -> None:
        """This rank's own event (a registration, flush or goodbye)."""
        self._send(COORDINATOR_RANK, message)

    def posted(self, stream, seq: int, computed_for: int, taken: int, waiting: bool) -> None:
        """This rank posted to ``stream`` (registered)."""
        self._send(COORDINATOR_RANK, Post(self.rank, stream.id, seq, computed_for, taken, waiting))

    def on_message(self, source: int, message) -> None:
        """A peer's report reached this rank."""
        handler = _REPORTS.get(type(message))
        if handler is None or self.coordinator is None:
            raise EngineError(f"rank {self.rank}: unexpected control message from rank {source}: {message!r}")
        self._broadcast(getattr(self.coordinator, handler)(message))

    def decides_completion(self, stream) -> bool:
        """Whether this rank's completion of a round of ``stream`` feeds a decision."""
        return self.coordinator is not None and not stream.sync

    def awaiting_start(self, sid: int, round_number: int) -> bool:
        """Whether this rank joined ``round_number`` of stream ``sid`` before
        hearing that it started (never: rank 0 starts every round)."""
        return False

    def registered(self, stream) -> None:
        """``stream`` got its id here and holds this rank's first post."""

    def fail(self, error: Exception) -> None:
        """This rank failed: decide nothing more."""

    def shutdown_ready(self) -> None:
        """This rank's shutdown is done but for knowing that every rank's is."""

    def park(self) -> None:
        """This rank waits in a call that needs every rank (the coordinator does not track it)."""

    def unpark(self) -> None:
        """The call that parked this rank returned."""

    def take(self, stream) -> None:
        """The rank stream took its completed rounds outside a post."""

    def take_ready(self, stream) -> bool:
        return True

    def round_completed(self, stream, launch, result=None) -> None:
        """This rank completed ``launch`` of ``stream``."""
        if self.coordinator is None or stream.sync or launch.facts is None or launch.facts.round is None:
            return
        self._broadcast(self.coordinator.on_round_complete(stream.id, launch.round, stream.last_included))

    def _broadcast(self, messages) -> None:
        send = self._send
        for message in messages:
            for dest in range(self.size):
                send(dest, message)


def central_control(rank: int, size: int, send, start=None, defer=None, quorum_counters=None) -> CentralControl:
    """A :class:`~hvd_partial.core.driver.Driver`'s ``control`` factory for the reference plane."""
    return CentralControl(rank, size, send)
