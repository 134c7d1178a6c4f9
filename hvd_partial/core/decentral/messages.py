"""Messages between ranks, and what the state machine asks its driver to do.

Plain, picklable dataclasses; the state machine produces and consumes them
and the driver moves them (or, in tests, an event-driven world does).
The ``Send`` action is that of :mod:`hvd_partial.core.messages` (re-exported
here: one class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..messages import Send

__all__ = ["Activate", "Gathered", "QuorumMet", "DesignatedParked", "Send", "Defer",
           "ReleaseActivation", "Join", "Complete"]


# rank -> rank ------------------------------------------------------------------

@dataclass(frozen=True)
class Activate:
    """Round ``round`` has started: join it and pass it on (hypercube flood)."""

    round: int

    def __reduce__(self):  # the most frequent message between ranks: keep its pickle small
        return Activate, (self.round,)


@dataclass(frozen=True)
class Gathered:
    """Convergecast report for the held round ``round``: the sender, at
    ``position`` of the gather named ``kind``, and its whole subtree are ready.

    ``kind`` is ``"stale"`` (every rank of the subtree that held the round
    back by the staleness bound has posted for it or is flushing)
    or ``"flush"`` (every rank of the subtree is flushing)."""

    round: int
    kind: str
    position: int


@dataclass(frozen=True)
class QuorumMet:
    """To the designated initiator of majority round ``round``: the sender's
    addition to the round's quorum counter made the quorum (one per round;
    see :mod:`.quorum`)."""

    round: int


@dataclass(frozen=True)
class DesignatedParked:
    """Majority round ``round``'s designated initiator waits in a call that
    needs every rank (parked) and will not post for it: a rank that holds
    data starts the round itself, as for a flushing designated rank. Flooded
    over the hypercube, once per rank."""

    round: int


# state machine -> driver -----------------------------------------------------
# (Actions never leave the rank and are made on every post and completion:
# plain slotted records, about a third of a frozen dataclass's cost to make.)

@dataclass(slots=True)
class Defer:
    """Action: this rank started ``round`` and holds its activations back.
    Call the stream's ``release_flood(round)`` once the activation delay has
    passed (the engine's timer does); if the round completed here before, it needed none."""

    round: int


@dataclass(frozen=True)
class ReleaseActivation:
    """The end of the activation delay of ``round``: its held-back activations
    go out (those still needed), unless the host knows that
    ``everyone_joined`` the round (its facts were reduced). The engine's timer
    calls ``release_flood`` with it; the loopback and simulated worlds model
    the delay as this message to the rank itself."""

    round: int
    everyone_joined: bool = False


@dataclass(slots=True)
class Join:
    """Start this rank's part of round ``round``'s reduction: sum this rank's
    pending posts (possibly none) over all ranks, and ``facts`` (an int64
    array with this rank's column filled, zeros elsewhere) with them; then
    call ``on_reduced``."""

    round: int
    facts: Any


@dataclass(slots=True)
class Complete:
    """A post or flush is done: ``results`` are the rounds it takes, in order;
    ``error`` is set instead when the world failed."""

    kind: str  # "post" or "flush"
    seq: int
    results: list
    error: Exception | None = None
