"""The round a rank would start next, while it is not yet started: its view,
this rank's part in the round's gathers, and the rule for starting it (the
rules are in :mod:`.stream`). Pure.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...errors import EngineError
from .facts import RoundView
from .gather import Gather, position_in_sorted
from .messages import Gathered, Join, Send


class LocalRank(Protocol):
    """What the round rules read of this rank's side of the stream, and how it joins a round."""

    rank: int
    tau: int
    taken: int
    pending: list  # posts not yet contributed: this rank holds data while there are any
    waiter: tuple[str, int] | None  # ("post" | "flush", seq)
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

    __slots__ = ("view", "balanced", "designated", "stale", "flush", "flush_made", "signature", "first", "mismatch")

    def __init__(self, view: RoundView, balanced: bool, rank: int, designated: int | None = None,
                 signature=None, only_me: np.ndarray | None = None):
        self.view = view
        self.balanced = balanced
        self.designated = designated
        self.stale: Gather | None = None  # registration or staleness gather
        self.flush: Gather | None = None  # made on first need (see flush_gather)
        self.flush_made = False
        # registration: the signature of the lowest rank heard of, that rank, and a disagreement found
        self.signature = signature
        self.first: int | None = None
        self.mismatch: tuple | None = None
        if view.registration:
            self.stale = Gather.member("register", view.blockers, rank, rank)
            self.first = rank
        elif designated is not None:
            if not balanced:  # (a balanced round has no gather)
                self.stale = _majority_gather(view, designated, rank, only_me)
        elif len(view.blockers):
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
        gather = self.stale if msg.kind in ("stale", "register") else self.flush_gather(rank, world_size)
        if gather is None:  # pragma: no cover - a protocol bug
            raise EngineError(f"rank {rank}: {msg} for a gather it is not in")
        gather.child_reported(msg.position)
        if msg.kind == "register" and self.mismatch is None:
            if msg.mismatch is not None:
                self.mismatch = msg.mismatch
            elif msg.signature != self.signature:
                self.mismatch = (self.first, self.signature, msg.first, msg.signature)

    def report(self, local: LocalRank, world_size: int, out: list) -> tuple | None:
        """Mark this rank ready where it is, and send each complete subtree's
        report up (to ``out``). Returns the disagreement that the registration's
        root found, if any."""
        c, holds, stale = self.view.round, bool(local.pending), self.stale
        if stale is not None and not stale.ready:
            stale.ready = holds if self.view.registration else (
                holds or local.stands_in or local.taken >= c - local.tau + 1)  # (caught up by a take after a park)
        if local.flushing:
            flush = self.flush_gather(local.rank, world_size)
            if flush is not None:
                flush.ready = True
        for gather in (stale, self.flush):
            if gather is not None and not gather.reported and gather.complete():
                gather.reported = True
                if gather.is_root:
                    if gather.kind == "register" and self.mismatch is not None:
                        return self.mismatch
                elif gather.kind == "register":
                    out.append(Send(gather.parent, Gathered(c, gather.kind, gather.position, self.signature,
                                                            self.first, self.mismatch)))
                else:
                    out.append(Send(gather.parent, Gathered(c, gather.kind, gather.position)))
        return None

    def may_start(self, local: LocalRank, holds: bool, quorum_met: bool | None, designated_parked: bool) -> bool:
        """Whether this rank starts the round now (``quorum_met``: None without a quorum)."""
        view, stale = self.view, self.stale
        stale_done = stale is not None and stale.is_root and stale.reported
        if view.registration:
            return stale_done
        if self.flush is not None and self.flush.is_root and self.flush.reported:
            return True  # every rank is flushing: this is the flush round
        d = self.designated
        if d is None:  # solo
            if stale is None and not len(view.blockers):
                return local.waiter is not None and local.waiter[0] == "post"  # a waiting post starts it
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
