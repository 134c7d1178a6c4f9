"""Binomial convergecast over a set of ranks known to all of them.

The members are ordered (``order[0]`` is the root). The member at position
``p > 0`` reports to position ``p & (p - 1)`` once it is ready itself and
every child ``p + 2**b`` (``2**b`` below the lowest set bit of ``p``; every
``b`` for the root) has reported. Every member sends at most one report and
receives at most ``ceil(log2 n)``; the root knows that all ``n`` members are
ready after at most ``ceil(log2 n)`` report hops once the last one is.
"""

from __future__ import annotations

import numpy as np

from ...errors import EngineError


def children_positions(position: int, size: int) -> list[int]:
    limit = position & -position if position else 1 << max(0, (size - 1).bit_length())
    out = []
    step = 1
    while step < limit and position + step < size:
        out.append(position + step)
        step <<= 1
    return out


def parent_position(position: int) -> int:
    return position & (position - 1)


class Gather:
    """One member's side of one convergecast (``kind`` names it in messages).

    ``order`` maps positions to ranks; ``position`` is this rank's.
    """

    __slots__ = ("kind", "order", "position", "waiting_for", "ready", "reported")

    def __init__(self, kind: str, order: np.ndarray, position: int):
        self.kind = kind
        self.order = order
        self.position = position
        self.waiting_for = set(children_positions(position, len(order)))
        self.ready = False  # this member itself
        self.reported = False  # sent up (or, at the root, complete)

    @classmethod
    def member(cls, kind: str, order: np.ndarray, rank: int, position: int | None) -> "Gather | None":
        if position is None:
            return None
        if position >= len(order) or order[position] != rank:  # pragma: no cover - a caller's bug
            raise EngineError(f"rank {rank} is not at position {position} of {kind} gather")
        return cls(kind, order, position)

    @property
    def is_root(self) -> bool:
        return self.position == 0

    @property
    def parent(self) -> int:
        return int(self.order[parent_position(self.position)])

    def child_reported(self, position: int) -> None:
        self.waiting_for.discard(position)

    def complete(self) -> bool:
        """This member and its whole subtree are ready."""
        return self.ready and not self.waiting_for


def position_in_sorted(members: np.ndarray, rank: int) -> int | None:
    """Position of ``rank`` in the sorted array ``members`` (binary search)."""
    i = int(np.searchsorted(members, rank))
    return i if i < len(members) and members[i] == rank else None
