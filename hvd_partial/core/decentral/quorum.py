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

In balanced training (the round's view has every rank training and the last
round had them all) a rank that joins the round by itself (majority's
designated rank, or an early joiner) keeps its addition back until its
activation delay ends: a round that every rank joined by itself has every
holder in it, so its quorum holds whatever it counts, and most such rounds
complete first and add nothing. Only when the delay ends first does the rank
add, and the designated rank then floods the round once the quorum is met.

Each stream has ``QUORUM_SLOTS`` (three) counter slots per rank; round ``c``
uses slot ``c % 3`` at ``D(c)``, which zeroes it when it joins round
``c + 2``. That is safe both ways. Every addition for ``c`` is made before
its rank joins ``c + 1``: before it joins ``c``, or at the end of its delay
while it has joined nothing later (a rank that joins ``c + 1`` learns that
everyone joined ``c``, since someone completed it, and drops what it kept
back). ``D(c)`` joins ``c + 2`` only once someone completed ``c + 1``, so
after every rank joined ``c + 1``. And an addition for ``c + 3`` (the slot's
next use) comes from a rank that completed ``c + 2``, which ``D(c)`` joined,
zeroing first.

The counters are a host's: the MPI engine keeps them in a one-sided window
(:class:`hvd_partial.transport.mpi.QuorumWindow`), the in-process worlds in
:class:`SharedQuorumCounters`. Pure: no MPI.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

QUORUM_SLOTS = 3  # counters per stream and rank (see above)
HOLDS = 1  # what a rank adds once it holds data for the round
BEGAN_FLUSHING = 1 << 32  # ... once it began flushing, not known from the round's view
_LOW = (1 << 32) - 1


def quorum_met(count: int, quorum: int, training: int) -> bool:
    """Whether ``count`` (packed as above) makes the quorum of a round whose
    view has ``training`` ranks training: ``min(quorum, those still training)``
    ranks, and at least one, hold data (a round nobody holds data for is
    needed by nobody: where every rank flushes, the flush gather starts the
    flush round). Monotone in both packed counts."""
    holders, began_flushing = count & _LOW, count >> 32
    still_training = training - began_flushing
    return holders >= max(1, min(quorum, still_training))


class QuorumCounters(Protocol):
    """One stream's quorum counters, as one rank sees them."""

    def add(self, owner: int, slot: int, amount: int) -> int:
        """Atomically add ``amount`` to rank ``owner``'s counter ``slot``
        (below ``QUORUM_SLOTS``), complete at ``owner`` on return; returns the value before."""

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
