"""One rank's side of one solo or majority stream, without a coordinator.

A pure state machine: it consumes events (a post, a flush, a message from
another rank, the completion of a round's reduction with its reduced facts)
and returns actions (:class:`~.messages.Send`, :class:`~.messages.Join`,
:class:`~.messages.Complete`). No MPI, no threads, no clocks.

The rules, for the round ``c`` that this rank would start next (it has
completed round ``c - 1``, so it holds the same :class:`~.facts.RoundView`
of round ``c`` as every other rank, and has not yet heard that ``c`` started):

- Registration (round 0): every rank must post once; the ranks gather
  (binomial convergecast) to rank 0, which starts round 0. The reports carry
  the stream's signature: rank 0 floods :class:`~.messages.Rejected` instead
  when two ranks disagree, and every rank fails with ``MismatchError``.
- Staleness bound: the view names the *blockers*, the training ranks that
  by the facts may have taken fewer than ``c - tau + 1`` rounds. A blocker is
  ready once it has posted for round ``c`` or is flushing; the blockers gather
  to one root (solo: the lowest blocker; majority: the designated
  initiator). This is the catch-up notice: nobody but the root needs to
  learn that a laggard caught up, and the root learns it whether the
  laggard caught up at a post or when a round completed (readiness is
  checked after every event).
- Solo: with no blockers, a rank whose post waits for round ``c`` starts it;
  with blockers, the root starts it once all of them are ready.
- Majority: the designated initiator ``D`` (a pure function of seed, stream
  and round) starts round ``c`` when the staleness gather is complete, it
  holds data (or is flushing: see below), and the quorum holds:
  ``min(k, ranks still training)`` ranks hold data. With a quorum, ranks that
  hold data or began flushing add to a counter at ``D``
  (:mod:`.quorum`); the one whose addition makes the quorum tells ``D`` with
  :class:`~.messages.QuorumMet`, one notice per round.
  A flushing ``D`` stands in for a post: with a quorum it waits for the
  quorum like a holder; without one, when the view shows ``D`` flushing
  and names no blockers, the first rank that holds data starts the round
  itself; with blockers, ``D`` starts it once they caught up; and a ``D``
  that began flushing after the view (nobody knew) starts it at once.
- Flush: the training ranks of the view gather, each once it is flushing, to
  the lowest of them, which then starts round ``c``. A round that every rank
  joined flushing, in the same flush (the facts carry which), is the flush
  round: its reduced facts say so on every rank alike, so all agree on it
  whoever started it, and it sums every pending post. In balanced training
  (see held-back activation below) there is no gather: a flushing rank joins
  round ``c`` at once, as a held-back starter (solo) or an early joiner
  (majority); if someone still trains, ``c`` is no flush round and the next
  round, which is not balanced, gathers as usual.
- Parked (:meth:`DecentralStream.park`): a rank that waits in a call that
  needs every rank, with no post or flush of this stream in progress, is
  ready for any staleness gather, stands in for majority's initiator and
  leaves the quorum, as a flushing rank does; the rounds it joins say so in
  their facts (``PARKED``), so the next view counts it out. Once unparked it
  takes every round it joined parked before computing again
  (:attr:`~DecentralStream.take_ready`); a blocker that took enough rounds so
  is ready at once. A rank whose shutdown flushed the stream (``final``) is
  ``LEFT`` in every later round's facts: it never trains again and is part of
  every later flush round, so a rank that leaves early never holds up the
  others' flushes.
- Starting a round, or hearing of it first, floods :class:`~.messages.Activate`
  over the hypercube (:mod:`hvd_partial.core.activation`); every rank joins
  each round once, with everything it has posted and not yet contributed.
- Held-back activation (``defer_activations``): in balanced training (the
  last round had every rank contributing or was a flush round, nobody is
  flushing and nothing blocks) every rank posts at about the same time, so
  the flood is pure overhead. In solo, a rank whose post starts such a round joins it at once
  but holds its flood back (:class:`~.messages.Defer`). It floods on
  :class:`~.messages.ReleaseActivation` (the host's timer) or as soon as an
  activation of the round reaches it (someone is waiting for it), to the
  neighbours it has not heard from; it drops the flood if the round completes
  here first, since a reduction completes only once every rank joined it, or
  if the host's timer comes with ``everyone_joined`` (the round's facts,
  reduced before its data, completed). A rank that never posts is reached
  one delay later at most.
  Majority does the same at the designated initiator, and every other rank
  whose post waits for such a round joins it early: the designated start is
  certain (its post, its flush or the world's failure), so the early
  joiner's data is where the activation would have put it. With a quorum,
  the designated rank and the early joiners keep their additions to the
  counter back until their delay ends (a round every rank joined by itself
  meets its quorum), and the designated rank floods only once the quorum is
  met (:mod:`.quorum`). An
  early joiner sends nothing until an activation of the round reaches it
  (which can only come from the designated rank's flood), then floods on like
  a held-back starter; ``awaiting_start`` names its round meanwhile, so that
  the host may nap instead of polling a reduction that cannot finish yet.

Example::

    s = DecentralStream(rank=0, world_size=1, kind="solo", max_staleness=2)
    s.post("g0")   # -> [Join(round=0, contributions=["g0"], facts=...)]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ...errors import EngineError, MismatchError, StreamConflictError
from ...modes import DesignatedInitiators
from ..activation import Activation
from ..round_result import RoundResult, any_data
from .facts import FLUSHING, INITIATED, KNOWN_TAKEN, LEFT, PARKED, STALENESS, RoundView, empty_facts, round_facts
from .gather import Gather, position_in_sorted
from .messages import (Activate, Complete, Defer, DesignatedParked, Gathered, Join, QuorumMet, Rejected,
                       ReleaseActivation, Send)
from .quorum import BEGAN_FLUSHING, HOLDS, QUORUM_SLOTS, QuorumCounters, SharedQuorumCounters, quorum_met
from .stats import StreamStats


@dataclass(slots=True)
class _Pending:
    seq: int
    computed_for: int
    payload: object


@dataclass(slots=True)
class _Held:
    """This rank's state of the next round while it is not yet started."""

    view: RoundView
    # the round comes in balanced training (see DecentralStream._balanced): fixed when held, alike on every rank
    balanced: bool = False
    stale: Gather | None = None  # registration or staleness gather
    flush: Gather | None = None  # made on first need (see DecentralStream._flush_gather)
    flush_made: bool = False
    designated: int | None = None
    # majority with a quorum: this rank's additions to the round's counter, and (at the
    # designated initiator) whether the quorum is met
    counted_holds: bool = False
    counted_flushing: bool = False
    quorum_met: bool = False
    # majority: the designated rank is parked (its DesignatedParked notice came, or it is this
    # rank and sent it): a rank that holds data starts the round
    designated_parked: bool = False
    # registration: the signature of the lowest rank heard of, that rank, and a disagreement found
    signature: object = None
    first: int | None = None
    mismatch: tuple | None = None


