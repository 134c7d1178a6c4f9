"""A rank parked in a call that needs every rank (a helper collective,
another stream's flush), with no post or flush of this stream in progress.

It blocks no round: it is ready for any staleness gather, stands in for
majority's initiator and leaves the quorum, as a flushing rank does, and
the rounds it joins say so in their facts (``PARKED``), so the next view
counts it out. Once unparked it takes every round it joined parked before
computing again (:attr:`Parking.take_ready`).

Majority without a quorum: a designated initiator that is parked with
nothing to post, where the view of its round does not say so, floods
:class:`~.messages.DesignatedParked`; every rank passes it on once, and a
rank that holds data then starts the round itself. Pure.
"""

from __future__ import annotations

from .facts import RoundView
from .messages import DesignatedParked, Send


class Parking:
    """One rank's parking on one stream, and the designated-parked notices it passed on."""

    __slots__ = ("rank", "neighbours", "parked", "through", "notice", "designated_parked")

    def __init__(self, rank: int, neighbours: list[int]):
        self.rank = rank
        self.neighbours = neighbours  # hypercube neighbours: the notice is a flood
        self.parked = False
        self.through = -1  # the last round this rank joined parked
        self.notice = -1  # the latest round whose DesignatedParked notice this rank has passed on
        # the designated rank of the round this rank would start next is parked (its notice came,
        # or it is this rank and sent it): a rank that holds data starts that round
        self.designated_parked = False

    def begin(self, c: int) -> None:
        """The next round to start is ``c`` (its notice may have come already)."""
        self.designated_parked = self.notice == c

    def joined(self, r: int) -> bool:
        """This rank joins round ``r``; returns whether it joins it parked."""
        if self.parked:
            self.through = r
        return self.parked

    def take_ready(self, completed: int) -> bool:
        """Every round this rank joined parked is among the ``completed`` ones."""
        return completed > self.through

    def must_tell(self, designated: int, holds: bool, view: RoundView) -> bool:
        """This rank is the designated initiator of the next round, parked
        with nothing to post (``holds``), and has not yet told the others
        (nor does the round's ``view`` say so)."""
        return (designated == self.rank and self.parked and not holds and not self.designated_parked
                and not view.stands_in(self.rank))

    def tell(self, c: int) -> list:
        """Flood that this rank, round ``c``'s designated initiator, is parked."""
        self.designated_parked = True
        self.notice = c
        msg = DesignatedParked(c)
        return [Send(n, msg) for n in self.neighbours]

    def pass_on(self, source: int, msg: DesignatedParked) -> list | None:
        """The notice from ``source``: its forwards, the first time (else None)."""
        if msg.round <= self.notice:
            return None
        self.notice = msg.round
        return [Send(n, msg) for n in self.neighbours if n != source]
