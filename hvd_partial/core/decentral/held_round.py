"""The round ``c`` a rank would start next, while it is not yet started:
its view, this rank's part in the round's gathers, and the rules for
starting it. Pure.

- Registration (round 0) is agreed outside the stream
  (:class:`~.agreement.Agreements`): every rank joins round 0 on that news.
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
  ``min(k, ranks still training)`` ranks hold data (:mod:`.quorum`,
  :mod:`.quorum_tally`). A flushing ``D`` stands in for a post: with a
  quorum it waits for the quorum like a holder; without one, when the view
  shows ``D`` flushing (or parked: :mod:`.parking`) and names no blockers,
  the first rank that holds data starts the round itself; with blockers,
  ``D`` starts it once they caught up; and a ``D`` that began flushing after
  the view (nobody knew) starts it at once.
- Flush: the training ranks of the view gather, each once it is flushing, to
  the lowest of them, which then starts round ``c``. A round that every rank
  joined flushing, in the same flush (the facts carry which), is the flush
  round: its reduced facts say so on every rank alike, so all agree on it
  whoever started it, and it sums every pending post.
- A round of balanced training has no gather (:mod:`.held_back`).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ...errors import EngineError
from .facts import RoundView
from .gather import Gather, position_in_sorted
from .messages import Gathered, Join, Send


class PendingPost(Protocol):
    computed_for: int  # rounds taken when it was posted


class Waiting(Protocol):
    kind: str  # "post" or "flush"


class RankData(Protocol):
    """This rank's posts to the stream, as their owner keeps them
    (:class:`~hvd_partial.core.rank_stream.RankStream` in the engine): the
    decisions read them and never change them."""

    taken: int  # rounds taken
    pending: Sequence[PendingPost]  # posts not yet contributed, oldest first: this rank holds data
    waiter: Waiting | None  # the post or flush waiting for rounds


class LocalRank(Protocol):
    """What the round rules read of this rank's side of the stream, and how it joins a round."""

    rank: int
    tau: int
    data: RankData
    flushing: bool
    left: bool

    @property
    def stands_in(self) -> bool:
        """This rank starts rounds without posting (flushing, parked or left)."""

    def join(self, round_number: int, initiated: bool) -> Join:
        """This rank joins ``round_number`` with everything it has posted and not yet contributed."""


class HeldRound:
    """This rank's state of round ``view.round`` before it starts.

    ``balanced``: the round comes in balanced training (fixed when held,
    alike on every rank), decided without gathers by :mod:`.held_back`.
    ``designated``: majority's initiator of the round (None: solo, or registration).
    """

    __slots__ = ("view", "balanced", "designated", "stale", "flush", "flush_made")

    def __init__(self, view: RoundView, balanced: bool, rank: int, designated: int | None = None,
                 only_me: np.ndarray | None = None):
        self.view = view
        self.balanced = balanced
        self.designated = designated
        self.stale: Gather | None = None  # staleness gather
        self.flush: Gather | None = None  # made on first need (see flush_gather)
        self.flush_made = False
        if designated is not None:
            if not balanced:  # (a balanced round has no gather)
                self.stale = _majority_gather(view, designated, rank, only_me)
        elif len(view.blockers) and not view.registration:  # (round 0 starts when registration is agreed)
            self.stale = Gather.member("stale", view.blockers, rank, position_in_sorted(view.blockers, rank))

    def flush_gather(self, rank: int, world_size: int) -> Gather | None:
        """This rank's part in the flush gather of the round, made when first
        needed (it flushes, or a report came): most rounds have no flush."""
        if not self.flush_made and not self.view.registration:
            self.flush_made = True
            training = self.view.training
            everyone = len(training) == world_size  # then training is 0..P-1
            self.flush = Gather.member("flush", training, rank,
                                       rank if everyone else position_in_sorted(training, rank))
        return self.flush

    def apply(self, msg: Gathered, rank: int, world_size: int) -> None:
        """A child's report in one of the round's gathers."""
        gather = self.stale if msg.kind == "stale" else self.flush_gather(rank, world_size)
        if gather is None:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {rank}: {msg} for a gather it is not in")
        gather.child_reported(msg.position)

    def report(self, local: LocalRank, world_size: int, out: list) -> None:
        """Mark this rank ready where it is, and send each complete subtree's report up (to ``out``)."""
        c, stale = self.view.round, self.stale
        if stale is not None and not stale.ready:  # (caught up by a take after a park, too)
            stale.ready = bool(local.data.pending) or local.stands_in or local.data.taken >= c - local.tau + 1
        if local.flushing:
            flush = self.flush_gather(local.rank, world_size)
            if flush is not None:
                flush.ready = True
        for gather in (stale, self.flush):
            if gather is not None and not gather.reported and gather.complete():
                gather.reported = True
                if not gather.is_root:
                    out.append(Send(gather.parent, Gathered(c, gather.kind, gather.position)))

    def may_start(self, local: LocalRank, holds: bool, quorum_met: bool | None, designated_parked: bool) -> bool:
        """Whether this rank starts the round now (``quorum_met``: None without a quorum)."""
        view, stale = self.view, self.stale
        stale_done = stale is not None and stale.is_root and stale.reported
        if self.flush is not None and self.flush.is_root and self.flush.reported:
            return True  # every rank is flushing: this is the flush round
        if not len(view.training) and not view.registration:
            # Every rank flushes or left, so the round is a flush round that any flushing rank may
            # start: only after a shrink (the ranks that trained in the last round died), as a flush
            # gather has no ranks then.
            return local.flushing
        d = self.designated
        if d is None:  # solo
            if stale is None and not len(view.blockers):
                waiter = local.data.waiter
                return waiter is not None and waiter.kind == "post"  # a waiting post starts it
            return stale_done
        if d != local.rank:
            # Everyone knows the designated initiator is flushing, and no quorum is set: it stands
            # in for a post, so the first rank to hold data starts the round.
            return (quorum_met is None and (view.stands_in(d) or designated_parked)
                    and not len(view.blockers) and holds)
        if not stale_done:
            return False
        if quorum_met is None:
            # newly flushing: nobody else knew to start it (a newly parked one tells them instead)
            if holds or ((local.flushing or local.left) and not view.stands_in(local.rank)):
                return True
            # Known to be flushing: with blockers, they all caught up, by a post (so data exists) or by
            # flushing (each flush allows one such round); without, the holders start it.
            return local.stands_in and len(view.blockers) > 0
        return (holds or local.stands_in) and quorum_met


def _majority_gather(view: RoundView, d: int, me: int, only_me: np.ndarray) -> Gather | None:
    """This rank's part in the staleness gather of a majority round: the
    designated initiator ``d`` first, then the blockers."""
    if not len(view.blockers):  # a gather of the designated rank alone
        order, position = only_me, 0 if me == d else None
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
