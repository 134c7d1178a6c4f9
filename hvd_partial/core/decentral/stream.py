"""One rank's side of one solo or majority stream, without a coordinator.

A pure state machine that only decides: it consumes events (a post, a
flush, a message from another rank, the completion of a round's reduction
with its reduced facts) and returns actions (:class:`~.messages.Send`,
:class:`~.messages.Join`, :class:`~.messages.Defer`). No MPI, no threads, no
clocks. The rank's posts and results belong to their owner
(:class:`~.held_round.RankData`: the rank's
:class:`~hvd_partial.core.rank_stream.RankStream` in the engine), which the
machine reads and which hears of each event first.

It decides about round ``c``, the one this rank would start next (it has
completed round ``c - 1``, so it holds the same :class:`~.facts.RoundView`
of round ``c`` as every other rank, and has not yet heard that ``c``
started), through parts of its own (registration, round 0, is agreed
outside: :meth:`DecentralStream.registered`):

- :class:`~.held_round.HeldRound`: the round's staleness and flush gathers,
  and the solo, majority and flush rules for starting it;
- :class:`~.quorum_tally.QuorumTally`: majority's quorum (:mod:`.quorum`);
- :class:`~.held_back.HeldBack`: in balanced training, floods held back and
  majority's early joins;
- :class:`~.parking.Parking`: a rank waiting in a call that needs every rank.

Starting a round, or hearing of it first, floods :class:`~.messages.Activate`
over the hypercube (:mod:`hvd_partial.core.activation`); every rank joins
each round once, with everything it has posted and not yet contributed. A
rank whose shutdown flushed the stream (``final``) is ``LEFT`` in every
later round's facts: it never trains again and is part of every later flush
round, so a rank that leaves early never holds up the others' flushes.

Example::

    s = DecentralStream(rank=0, world_size=1, kind="solo", max_staleness=2, data=rank_stream)
    s.post()         # -> []  (rank_stream holds the post; the first waits for registration)
    s.registered()   # -> [Join(round=0, facts=...)]
"""

from __future__ import annotations

import numpy as np

from ...errors import EngineError
from ...modes import DesignatedInitiators
from ..activation import Activation
from ..round_result import RoundResult
from .facts import FLUSHING, INITIATED, KNOWN_TAKEN, LEFT, PARKED, STALENESS, RoundView, empty_facts, round_facts
from .held_back import HeldBack
from .held_round import HeldRound, RankData
from .messages import Activate, DesignatedParked, Gathered, Join, QuorumMet, ReleaseActivation, Send
from .parking import Parking
from .quorum import QuorumCounters, SharedQuorumCounters
from .quorum_tally import QuorumTally
from .stats import StreamStats


