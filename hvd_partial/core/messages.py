"""The control messages of the ranks' engines, in one place.

- Reports a rank's protocol driver makes to its control policy (``Register``,
  ``Flush``, ``Goodbye``; ``Post`` only for the simulator's reference
  coordinator, :mod:`hvd_partial.sim.coordinator`).
- Decisions a control policy hands every rank's driver (``Registered``,
  ``Rejected``, ``FlushBegun``, ``Closed``, ``Start``), reached by the
  agreements of :mod:`hvd_partial.core.decentral.agreement` (gathers to rank
  0 and floods of the outcome).
- Liveness between engines (``Heartbeat``, ``Failure``; see
  :mod:`hvd_partial.core.liveness`).
- Actions, which never leave the rank: what a pure state machine asks the
  code that runs it to do (``Send``; ``Declared`` for liveness).

Plain, picklable dataclasses; the core produces and consumes them and the
transport moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamSignature:
    """What every rank must agree on for a stream."""

    layout: tuple  # ((shape, dtype_str), ...) of the arrays the user posts
    grouped: bool
    mode: tuple  # Mode.describe()
    op: str
    max_staleness: int

    def differences(self, other: "StreamSignature") -> list[str]:
        out = []
        for name in ("layout", "grouped", "mode", "op", "max_staleness"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name} {mine!r} vs {theirs!r}")
        return out


# a rank's driver -> its control policy -----------------------------------------

@dataclass(frozen=True)
class Register:
    rank: int
    name: str
    signature: StreamSignature


@dataclass(frozen=True)
class Post:
    """A rank posted contribution ``seq`` of a stream.

    ``computed_for`` is the rank's taken count before the post (the round the
    gradient was computed for); ``taken`` is its count after the post took the
    rounds already completed; ``waiting`` says the post waits for the next round.
    """

    rank: int
    stream: int
    seq: int
    computed_for: int
    taken: int
    waiting: bool


@dataclass(frozen=True)
class Flush:
    """A rank entered ``flush``: it stops training on this stream until the
    flush round; ``taken`` is its count after taking every completed round."""

    rank: int
    stream: int
    taken: int
    final: bool = False  # shutdown's flush: this rank posts to the stream no more


@dataclass(frozen=True)
class Goodbye:
    """A rank is shutting down and has flushed ``streams`` (ids); ``names``:
    every stream it ever posted (the decentralized plane rejects those that
    some rank never posted)."""

    rank: int
    streams: tuple
    names: tuple = ()


# liveness: engine -> engine ----------------------------------------------------

@dataclass(frozen=True)
class Failure:
    """Rank ``rank`` failed (it raised, died, hung or was stopped) for
    ``reason``: flooded to every rank (:mod:`hvd_partial.core.liveness`)."""

    rank: int
    reason: str


@dataclass(frozen=True)
class Heartbeat:
    """Rank ``rank`` is running: sent to its ring successor every
    ``heartbeat_seconds`` (any other message from it counts as much)."""

    rank: int


# a control policy -> every rank's driver ---------------------------------------

@dataclass(frozen=True)
class Registered:
    name: str
    stream: int


@dataclass(frozen=True)
class Rejected:
    """Registration of stream ``name`` failed: ranks disagree (``reason`` names
    them and the fields). Every rank fails its first post with
    ``MismatchError(reason)``."""

    reason: str
    name: str = ""


@dataclass(frozen=True)
class FlushBegun:
    """The first rank to flush sync stream ``stream`` did so after ``rounds``
    rounds. Sync rounds need every rank, so no rank may start round
    ``rounds`` of it before the flush round: one that has, or tries to, posted
    more often than ``rank`` (a mismatch that would otherwise hang)."""

    stream: int
    rank: int
    rounds: int


@dataclass(frozen=True)
class Closed:
    """Every rank said goodbye and every flush round has started."""


@dataclass(frozen=True)
class Start:
    """Start round ``round`` of ``stream``.

    Every rank sums into the round everything it has posted and not yet
    contributed when it receives this message (so a post that reached its
    engine first is fresh in this round); which ranks contributed, and how
    stale their data was, travels with the reduction itself. ``round`` is
    ``None`` for the flush of a sync stream, whose rounds are counted locally.
    ``lag[j]`` is how many rounds rank ``j`` had not taken when the round started.
    """

    stream: int
    round: int | None
    initiator: int | None
    flush: bool = False
    lag: tuple = field(default=())


# actions: a state machine -> the code that runs it (never leave the rank) -----
# (Made on every post and completion: plain slotted records, about a third of a
# frozen dataclass's cost to make.)

@dataclass(slots=True)
class Send:
    """Send ``message`` to rank ``dest``."""

    dest: int
    message: Any


@dataclass(slots=True)
class Declared:
    """Liveness learned that rank ``error.rank`` failed (this rank's first
    failure, at which it stops): fail every waiter with ``error``, a
    :class:`~hvd_partial.errors.RankFailedError`."""

    error: Any
