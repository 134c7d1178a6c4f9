"""One rank's additions to majority's quorum counters (the rules are in
:mod:`.quorum`): what this rank has added for the round it would start next,
the addition it keeps back for a balanced round, and the one notice to the
designated initiator whose quorum this rank's addition made. Pure: the
counters are the host's :class:`~.quorum.QuorumCounters`.
"""

from __future__ import annotations

from typing import Callable

from .facts import RoundView
from .messages import QuorumMet, Send
from .quorum import BEGAN_FLUSHING, HOLDS, QUORUM_SLOTS, QuorumCounters, quorum_met
from .stats import StreamStats


class QuorumTally:
    """This rank's side of one majority stream's quorum ``quorum``.

    ``initiators(round)`` names each round's designated initiator;
    ``stats`` is the stream's (additions and notices are counted there).
    """

    __slots__ = ("rank", "quorum", "counters", "stats", "_initiators", "_view", "designated",
                 "_counted_holds", "_counted_flushing", "met", "deferred")

    def __init__(self, rank: int, quorum: int, counters: QuorumCounters, initiators: Callable[[int], int],
                 stats: StreamStats):
        self.rank = rank
        self.quorum = quorum
        self.counters = counters
        self.stats = stats
        self._initiators = initiators
        self._view: RoundView | None = None  # the view of the round this rank would start next
        self.designated = -1
        self._counted_holds = False  # this rank added that it holds data for that round
        self._counted_flushing = False  # ... that it began standing in after the view was made
        self.met = False  # at the designated rank: that round's quorum is met
        # A balanced round joined by itself: (round, designated rank, amount, training) of the
        # addition this rank makes only if its activation delay ends first.
        self.deferred: tuple | None = None

    def begin(self, view: RoundView, designated: int) -> None:
        """The next round to start is ``view.round``, designated to ``designated``: nothing added to it yet."""
        self._view, self.designated = view, designated
        self._counted_holds = self._counted_flushing = self.met = False

    def count(self, holds: bool, stands_in: bool, out: list) -> None:
        """Add this rank's news (it holds data, it began standing in) to the
        next round's counter, once each; the addition that makes the quorum
        appends its notice to ``out`` (or, at the designated rank, sets :attr:`met`)."""
        amount = self._news(holds, stands_in)
        view = self._view
        if amount and self._add(view.round, self.designated, amount, view.active_count(), out):
            self.met = True

    def keep_back(self, holds: bool, stands_in: bool) -> None:
        """Joining a balanced next round by itself: keep this rank's news
        for the end of its activation delay (most such rounds complete first)."""
        view = self._view
        self.deferred = (view.round, self.designated, self._news(holds, stands_in), view.active_count())

    @property
    def deferred_round(self) -> int | None:
        """The round whose addition this rank keeps back, if any."""
        return None if self.deferred is None else self.deferred[0]

    def add_kept_back(self, c: int, out: list) -> tuple[bool, bool]:
        """The activation delay of balanced round ``c`` ended first: add what
        this rank kept back. Returns (this rank is the round's designated
        initiator, and its quorum is met)."""
        _, d, amount, training = self.deferred
        met = False
        if amount or d == self.rank:
            self.stats.deferred_additions += 1
            met = self._add(c, d, amount, training, out)
        self.deferred = None  # (after the addition: a watcher may read it)
        return d == self.rank, met

    def on_notice(self) -> None:
        """A ``QuorumMet`` for the next round came: its quorum is met."""
        self.met = True

    def drop_kept_back(self) -> None:
        """The addition kept back is not needed (the round's flood went out, or every rank joined it)."""
        self.deferred = None

    def joined(self, r: int) -> None:
        """This rank joins round ``r``: zero round ``r - 2``'s counter if it is this rank's (safe now: see .quorum)."""
        if r > 1 and self._initiators(r - 2) == self.rank:
            self.counters.clear((r - 2) % QUORUM_SLOTS)

    def _news(self, holds: bool, stands_in: bool) -> int:
        """What this rank has not yet added to the next round's counter (and now counts as added)."""
        amount = 0
        if holds and not self._counted_holds:
            self._counted_holds = True
            amount = HOLDS
        if stands_in and not self._counted_flushing and not self._view.stands_in(self.rank):
            self._counted_flushing = True
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