class DecentralStream:
    """State of one stream on one rank; see the module docstring for the rules.

    ``kind`` is ``"solo"`` or ``"majority"``; ``seed`` and ``quorum`` are
    majority's, and with a quorum on more than one rank, ``counters`` are the
    stream's :class:`~.quorum.QuorumCounters` as this rank sees them.
    ``data``: this rank's posts, as their owner keeps them.
    ``defer_activations``: the host holds the floods of balanced rounds back.
    """

    def __init__(self, rank: int, world_size: int, kind: str, max_staleness: int, data: RankData,
                 name: str = "stream", seed: int = 0, quorum: int | None = None, defer_activations: bool = False,
                 counters: QuorumCounters | None = None):
        if kind not in ("solo", "majority"):
            raise ValueError(f"decentralized rounds are for solo and majority streams, not {kind!r}")
        self.rank, self.world_size, self.kind, self.tau, self.name = rank, world_size, kind, max_staleness, name
        self.seed, self.quorum, self.data = seed, quorum, data
        self.stats = StreamStats()
        self._defer_activations = defer_activations
        self._build_parts(counters)
        self.completed = 0  # rounds completed here
        self.flushing = False
        self.left = False  # shutdown flushed the stream: this rank posts to it no more
        self.flushes = 0  # flush calls made
        self.flushes_done = 0  # flush rounds completed
        self.last_flush_round = -1
        self.failure: Exception | None = None
        self.view = RoundView.registration_view(world_size)
        self.held: HeldRound | None = None
        self.early: dict[int, list] = {}  # round -> messages for it that came before its view
        self.last_joined = -1
        # The world shrank and this machine is not rebased yet (elastic training): rounds handed
        # over complete here meanwhile, on the old world's numbering, and it decides nothing.
        self.rebasing = False
        self._only_me = np.array([rank])  # the steady state's majority gather, at its designated rank
        self._hold(self.view)

    def _build_parts(self, counters: QuorumCounters | None) -> None:
        """The parts that depend on this rank's place in the world (made anew when it shrinks)."""
        rank, world_size, name = self.rank, self.world_size, self.name
        self._initiators = DesignatedInitiators(self.seed, name, world_size)
        self._designated_cache = (-1, -1)
        if self.quorum is not None and counters is None:
            if world_size > 1:
                raise EngineError(f"rank {rank}: stream {name!r} has a quorum but no quorum counters")
            counters = SharedQuorumCounters().for_rank(rank)(0)
        self.tally = None if self.quorum is None else QuorumTally(rank, self.quorum, counters, self._initiators,
                                                                  self.stats)
        self.activation = Activation(rank, world_size)
        self.parking = Parking(rank, self.activation.neighbours)
        self.floods = HeldBack(rank, world_size, self.kind, self._defer_activations, self.activation, self.stats,
                               self.tally, self.parking)

    def rebase(self, rank: int, world_size: int, last_facts: np.ndarray | None, started: int,
               counters: QuorumCounters | None = None) -> None:
        """The world shrank (elastic training) and every survivor has completed
        the same rounds, ``self.completed`` of them: go on as ``rank`` of
        ``world_size``. ``last_facts``: the facts of the last completed round,
        re-indexed to the new ranks (None before round 0 completed), from which
        every survivor derives the same view of the next round; ``started``:
        the rounds started by some survivor, which every survivor joins
        (:meth:`catch_up`) and which are redone on the new world. Control
        messages in flight were lost with the old communicator: gathers and
        notices begin again from the view."""
        parked, through = self.parking.parked, self.parking.through
        self.rebasing = False
        self.rank, self.world_size = rank, world_size
        self._build_parts(counters)
        self.parking.parked, self.parking.through = parked, through
        self._only_me = np.array([rank])
        self.early = {}
        self.held = None
        if started > 0:
            self.activation.latest = started - 1
        c = self.completed
        if last_facts is None:
            self.view = RoundView.registration_view(world_size)
        else:
            self.view = RoundView.after(c - 1, last_facts, self.tau, self.flushes_done, self.last_flush_round)
        if self.view.round > self.activation.latest:
            self._hold(self.view)

    def catch_up(self, started: int) -> list:
        """Join every round up to ``started - 1`` that a survivor started and this
        rank had not joined yet (after :meth:`rebase`), then decide what comes next."""
        out = [self.join(r, initiated=False) for r in range(self.last_joined + 1, started)]
        return out + self._progress()

    # -- compute-thread requests ------------------------------------------------------

    def post(self) -> list:
        """This rank posted (its data now holds the post, and its waiter, if no round already answered it)."""
        if self.failure is not None:
            raise self.failure
        self.parking.parked = False  # (another thread of the rank trains while one waits in a collective)
        return self._progress()

    def flush(self, final: bool = False) -> list:
        """This rank stops training until the flush round, which sums every
        pending post; ``final`` (shutdown's flush): it posts no more, and takes
        part in every later flush round as well."""
        if self.failure is not None:
            raise self.failure
        self.parking.parked = False
        self.left = self.left or final
        self.flushing = True
        self.flushes += 1
        return self._progress()

    def park(self) -> list:
        """This rank waits in a call that needs every rank (a helper
        collective, another stream's flush): with no post or flush of this
        stream in progress, it blocks no round and stands in for majority's
        initiator until :meth:`unpark`. Rounds completed meanwhile stay to be
        taken: the host applies them before the rank computes again."""
        if self.data.waiter is not None or self.flushing or self.left or self.failure is not None or self.tau == 0:
            return []  # (tau = 0 is synchronous: every round waits for every rank, parked or not)
        self.parking.parked = True
        return self._progress()

    def unpark(self) -> list:
        """The call that parked this rank returned: it trains again, once it
        took every round it joined parked (:attr:`take_ready`)."""
        self.parking.parked = False
        return []

    @property
    def take_ready(self) -> bool:
        """Every round this rank joined parked has completed here. Its facts
        said it would take them before computing again (it blocked nobody),
        so the host takes them before the rank's next gradient."""
        return self.parking.take_ready(self.completed) or self.failure is not None

    def took(self) -> list:
        """This rank took completed rounds outside a post: a blocker that took enough rounds so has caught up."""
        return self._progress(took=True)

    @property
    def stands_in(self) -> bool:
        """This rank starts rounds without posting (flushing, parked or left), as majority's initiator may."""
        return self.flushing or self.parking.parked or self.left

    # -- engine events ------------------------------------------------------------------

    def on_message(self, source: int, msg) -> list:
        if self.failure is not None:
            return []
        kind = type(msg)
        if kind is Activate:
            if self.activation.heard(msg.round):  # a duplicate (concurrent initiators, or a neighbour's copy)
                self.activation.receive(msg.round, source)
                return self.floods.on_duplicate(msg.round)
            sends = self.activation.receive(msg.round, source)
            return [Send(n, msg) for n in sends] + [self.join(msg.round, initiated=False)] + self._progress()
        if kind is DesignatedParked:
            return self._on_designated_parked(source, msg)
        if kind is QuorumMet:
            released = self.floods.on_quorum_met(msg.round)
            if released is not None:
                return released
        if msg.round <= self.activation.latest:
            return []  # that round started already
        held = self.held
        if held is None or held.view.round != msg.round:
            self.early.setdefault(msg.round, []).append((source, msg))
            return []
        self._apply(held, source, msg)
        return self._progress()

    def release_flood(self, round_number: int, everyone_joined: bool = False) -> list:
        """The host's timer: the activation delay of ``round_number`` passed (``everyone_joined``:
        every rank joined it by itself, so its flood is dropped)."""
        if self.failure is not None:
            return []
        return self.floods.on_release(ReleaseActivation(round_number, everyone_joined))

    def registered(self) -> list:
        """Registration was agreed (every rank posted once and all agree on
        the stream: :class:`~.agreement.Agreements`): every rank joins round 0 on that news."""
        if self.activation.latest >= 0:  # pragma: no cover - a caller's bug
            raise EngineError(f"rank {self.rank}: stream {self.name!r} registered twice")
        self.activation.start(0)  # every rank learns it alike: nothing to flood
        return [self.join(0, initiated=False)] + self._progress()

    def read_facts(self, facts: np.ndarray):
        """``(staleness row, initiator, flush)`` of the next round to complete
        here, from its reduced ``facts`` (changes nothing)."""
        row, initiator, flush = round_facts(facts, self.flushes_done)
        if self.kind == "majority" and self.completed > 0 and not flush:
            # the designated rank, whether it posted or stood in while flushing
            initiator = self.designated(self.completed)
        return row, initiator, flush

    def on_reduced(self, round_number: int, facts: np.ndarray, result: RoundResult) -> list:
        """Round ``round_number`` completed on this rank with the reduced
        ``facts``; ``result`` is the round's, read from them (:meth:`read_facts`)."""
        if self.failure is not None:
            return []
        if round_number != self.completed:
            raise EngineError(f"rank {self.rank}: round {round_number} completed, expected {self.completed}")
        flush = result.flush
        self.floods.completed(round_number, flush or result.contributor_count == self.world_size)
        if flush:
            self.flushes_done += 1
            self.last_flush_round = round_number
            self.flushing = False  # (the flush round answers this rank's flush, if any)
        self.completed += 1
        self.view = RoundView.after(round_number, facts, self.tau, self.flushes_done, self.last_flush_round)
        if self.view.round > self.activation.latest:
            self._hold(self.view)
        return self._progress()

    def fail(self, error: Exception) -> None:
        """The world failed (a rank died): decide nothing more (the data's owner wakes its waiter)."""
        if self.failure is None:
            self.failure = error
            self.floods.fail()

    def join(self, r: int, initiated: bool) -> Join:
        """This rank joins round ``r`` with everything posted and not yet contributed: its facts say so."""
        if r != self.last_joined + 1:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {self.rank}: joins round {r} after {self.last_joined}")
        self.last_joined = r
        self.floods.joined(r)
        if self.tally is not None:
            self.tally.joined(r)
        facts = empty_facts(self.world_size)
        me, data = self.rank, self.data
        if data.pending:
            facts[STALENESS, me] = 1 + r - data.pending[0].computed_for
        waiter = data.waiter
        facts[KNOWN_TAKEN, me] = data.taken + (1 if waiter is not None and waiter.kind == "post" else 0)
        facts[FLUSHING, me] = LEFT if self.left else (self.flushes if self.flushing else 0)
        facts[INITIATED, me] = 1 if initiated else 0
        if self.parking.joined(r):
            facts[PARKED, me] = 1
        if self.held is not None and self.held.view.round <= r:
            self.held = None
        if self.early:
            for early in [k for k in self.early if k <= r]:  # notices for a round that has started
                del self.early[early]
        return Join(r, facts)

    # -- the rules ----------------------------------------------------------------------

    def _hold(self, view: RoundView):
        """Set up this rank's part in starting round ``view.round``."""
        designated = None
        if self.kind == "majority" and not view.registration:
            designated = self.designated(view.round)
            self.parking.begin(view.round)
            if self.tally is not None:
                self.tally.begin(view, designated)
        held = self.held = HeldRound(view, self.floods.balanced(view), self.rank, designated, self._only_me)
        if self.early:  # (rarely: notices that came before this rank completed the round before)
            for source, msg in self.early.pop(view.round, []):
                self._apply(held, source, msg)
            for r in [r for r in self.early if r <= view.round]:
                del self.early[r]

    def _apply(self, held: HeldRound, source: int, msg) -> None:
        if type(msg) is Gathered:
            held.apply(msg, self.rank, self.world_size)
        elif type(msg) is QuorumMet and self.tally is not None:
            self.tally.on_notice()
        else:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {self.rank}: unexpected message {msg!r}")

    def _progress(self, took: bool = False) -> list:
        held, data = self.held, self.data
        if not data.pending and data.waiter is None and not self.stands_in and not took:
            stale = held.stale if held is not None else None
            if stale is None or not stale.ready or stale.reported:  # (ready by a take: its gather goes on)
                return []  # (most completions) every gather, notice and start below needs one of these
        if self.failure is not None or self.rebasing or held is None or held.view.round <= self.activation.latest:
            return []  # failed, rebasing, or the round started here already
        if held.balanced:
            return self.floods.progress(held, self)
        view = held.view
        if view.registration:
            return []  # round 0 starts at registered()
        out: list = []
        held.report(self, self.world_size, out)
        holds, d, tally = bool(data.pending), held.designated, self.tally
        if d is not None:
            if tally is not None:
                tally.count(holds, self.stands_in, out)
            elif self.parking.must_tell(d, holds, view):
                out += self.parking.tell(view.round)
        if held.may_start(self, holds, None if tally is None else tally.met, self.parking.designated_parked):
            sends = self.activation.start(view.round)
            out += [Send(n, Activate(view.round)) for n in sends]
            out.append(self.join(view.round, initiated=True))
        return out

    def _on_designated_parked(self, source: int, msg: DesignatedParked) -> list:
        """The designated rank of ``msg.round`` is parked: pass the notice on
        once, and start the round if this rank holds data for it."""
        c = msg.round
        out = self.parking.pass_on(source, msg)
        if out is None:
            return []
        if self.floods.awaiting_start == c:  # joined it early: start it now, flooding on
            return out + self.floods.release(c)
        held = self.held
        if held is not None and held.view.round == c and c > self.activation.latest:
            self.parking.designated_parked = True
            out += self._progress()
        return out

    def designated(self, round_number: int) -> int:
        """Majority's designated initiator of ``round_number`` (asked twice per round: cached)."""
        cached = self._designated_cache
        if cached[0] != round_number:
            cached = self._designated_cache = (round_number, self._initiators(round_number))
        return cached[1]
