"""Control messages between the ranks' engines and the coordinator.

Plain, picklable dataclasses; the core produces and consumes them and the
transport moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


# rank -> coordinator ---------------------------------------------------------

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


@dataclass(frozen=True)
class Failure:
    """A rank raised, or saw a fatal error; broadcast to every rank."""

    rank: int
    reason: str


@dataclass(frozen=True)
class Heartbeat:
    rank: int


# coordinator -> every rank ---------------------------------------------------

@dataclass(frozen=True)
class Registered:
    name: str
    stream: int


@dataclass(frozen=True)
class Rejected:
    """Registration failed: ranks disagree. Every rank raises ``MismatchError``."""

    name: str
    reason: str


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
