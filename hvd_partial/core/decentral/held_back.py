"""Held-back activation (``defer_activations``) of the rounds of balanced training.

In balanced training (the last round had every rank contributing or was a
flush round, nobody is flushing or parked and nothing blocks) every rank
posts at about the same time, so the flood is pure overhead. There is no
gather: in solo, a rank whose post starts such a round joins it at once but
holds its flood back (:class:`~.messages.Defer`). It floods on
:class:`~.messages.ReleaseActivation` (the host's timer) or as soon as an
activation of the round reaches it (someone is waiting for it), to the
neighbours it has not heard from; it drops the flood if the round completes
here first, since a reduction completes only once every rank joined it, or
if the host's timer comes with ``everyone_joined`` (the round's facts,
reduced before its data, completed). A rank that never posts is reached one
delay later at most. A flushing rank joins such a round at once, as a
held-back starter (solo) or an early joiner (majority); if someone still
trains, the round is no flush round and the next one, which is not
balanced, gathers as usual.

Majority does the same at the designated initiator, and every other rank
whose post waits for such a round joins it early: the designated start is
certain (its post, its flush or the world's failure), so the early joiner's
data is where the activation would have put it. With a quorum, the
designated rank and the early joiners keep their additions to the counter
back until their delay ends (a round every rank joined by itself meets its
quorum), and the designated rank floods only once the quorum is met
(:mod:`.quorum`). An early joiner sends nothing until an activation of the
round reaches it (which can only come from the designated rank's flood),
then floods on like a held-back starter; :attr:`HeldBack.awaiting_start`
names its round meanwhile, so that the host may nap instead of polling a
reduction that cannot finish yet. Pure.
"""

from __future__ import annotations

from ..activation import Activation
from .facts import RoundView
from .held_round import HeldRound, LocalRank
from .messages import Activate, Defer, ReleaseActivation, Send
from .parking import Parking
from .quorum_tally import QuorumTally
from .stats import StreamStats


