"""Reduction modes and ops.

A mode names its kind, staleness bound and (majority) quorum and seed; the
decentralized stream (:mod:`hvd_partial.core.decentral`) runs the rule of
each kind, and the simulator's reference coordinator asks
:meth:`Mode.choose_initiator`.

Example::

    hvd.partial_allreduce(grad, "grads", mode=hvd.Majority(seed=1, quorum=2))
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Callable, ClassVar, Sequence

from .errors import ConfigError


class ReduceOp(Enum):
    """How a round's contributions are combined."""

    AVERAGE = "average"  # sum divided by the world size
    SUM = "sum"
    # Helper collectives only (partial allreduce streams take Average and Sum):
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"  # refused with a clear error (not implemented)

    def __repr__(self) -> str:
        return f"hvd_partial.{self.name.title()}"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


class RoundFacts:
    """What the control policy knows when round ``round`` of stream ``stream``
    may start. ``views[j]`` has rank j's ``taken`` count, whether a post of it
    ``waiting`` for the round, and whether it is ``flushing``; ``pending(j)``:
    rank j holds data not yet in any round; ``training``: ranks not flushing;
    ``trigger``: the rank whose post prompted the decision, if any. (A plain
    slotted class: one is built for every decision.)"""

    __slots__ = ("stream", "round", "world_size", "views", "training", "pending", "trigger")

    def __init__(self, stream: str, round: int, world_size: int, views: Sequence, training: list,
                 pending: Callable[[int], bool], trigger: int | None):
        self.stream = stream
        self.round = round
        self.world_size = world_size
        self.views = views
        self.training = training
        self.pending = pending
        self.trigger = trigger


@dataclass(frozen=True)
class Mode:
    """Base of the modes; instances are immutable and compare by value."""

    # Whether a control policy starts the rounds (sync rounds start when every rank posts).
    decided: ClassVar[bool] = True

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()

    def describe(self) -> tuple:
        """A hashable description, compared across ranks at registration."""
        return (self.kind,)

    def choose_initiator(self, facts: RoundFacts) -> int | None:
        """The initiator of the round if it may start now (the staleness bound
        already holds), else None."""
        raise NotImplementedError(f"{self!r} has no rule to start a round")


@dataclass(frozen=True)
class Sync(Mode):
    """Plain allreduce: every rank contributes to and takes every round.

    Example::

        hvd.partial_allreduce(grad, "grads", mode=hvd.Sync())
    """

    decided: ClassVar[bool] = False


@dataclass(frozen=True)
class Solo(Mode):
    """Solo allreduce: the first rank to post starts the round; the others take
    part through their engines with whatever they already posted.

    Example::

        hvd.partial_allreduce(grad, "grads", mode=hvd.Solo())
    """

    def choose_initiator(self, facts: RoundFacts) -> int | None:
        # Someone's post waits for this round: it starts now, by that rank.
        needers = [j for j in facts.training if facts.views[j].waiting and facts.views[j].taken >= facts.round]
        if not needers:
            return None
        return facts.trigger if facts.trigger is not None else needers[0]


@dataclass(frozen=True)
class Majority(Mode):
    """Majority allreduce: round ``r`` starts when its designated initiator posts.

    The initiator is drawn per round from ``seed`` (identical on every rank).
    With ``quorum=k`` the round also waits until ``k`` ranks hold data not yet
    in any round (``k = ceil(P / 2)`` gives "at least half").

    Example::

        hvd.partial_allreduce(grad, "grads", mode=hvd.Majority(seed=7, quorum=2))
    """

    seed: int = 0
    quorum: int | None = None

    def __post_init__(self):
        if not isinstance(self.seed, int):
            raise TypeError(f"Majority seed must be an int, got {self.seed!r}")
        if self.quorum is not None and (not isinstance(self.quorum, int) or self.quorum < 1):
            raise ConfigError(f"Majority quorum must be a positive int or None, got {self.quorum!r}")

    def describe(self) -> tuple:
        return (self.kind, self.seed, self.quorum)

    def choose_initiator(self, facts: RoundFacts) -> int | None:
        designated = self.initiator(facts.stream, facts.round, facts.world_size)
        # A flushing designated rank stands in for its post (it no longer trains).
        if not (facts.pending(designated) or facts.views[designated].flushing):
            return None
        holders = sum(1 for j in range(facts.world_size) if facts.pending(j))
        if holders == 0:
            return None
        if self.quorum is not None and holders < min(self.quorum, len(facts.training)):
            return None
        return designated

    def initiator(self, stream: str, round_number: int, world_size: int) -> int:
        """The designated initiator of ``round_number``: a pure function of
        (seed, stream, round), identical in every process."""
        return designated_initiator(self.seed, stream, round_number, world_size)


def designated_initiator(seed: int, stream: str, round_number: int, world_size: int) -> int:
    return DesignatedInitiators(seed, stream, world_size)(round_number)


class DesignatedInitiators:
    """:func:`designated_initiator` of every round of one stream (asked every
    round): the hash of the fixed ``seed`` and ``stream`` is computed once."""

    __slots__ = ("_prefix", "_world_size")

    def __init__(self, seed: int, stream: str, world_size: int):
        # blake2b rather than hash(): Python salts str hashes per process.
        self._prefix = hashlib.blake2b(f"{seed}\0{stream}\0".encode(), digest_size=8)
        self._world_size = world_size

    def __call__(self, round_number: int) -> int:
        digest = self._prefix.copy()
        digest.update(str(round_number).encode())
        return int.from_bytes(digest.digest(), "little") % self._world_size


def mode_from_description(description: tuple) -> Mode:
    """The mode that ``Mode.describe()`` described."""
    kind, *args = description
    return mode_from_name(kind, *args)


def mode_from_name(name: str, seed: int = 0, quorum: int | None = None) -> Mode:
    """Build a mode from its name (``"sync"``, ``"solo"`` or ``"majority"``)."""
    key = name.strip().lower()
    if key == "sync":
        return Sync()
    if key == "solo":
        return Solo()
    if key == "majority":
        return Majority(seed=seed, quorum=quorum)
    raise ConfigError(f"unknown mode {name!r}: expected sync, solo or majority")