class DecentralStream:
    """State of one stream on one rank; see the module docstring for the rules.

    ``kind`` is ``"solo"`` or ``"majority"``; ``seed`` and ``quorum`` are
    majority's, and with a quorum on more than one rank, ``counters`` are the
    stream's :class:`~.quorum.QuorumCounters` as this rank sees them.
    """

    def __init__(self, rank: int, world_size: int, kind: str, max_staleness: int, name: str = "stream",
                 seed: int = 0, quorum: int | None = None, signature=None, external_registration: bool = False,
                 posts_need_data: bool = False, defer_activations: bool = False,
                 counters: QuorumCounters | None = None):
        if kind not in ("solo", "majority"):
            raise ValueError(f"decentralized rounds are for solo and majority streams, not {kind!r}")
        self.rank = rank
        self.world_size = world_size
        self.kind = kind
        self.tau = max_staleness
        self.name = name
        self.seed = seed
        self.quorum = quorum
        if quorum is not None and counters is None:
            if world_size > 1:
                raise EngineError(f"rank {rank}: stream {name!r} has a quorum but no quorum counters")
            counters = SharedQuorumCounters().for_rank(rank)(0)
        self.counters = counters
        self.stats = StreamStats()
        # A balanced round joined with a quorum: (round, designated rank, amount, training)
        # of the addition this rank makes only if its activation delay ends first.
        self.deferred_count: tuple | None = None
        # At the designated rank: the balanced round whose flood waits for its quorum.
        self.flood_awaits_quorum: int | None = None
        self.signature = signature  # compared across ranks at registration (equality)
        # Registration agreed by someone else (the driver's registration): no
        # registration gather; round 0 starts at registered().
        self.external_registration = external_registration
        # A round nobody contributed to does not answer a post (the framework adapters
        # expect a post's rounds to bring data): the post waits for the next round.
        self.posts_need_data = posts_need_data
        # Rounds of balanced training flood only if someone needs it (module docstring).
        self.defer_activations = defer_activations
        self.held_back: int | None = None  # the round whose flood this rank holds back
        # Majority: the round this rank joined before hearing of its designated start.
        self.awaiting_start: int | None = None
        # every rank contributed to the last round completed here, or joined it flushing
        # (a flush round: every rank then trains again at about the same time)
        self._last_full = False
        self.activation = Activation(rank, world_size)
        self.pending: list[_Pending] = []
        self.seq = 0
        self.taken = 0
        self.completed = 0
        self.results: deque[RoundResult] = deque()
        self.waiter: tuple[str, int] | None = None  # ("post" | "flush", seq)
        self.flushing = False
        # Waiting in a call that needs every rank, with nothing posted here: like a flushing
        # rank, it stands in for majority's initiator and leaves the quorum, and blocks no round.
        self.parked = False
        self.left = False  # shutdown flushed the stream: this rank posts to it no more
        self._parked_through = -1  # the last round this rank joined parked
        self._parked_notice = -1  # the latest round whose DesignatedParked notice this rank has passed on
        self.flushes = 0  # flush calls made
        self.flushes_done = 0  # flush rounds completed
        self.last_flush_round = -1
        self.failure: Exception | None = None
        self.view = RoundView.registration_view(world_size)
        self.held: _Held | None = None
        self.early: dict[int, list] = {}  # round -> messages for it that came before its view
        self._last_joined = -1
        self._designated_cache = (-1, -1)
        self._initiators = DesignatedInitiators(seed, name, world_size)
        self._only_me = np.array([rank])  # the steady state's majority gather, at its designated rank
        self._flush_results: list = []
        self._hold(self.view)

    # -- compute-thread requests ------------------------------------------------------

    def post(self, payload) -> list:
        """Post a contribution; its ``Complete`` comes now or when a round completes."""
        self._check_idle("post")
        self.parked = False  # (another thread of the rank trains while one waits in a collective)
        self.seq += 1
        self.pending.append(_Pending(self.seq, self.taken, payload))
        out: list = []
        if self.completed > self.taken and (not self.posts_need_data or any_data(self.results)):
            out.append(Complete("post", self.seq, self._take()))
        else:
            self.waiter = ("post", self.seq)
        return out + self._progress()

    def flush(self, final: bool = False) -> list:
        """Stop training until the flush round, which sums every pending post;
        ``final`` (shutdown's flush): this rank posts no more, and takes part
        in every later flush round as well."""
        self._check_idle("flush")
        if self.seq == 0:
            raise StreamConflictError(f"stream {self.name!r}: rank {self.rank} flushed before its first post")
        self.parked = False
        self.left = self.left or final
        self.flushing = True
        self.flushes += 1
        self.waiter = ("flush", self.seq)
        self._flush_results = self._take()
        return self._progress()

    def park(self) -> list:
        """This rank waits in a call that needs every rank (a helper
        collective, another stream's flush): with no post or flush of this
        stream in progress, it blocks no round and stands in for majority's
        initiator until :meth:`unpark`. Rounds completed meanwhile stay to be
        taken: the host applies them before the rank computes again."""
        if self.waiter is not None or self.flushing or self.left or self.failure is not None or self.tau == 0:
            return []  # (tau = 0 is synchronous: every round waits for every rank, parked or not)
        self.parked = True
        return self._progress()

    def unpark(self) -> list:
        """The call that parked this rank returned: it trains again, once it
        took every round it joined parked (:attr:`take_ready`)."""
        self.parked = False
        return []

    @property
    def take_ready(self) -> bool:
        """Every round this rank joined parked has completed here. Its facts
        said it would take them before computing again (it blocked nobody),
        so the host takes them before the rank's next gradient."""
        return self.completed > self._parked_through or self.failure is not None

    def take(self) -> tuple[list, list]:
        """The rounds completed and not yet taken, taken now (none while a
        post or flush waits), and the actions that follow: a blocker that took
        enough rounds so has caught up."""
        if self.waiter is not None:
            return [], []
        results = self._take()
        return results, self._progress(took=bool(results))

    @property
    def stands_in(self) -> bool:
        """This rank starts rounds without posting (flushing, parked or left), as majority's initiator may."""
        return self.flushing or self.parked or self.left

    def _check_idle(self, what: str):
        if self.failure is not None:
            raise self.failure
        if self.waiter is not None:
            raise StreamConflictError(f"stream {self.name!r} already has a {self.waiter[0]} in progress on "
                                      f"rank {self.rank}; cannot {what}")

    # -- engine events ------------------------------------------------------------------

    def on_message(self, source: int, msg) -> list:
        if self.failure is not None:
            return []
        if isinstance(msg, Rejected):
            return [Send(n, msg) for n in self.activation.neighbours if n != source] + self.fail(
                MismatchError(msg.reason))
        if isinstance(msg, Activate):
            first = not self.activation.heard(msg.round)
            sends = self.activation.receive(msg.round, source)
            if not first:
                # a duplicate (concurrent initiators, or a neighbour's copy); if this rank holds
                # the round's flood back, somebody is waiting: flood now
                return self._release(msg.round) if self.held_back == msg.round else []
            return [Send(n, msg) for n in sends] + [self._join(msg.round, initiated=False)] + self._progress()
        if isinstance(msg, ReleaseActivation):
            if self.held_back != msg.round:
                return []
            if msg.everyone_joined:  # nobody needs the flood: drop it before the data completes
                self._drop_flood(msg.round)
                return []
            if self.deferred_count is not None:
                return self._count_deferred(msg.round)
            return self._release(msg.round)
        if type(msg) is DesignatedParked:
            return self._on_designated_parked(source, msg)
        if type(msg) is QuorumMet and msg.round == self.flood_awaits_quorum:
            self.flood_awaits_quorum = None
            return self._release(msg.round) if self.held_back == msg.round else []
        if msg.round <= self.activation.latest:
            return []  # that round started already
        held = self.held
        if held is None or held.view.round != msg.round:
            self.early.setdefault(msg.round, []).append((source, msg))
            return []
        self._apply(held, source, msg)
        return self._progress()

    def registered(self) -> list:
        """Registration was agreed outside this stream (every rank posted once
        and all agree on the stream): every rank joins round 0 on that news."""
        if not self.external_registration or self.activation.latest >= 0:  # pragma: no cover - a caller's bug
            raise EngineError(f"rank {self.rank}: stream {self.name!r} registered twice or by two means")
        self.activation.start(0)  # every rank learns it alike: nothing to flood
        return [self._join(0, initiated=False)] + self._progress()

    def read_facts(self, facts: np.ndarray):
        """``(staleness row, initiator, flush)`` of the next round to complete
        here, from its reduced ``facts`` (changes nothing)."""
        row, initiator, flush = round_facts(facts, self.flushes_done)
        if self.kind == "majority" and self.completed > 0 and not flush:
            # the designated rank, whether it posted or stood in while flushing
            initiator = self._designated(self.completed)
        return row, initiator, flush

    def on_reduced(self, round_number: int, value, facts: np.ndarray, result: RoundResult | None = None) -> list:
        """Round ``round_number`` completed on this rank with the summed
        ``value`` and the reduced ``facts`` (``result``: the round's result,
        when the driver already read it from the facts)."""
        if self.failure is not None:
            return []
        if round_number != self.completed:
            raise EngineError(f"rank {self.rank}: round {round_number} completed, expected {self.completed}")
        if result is None:
            row, initiator, flush = self.read_facts(facts)
            result = RoundResult(round_number, initiator, array=value, flush=flush, staleness_row=row)
        flush = result.flush
        if self.held_back == round_number:  # every rank joined: nobody needed the flood
            self._drop_flood(round_number)
        self._last_full = result.flush or result.contributor_count == self.world_size
        if flush:
            self.flushes_done += 1
            self.last_flush_round = round_number
        self.results.append(result)
        self.completed += 1
        out: list = []
        if self.waiter is not None:
            kind, seq = self.waiter
            if kind == "post":
                if not self.posts_need_data or result.has_data or flush:
                    self.waiter = None
                    out.append(Complete("post", seq, self._take()))
            elif flush:
                self.waiter = None
                self.flushing = False
                out.append(Complete("flush", seq, self._flush_results + self._take()))
        self.view = RoundView.after(round_number, facts, self.tau, self.flushes_done, self.last_flush_round)
        if self.view.round > self.activation.latest:
            self._hold(self.view)
        return out + self._progress()

    def fail(self, error: Exception) -> list:
        """The world failed (a rank died): wake the waiter with ``error``."""
        if self.failure is not None:
            return []
        self.failure = error
        self.held_back = self.awaiting_start = self.deferred_count = self.flood_awaits_quorum = None
        if self.waiter is None:
            return []
        kind, seq = self.waiter
        self.waiter = None
        return [Complete(kind, seq, [], error)]

    # -- the rules ----------------------------------------------------------------------

    def _hold(self, view: RoundView):
        """Set up this rank's part in starting round ``view.round``."""
        held = _Held(view, self._balanced(view))
        me = self.rank
        if view.registration:
            held.stale = Gather.member("register", view.blockers, me, me)
            held.signature, held.first = self.signature, me
        else:
            if self.kind == "majority":
                held.designated = d = self._designated(view.round)
                held.designated_parked = self._parked_notice == view.round
                if not held.balanced:  # (a balanced round is decided by _progress_balanced, with no gather)
                    held.stale = self._majority_gather(view, d)
            elif len(view.blockers):
                held.stale = Gather.member("stale", view.blockers, me, position_in_sorted(view.blockers, me))
        self.held = held
        if self.early:  # (rarely: notices that came before this rank completed the round before)
            for source, msg in self.early.pop(view.round, []):
                self._apply(held, source, msg)
            for r in [r for r in self.early if r <= view.round]:
                del self.early[r]

    def _majority_gather(self, view: RoundView, d: int) -> Gather | None:
        """This rank's part in the staleness gather of a majority round: the
        designated initiator ``d`` first, then the blockers."""
        me = self.rank
        if not len(view.blockers):  # a gather of the designated rank alone
            order, position = self._only_me, 0 if me == d else None
        else:
            others = view.blockers[view.blockers != d]
            order = np.concatenate([np.array([d], dtype=np.int64), others])
            if me == d:
                position = 0
            else:
                p = position_in_sorted(others, me)
                position = None if p is None else p + 1
        gather = Gather.member("stale", order, me, position)
        if gather is not None and position == 0:
            gather.ready = True  # the designated initiator's own conditions are checked apart
        return gather

    def _apply(self, held: _Held, source: int, msg) -> None:
        if isinstance(msg, Gathered):
            gather = held.stale if msg.kind in ("stale", "register") else self._flush_gather(held)
            if gather is None:  # pragma: no cover - a protocol bug
                raise EngineError(f"rank {self.rank}: {msg} for a gather it is not in")
            gather.child_reported(msg.position)
            if msg.kind == "register" and held.mismatch is None:
                if msg.mismatch is not None:
                    held.mismatch = msg.mismatch
                elif msg.signature != held.signature:
                    held.mismatch = (held.first, held.signature, msg.first, msg.signature)
        elif isinstance(msg, QuorumMet):
            held.quorum_met = True
        else:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {self.rank}: unexpected message {msg!r}")

    def _progress(self, took: bool = False) -> list:
        if not self.pending and self.waiter is None and not self.stands_in and not took:
            stale = self.held.stale if self.held is not None else None
            if stale is None or not stale.ready or stale.reported:  # (ready by a take: its gather goes on)
                return []  # (most completions) every gather, notice and start below needs one of these
        held = self.held
        if self.failure is not None or held is None or held.view.round <= self.activation.latest:
            return []  # failed, or the round started here already
        if held.balanced:
            return self._progress_balanced(held)
        view = held.view
        if view.registration and self.external_registration:
            return []
        c = view.round
        holds = bool(self.pending)
        out: list = []
        if held.stale is not None and not held.stale.ready:
            held.stale.ready = holds if view.registration else (
                holds or self.stands_in or self.taken >= c - self.tau + 1)  # (caught up by a take after a park)
        if self.flushing:
            flush = self._flush_gather(held)
            if flush is not None:
                flush.ready = True
        for gather in (held.stale, held.flush):
            if gather is not None and not gather.reported and gather.complete():
                gather.reported = True
                if gather.is_root:
                    if gather.kind == "register" and held.mismatch is not None:
                        return out + self._reject(held.mismatch)
                elif gather.kind == "register":
                    out.append(Send(gather.parent, Gathered(c, gather.kind, gather.position, held.signature,
                                                            held.first, held.mismatch)))
                else:
                    out.append(Send(gather.parent, Gathered(c, gather.kind, gather.position)))
        if self.quorum is not None and held.designated is not None:
            self._count(held, holds, out)
        elif self._parked_designated(held):
            out += self._tell_designated_parked(held)
        if self._may_start(held, holds):
            out += self._start(c, initiated=not view.registration)
        return out

    def _count(self, held: _Held, holds: bool, out: list) -> None:
        """Add this rank's news (it holds data, it began flushing) to the
        round's quorum counter at the designated rank, once each; the one
        addition that makes the quorum tells the designated rank (module
        docstring of :mod:`.quorum`)."""
        amount = self._news(held, holds)
        if amount and self._add(held.view.round, held.designated, amount, held.view.active_count(), out):
            held.quorum_met = True

    def _news(self, held: _Held, holds: bool) -> int:
        """What this rank has not yet added to ``held``'s quorum counter (and now counts as added)."""
        amount = 0
        if holds and not held.counted_holds:
            held.counted_holds = True
            amount = HOLDS
        if self.stands_in and not held.counted_flushing and not held.view.stands_in(self.rank):
            held.counted_flushing = True
            amount += BEGAN_FLUSHING
        return amount

    def _add(self, c: int, d: int, amount: int, training: int, out: list) -> bool:
        """Add ``amount`` to round ``c``'s counter at ``d``; tell ``d`` if this
        addition made the quorum. Returns whether this rank is ``d`` and the quorum is met."""
        before = self.counters.add(d, c % QUORUM_SLOTS, amount)
        self.stats.quorum_additions += 1
        if quorum_met(before + amount, self.quorum, training):
            if d == self.rank:
                return True
            if not quorum_met(before, self.quorum, training):
                self.stats.quorum_notices += 1
                out.append(Send(d, QuorumMet(c)))
        return False

    def _defer_count(self, held: _Held) -> None:
        """Balanced round with a quorum: joining it, keep this rank's addition
        for the end of its activation delay (module docstring of :mod:`.quorum`)."""
        view = held.view
        self.deferred_count = (view.round, held.designated, self._news(held, bool(self.pending)),
                               view.active_count())

    def _count_deferred(self, c: int) -> list:
        """This rank's activation delay of balanced round ``c`` ended before the
        round completed: add what it kept back; the designated rank floods once
        the quorum is met (now, or when the notice comes)."""
        _, d, amount, training = self.deferred_count
        out: list = []
        met = False
        if amount or d == self.rank:
            self.stats.deferred_additions += 1
            met = self._add(c, d, amount, training, out)
        self.deferred_count = None  # (after the addition: a watcher may read it)
        if d != self.rank:
            return out  # an early joiner still floods when the activation reaches it
        if met:
            return self._release(c)
        self.flood_awaits_quorum = c
        return out

    def _flush_gather(self, held: _Held) -> Gather | None:
        """This rank's part in the flush gather of ``held``'s round, made when
        first needed (it flushes, or a report came): most rounds have no flush."""
        if not held.flush_made and not held.view.registration:
            held.flush_made = True
            view, me = held.view, self.rank
            everyone = len(view.training) == self.world_size  # then training is 0..P-1
            held.flush = Gather.member("flush", view.training, me,
                                       me if everyone else position_in_sorted(view.training, me))
        return held.flush

    def _designated(self, round_number: int) -> int:
        """Majority's designated initiator of ``round_number`` (asked twice per round: cached)."""
        cached = self._designated_cache
        if cached[0] != round_number:
            cached = self._designated_cache = (round_number, self._initiators(round_number))
        return cached[1]

    def _reject(self, mismatch: tuple) -> list:
        """Registration found two ranks that disagree: tell everyone, and fail."""
        a, sig_a, b, sig_b = mismatch
        diffs = sig_a.differences(sig_b) if hasattr(sig_a, "differences") else [f"{sig_a!r} vs {sig_b!r}"]
        reason = (f"ranks disagree on stream {self.name!r}: rank {b} differs from rank {a} in "
                  + "; ".join(diffs))
        msg = Rejected(reason)
        return [Send(n, msg) for n in self.activation.neighbours] + self.fail(MismatchError(reason))

    def _may_start(self, held: _Held, holds: bool) -> bool:
        view = held.view
        stale_done = held.stale is not None and held.stale.is_root and held.stale.reported
        if view.registration:
            return stale_done
        if held.flush is not None and held.flush.is_root and held.flush.reported:
            return True  # every rank is flushing: this is the flush round
        if self.kind == "solo":
            if held.stale is None and not len(view.blockers):
                return self.waiter is not None and self.waiter[0] == "post"  # a waiting post starts it
            return stale_done
        d = held.designated
        if d != self.rank:
            # Everyone knows the designated initiator is flushing, and no quorum is set: it stands
            # in for a post, so the first rank to hold data starts the round.
            return (self.quorum is None and (view.stands_in(d) or held.designated_parked)
                    and not len(view.blockers) and holds)
        if not stale_done:
            return False
        if self.quorum is None:
            # newly flushing: nobody else knew to start it (a newly parked one tells them instead)
            if holds or ((self.flushing or self.left) and not view.stands_in(self.rank)):
                return True
            # Known to be flushing: with blockers, they all caught up, by a post (so data exists) or by
            # flushing (each flush allows one such round); without, the holders start it.
            return self.stands_in and len(view.blockers) > 0
        return (holds or self.stands_in) and held.quorum_met

    def _start(self, c: int, initiated: bool) -> list:
        sends = self.activation.start(c)
        return [Send(n, Activate(c)) for n in sends] + [self._join(c, initiated)]

    def _balanced(self, view: RoundView) -> bool:
        """Whether round ``view.round`` comes in balanced training, where
        every rank is about to start or join it too, at a post or a flush.
        Only local state beyond the view: every rank decides alike."""
        return (self.defer_activations and self._last_full and not view.registration and not len(view.blockers)
                and len(view.training) == self.world_size and view.parked is None)

    def _progress_balanced(self, held: _Held) -> list:
        """``_progress`` for a round of balanced training (no blockers, nobody
        flushing in the view): no gather, so the round is started, held back,
        at once by whoever may start it (with a quorum, the designated rank
        once the quorum is met). A flushing rank joins it too, without the
        flush gather."""
        waiter = self.waiter
        out: list = []
        if self.kind == "solo":
            if waiter is None:  # pending data with no post waiting: another rank's round takes it
                return []
            out = self._hold_back(held.view.round)
        else:
            if held.designated == self.rank:
                if not self.pending and not self.stands_in:
                    return out
                if self._parked_designated(held) or (self.parked and self.quorum is not None and not held.quorum_met):
                    # parked, with nothing to post: start nothing; the holders start it (told so,
                    # or, with a quorum, told by the addition that makes it)
                    if self.quorum is None:
                        return self._tell_designated_parked(held)
                    self._count(held, bool(self.pending), out)
                    if not held.quorum_met:
                        return out
                if self.quorum is not None and not self.parked:
                    self._defer_count(held)
                out += self._hold_back(held.view.round)
            elif (waiter is not None and self.pending and waiter[0] == "post" and held.designated_parked
                  and self.quorum is None):
                out += self._hold_back(held.view.round)  # the designated rank is parked: start it, as solo does
            elif waiter is not None and ((self.pending and waiter[0] == "post") or self.flushing):
                if self.quorum is not None:
                    self._defer_count(held)
                    out.append(Defer(held.view.round))
                out += self._join_early(held.view.round)
            else:
                if self.quorum is not None:  # holds data, nobody waits for it: count it now
                    self._count(held, bool(self.pending), out)
                return out
        if self.flushing:
            self.stats.joined_at_flush += 1
        return out

    def _parked_designated(self, held: _Held) -> bool:
        """This rank is the designated initiator, parked with nothing to post,
        and has not yet told the others (majority without a quorum)."""
        return (self.kind == "majority" and self.quorum is None and held.designated == self.rank and self.parked
                and not self.pending and not held.designated_parked and not held.view.stands_in(self.rank))

    def _tell_designated_parked(self, held: _Held) -> list:
        c = held.view.round
        held.designated_parked = True
        self._parked_notice = c
        return [Send(n, DesignatedParked(c)) for n in self.activation.neighbours]

    def _on_designated_parked(self, source: int, msg: DesignatedParked) -> list:
        """The designated rank of ``msg.round`` is parked: pass the notice on
        once, and start the round if this rank holds data for it."""
        c = msg.round
        if c <= self._parked_notice:
            return []
        self._parked_notice = c
        out = [Send(n, msg) for n in self.activation.neighbours if n != source]
        if self.awaiting_start == c:  # joined it early: start it now, flooding on
            return out + self._release(c)
        held = self.held
        if held is not None and held.view.round == c and c > self.activation.latest:
            held.designated_parked = True
            out += self._progress()
        return out

    def _hold_back(self, c: int) -> list:
        self.activation.start_held(c)
        self.held_back = c
        self.stats.floods_held += 1
        return [Defer(c), self._join(c, initiated=True)]

    def _join_early(self, c: int) -> list:
        """Majority: join round ``c`` before its designated rank starts it (see
        the module docstring); flood only once an activation of it arrives."""
        self.activation.start_held(c)
        self.held_back = self.awaiting_start = c
        self.stats.joined_early += 1
        return [self._join(c, initiated=False)]

    def _drop_flood(self, c: int) -> None:
        """Every rank joined round ``c``, held back here: nobody needs its flood."""
        self.held_back = self.deferred_count = self.flood_awaits_quorum = None
        if self.awaiting_start == c:  # an early joiner's: not a flood of its own
            self.awaiting_start = None
        else:
            self.stats.floods_dropped += 1

    def _release(self, c: int) -> list:
        """Flood round ``c``, held back here, to the neighbours not heard from in it."""
        self.held_back = self.deferred_count = None
        if self.awaiting_start == c:  # the activation came: the designated rank started it
            self.awaiting_start = None
        return [Send(n, Activate(c)) for n in self.activation.still_to_tell(c)]

    def _join(self, r: int, initiated: bool) -> Join:
        if r != self._last_joined + 1:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {self.rank}: joins round {r} after {self._last_joined}")
        self._last_joined = r
        if self.held_back is not None and self.held_back < r:
            # someone completed the held round to start this one: every rank joined it
            self._drop_flood(self.held_back)
        if self.quorum is not None and r > 1 and self._initiators(r - 2) == self.rank:
            self.counters.clear((r - 2) % QUORUM_SLOTS)  # round r - 2's counter, here: safe now (see .quorum)
        facts = empty_facts(self.world_size)
        me = self.rank
        items, self.pending = self.pending, []
        if items:
            facts[STALENESS, me] = 1 + r - items[0].computed_for
        waiting = self.waiter is not None and self.waiter[0] == "post"
        facts[KNOWN_TAKEN, me] = self.taken + (1 if waiting else 0)
        facts[FLUSHING, me] = LEFT if self.left else (self.flushes if self.flushing else 0)
        facts[INITIATED, me] = 1 if initiated else 0
        if self.parked:
            facts[PARKED, me] = 1
            self._parked_through = r
        if self.held is not None and self.held.view.round <= r:
            self.held = None
        if self.early:
            for early in [k for k in self.early if k <= r]:  # notices for a round that has started
                del self.early[early]
        return Join(r, [item.payload for item in items], facts)

    def _take(self) -> list:
        out = list(self.results)
        self.results.clear()
        self.taken = self.completed
        return out
