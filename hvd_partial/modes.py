"""Reduction modes and ops.

A mode decides when a round of a stream starts; adding a mode touches only
this module and :mod:`hvd_partial.core.coordinator`.

Example::

    hvd.partial_allreduce(grad, "grads", mode=hvd.Majority(seed=1, quorum=2))
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum

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


@dataclass(frozen=True)
class Mode:
    """Base of the modes; instances are immutable and compare by value."""

    @property
    def kind(self) -> str:
        return type(self).__name__.lower()

    def describe(self) -> tuple:
        """A hashable description, compared across ranks at registration."""
        return (self.kind,)


@dataclass(frozen=True)
class Sync(Mode):
    """Plain allreduce: every rank contributes to and takes every round.

    Example::

        hvd.partial_allreduce(grad, "grads", mode=hvd.Sync())
    """


@dataclass(frozen=True)
class Solo(Mode):
    """Solo allreduce: the first rank to post starts the round; the others take
    part through their engines with whatever they already posted.

    Example::

        hvd.partial_allreduce(grad, "grads", mode=hvd.Solo())
    """


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

    def initiator(self, stream: str, round_number: int, world_size: int) -> int:
        """The designated initiator of ``round_number``: a pure function of
        (seed, stream, round), identical in every process."""
        return designated_initiator(self.seed, stream, round_number, world_size)


def designated_initiator(seed: int, stream: str, round_number: int, world_size: int) -> int:
    # blake2b rather than hash(): Python salts str hashes per process.
    digest = hashlib.blake2b(f"{seed}\0{stream}\0{round_number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % world_size


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