class HeldBack:
    """One rank's held-back floods of one stream (``enabled``: the host holds floods back)."""

    __slots__ = ("rank", "world_size", "solo", "enabled", "activation", "stats", "tally", "parking",
                 "held_back", "awaiting_start", "flood_awaits_quorum", "last_full")

    def __init__(self, rank: int, world_size: int, kind: str, enabled: bool, activation: Activation,
                 stats: StreamStats, tally: QuorumTally | None, parking: Parking):
        self.rank = rank
        self.world_size = world_size
        self.solo = kind == "solo"
        self.enabled = enabled
        self.activation = activation
        self.stats = stats
        self.tally = tally
        self.parking = parking
        self.held_back: int | None = None  # the round whose flood this rank holds back
        self.awaiting_start: int | None = None  # majority: the round joined before hearing of its designated start
        self.flood_awaits_quorum: int | None = None  # at the designated rank: the balanced round awaiting its quorum
        # every rank contributed to the last round completed here, or joined it flushing
        # (a flush round: every rank then trains again at about the same time)
        self.last_full = False

    def balanced(self, view: RoundView) -> bool:
        """Whether round ``view.round`` comes in balanced training, where
        every rank is about to start or join it too, at a post or a flush.
        Only local state beyond the view: every rank decides alike."""
        return (self.enabled and self.last_full and not view.registration and not len(view.blockers)
                and len(view.training) == self.world_size and view.parked is None)

    def progress(self, held: HeldRound, local: LocalRank) -> list:
        """The stream's progress in a balanced round: no gather, so the round
        is started, held back, at once by whoever may start it (with a
        quorum, the designated rank once the quorum is met). A flushing rank
        joins it too, without the flush gather."""
        waiter, pending = local.data.waiter, local.data.pending
        c, tally, parking = held.view.round, self.tally, self.parking
        out: list = []
        if self.solo:
            if waiter is None:  # pending data with no post waiting: another rank's round takes it
                return []
            out = self._hold_back(c, local)
        elif held.designated == self.rank:
            if not pending and not local.stands_in:
                return out
            holds = bool(pending)
            if tally is None and parking.parked and not holds and not held.view.stands_in(self.rank):
                # parked, with nothing to post: start nothing, at this park or a later one; the
                # holders start it, told once
                return parking.tell(c) if parking.must_tell(self.rank, holds, held.view) else out
            if parking.parked and tally is not None and not tally.met:
                # with a quorum, the holders are told by the addition that makes it
                tally.count(holds, local.stands_in, out)
                if not tally.met:
                    return out
            if tally is not None and not parking.parked:
                tally.keep_back(holds, local.stands_in)
            out += self._hold_back(c, local)
        elif (waiter is not None and pending and waiter.kind == "post" and parking.designated_parked
              and tally is None):
            out += self._hold_back(c, local)  # the designated rank is parked: start it, as solo does
        elif waiter is not None and ((pending and waiter.kind == "post") or local.flushing):
            if tally is not None:
                tally.keep_back(bool(pending), local.stands_in)
                out.append(Defer(c))
            out += self._join_early(c, local)
        else:
            if tally is not None:  # holds data, nobody waits for it: count it now
                tally.count(bool(pending), local.stands_in, out)
            return out
        if local.flushing:
            self.stats.joined_at_flush += 1
        return out

    def on_release(self, msg: ReleaseActivation) -> list:
        """The host's timer: the activation delay of ``msg.round`` passed."""
        c = msg.round
        if self.held_back != c:
            return []
        if msg.everyone_joined:  # nobody needs the flood: drop it before the data completes
            self.drop(c)
            return []
        tally = self.tally
        if tally is None or tally.deferred is None:
            return self.release(c)
        # the delay ended before the round completed: add what was kept back; the designated rank
        # floods once the quorum is met (now, or when the notice comes)
        out: list = []
        mine, met = tally.add_kept_back(c, out)
        if not mine:
            return out  # an early joiner still floods when the activation reaches it
        if met:
            return self.release(c)
        self.flood_awaits_quorum = c
        return out

    def on_quorum_met(self, c: int) -> list | None:
        """The quorum of ``c`` is met: its flood, if it waited for that (else None)."""
        if c != self.flood_awaits_quorum:
            return None
        self.flood_awaits_quorum = None
        return self.release(c) if self.held_back == c else []

    def on_duplicate(self, c: int) -> list:
        """Another activation of ``c``: somebody waits for it, so a flood held back here goes now."""
        return self.release(c) if self.held_back == c else []

    def joined(self, r: int) -> None:
        """This rank joins round ``r``: someone completed a round held back
        here to start this one, so every rank joined that round."""
        if self.held_back is not None and self.held_back < r:
            self.drop(self.held_back)

    def completed(self, r: int, full: bool) -> None:
        """Round ``r`` completed here (``full``: with every rank's data, or the flush round)."""
        if self.held_back == r:  # every rank joined: nobody needed the flood
            self.drop(r)
        self.last_full = full

    def drop(self, c: int) -> None:
        """Every rank joined round ``c``, held back here: nobody needs its flood."""
        self._forget()
        if self.awaiting_start == c:  # an early joiner's: not a flood of its own
            self.awaiting_start = None
        else:
            self.stats.floods_dropped += 1

    def release(self, c: int) -> list:
        """Flood round ``c``, held back here, to the neighbours not heard from in it."""
        self.held_back = None
        if self.tally is not None:
            self.tally.drop_kept_back()
        if self.awaiting_start == c:  # the activation came: the designated rank started it
            self.awaiting_start = None
        return [Send(n, Activate(c)) for n in self.activation.still_to_tell(c)]

    def fail(self) -> None:
        self._forget()
        self.awaiting_start = None

    def _forget(self) -> None:
        self.held_back = self.flood_awaits_quorum = None
        if self.tally is not None:
            self.tally.drop_kept_back()

    def _hold_back(self, c: int, local: LocalRank) -> list:
        self.activation.start_held(c)
        self.held_back = c
        self.stats.floods_held += 1
        return [Defer(c), local.join(c, initiated=True)]

    def _join_early(self, c: int, local: LocalRank) -> list:
        """Majority: join round ``c`` before its designated rank starts it;
        flood only once an activation of it arrives."""
        self.activation.start_held(c)
        self.held_back = self.awaiting_start = c
        self.stats.joined_early += 1
        return [local.join(c, initiated=False)]
