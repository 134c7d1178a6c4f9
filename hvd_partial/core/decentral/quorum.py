"""Majority's quorum count: one counter at each round's designated initiator.

With ``Majority(quorum=k)`` the designated initiator ``D`` of round ``c`` may
start it once ``min(k, ranks still training)`` ranks hold data. Any ``k``
ranks can make the quorum, so no single message carries the count; instead
every rank that holds data for ``c`` (or begins flushing before ``c``
starts) adds to a counter that lives at ``D``, atomically, and reads the
value before its addition. The condition only ever turns true as the count
grows, so exactly one addition turns it true: that rank alone tells ``D``
(one notice per round), or knows it itself if it is ``D``.

A counter value packs two counts: ranks that hold data (low 32 bits) and
ranks that began flushing since the round's view was made (high 32 bits).

Each stream has two counter slots per rank; round ``c`` uses slot
``c % 2`` at ``D(c)``. ``D(c)`` zeroes that slot when it joins round
``c + 1``. That is safe both ways: every addition for ``c`` is complete
before its rank joins ``c``, and so before anyone completes ``c``, which
someone must have done before ``c + 1`` started anywhere; and an addition
for ``c + 2`` (the slot's next use) comes from a rank that completed
``c + 1``, which every rank, ``D(c)`` too, joined after the zeroing.

The counters are a host's: the MPI engine keeps them in a one-sided window
(:class:`hvd_partial.transport.mpi.QuorumWindow`), the in-process worlds in
:class:`SharedQuorumCounters`. Pure: no MPI.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

HOLDS = 1  # what a rank adds once it holds data for the round
BEGAN_FLUSHING = 1 << 32  # ... once it began flushing, not known from the round's view
_LOW = (1 << 32) - 1


def quorum_met(count: int, quorum: int, training: int) -> bool:
    """Whether ``count`` (packed as above) makes the quorum of a round whose
    view has ``training`` ranks training: ``min(quorum, those still training)``
    ranks, and at least one, hold data; or nobody trains any more (the round
    is then the flush round, data or not). Monotone in both packed counts."""
    holders, began_flushing = count & _LOW, count >> 32
    still_training = training - began_flushing
    return still_training <= 0 or holders >= max(1, min(quorum, still_training))


class QuorumCounters(Protocol):
    """One stream's quorum counters, as one rank sees them."""

    def add(self, owner: int, slot: int, amount: int) -> int:
        """Atomically add ``amount`` to rank ``owner``'s counter ``slot``
        (0 or 1), complete at ``owner`` on return; returns the value before."""

    def clear(self, slot: int) -> None:
        """Zero this rank's own counter ``slot``, complete on return."""


class SharedQuorumCounters:
    """Every rank's counters of every stream in one process, for the loopback
    world and the simulators: an addition is an event of its own, and so atomic.

    ``for_rank(rank)(stream_index)`` is that rank's :class:`QuorumCounters` of
    the stream with that quorum index. ``on_add(rank, owner)``, if set, is
    called at every addition (the simulator prices it).
    """

    def __init__(self):
        self.values: dict[tuple, int] = defaultdict(int)  # (stream index, owner, slot) -> count
        self.additions = 0
        self.on_add = None

    def for_rank(self, rank: int):
        return lambda index: _SharedView(self, index, rank)


class _SharedView:
    __slots__ = ("_shared", "_index", "_rank")

    def __init__(self, shared: SharedQuorumCounters, index: int, rank: int):
        self._shared, self._index, self._rank = shared, index, rank

    def add(self, owner: int, slot: int, amount: int) -> int:
        key = (self._index, owner, slot)
        before = self._shared.values[key]
        self._shared.values[key] = before + amount
        self._shared.additions += 1
        if self._shared.on_add is not None:
            self._shared.on_add(self._rank, owner)
        return before

    def clear(self, slot: int) -> None:
        self._shared.values[(self._index, self._rank, slot)] = 0
