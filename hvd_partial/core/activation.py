"""Round activation without a coordinator: a hypercube flood.

The rank that starts round ``r`` (or several ranks at once) tells its
hypercube neighbours ``rank ^ 2**i`` that are below ``P``; every rank, on first
hearing of round ``r`` (its own start or a message), does the same and ignores
every later activation of that round. Pure: no MPI, no clocks.

Why it is enough, for any ``P`` and any set of concurrent initiators:

- Reach and depth: ranks ``a`` and ``b`` below ``P`` are ``popcount(a ^ b)``
  hops apart in the hypercube restricted to ``[0, P)``: clear the bits of
  ``a`` that ``b`` lacks (each step makes the number smaller, so it stays
  below ``P``), then set the bits of ``b`` that ``a`` lacks (each step stays
  at or below ``b``). A rank forwards on first hearing, so it hears no later
  than along the shortest path from the nearest initiator: within
  ``ceil(log2 P)`` hops of the first start.
- Cost: a rank has at most ``ceil(log2 P)`` neighbours (for ``2**i >= P``,
  ``rank ^ 2**i >= P``), sends to each at most once per round and hears from
  each at most once per round.

A binomial tree rooted at each initiator, where a rank forwards only along
the tree of the first activation it hears, does not have this property
(see :func:`binomial_children` and the tests: P=7, initiators 0 and 3).
"""

from __future__ import annotations

from ..errors import EngineError

__all__ = ["Activation", "hypercube_neighbours", "hypercube_distance", "max_hops", "binomial_children"]


def max_hops(world_size: int) -> int:
    """``ceil(log2 P)``: the depth bound and the per-rank message bound."""
    return max(0, (world_size - 1).bit_length())


def hypercube_neighbours(rank: int, world_size: int) -> list[int]:
    """``rank ^ 2**i`` for every ``i`` that keeps it below ``world_size``."""
    return [rank ^ (1 << i) for i in range(max_hops(world_size)) if rank ^ (1 << i) < world_size]


def hypercube_distance(a: int, b: int) -> int:
    """Hops between ``a`` and ``b`` in the hypercube restricted to ``[0, P)``."""
    return bin(a ^ b).count("1")


def binomial_children(rank: int, root: int, world_size: int) -> list[int]:
    """Children of ``rank`` in the binomial broadcast tree rooted at ``root``
    (relative rank ``v`` sends to ``v + 2**i`` for every ``2**i > v``)."""
    v = (rank - root) % world_size
    out = []
    step = 1
    while step <= v:
        step <<= 1
    while v + step < world_size:
        out.append((root + v + step) % world_size)
        step <<= 1
    return out


class Activation:
    """One rank's side of the flood, for any number of rounds.

    ``start(r)`` and ``receive(r, source)`` return the ranks to send
    ``r`` to (empty when the round was already heard); ``heard(r)`` says
    whether this rank has joined round ``r``. Rounds are activated in order
    on every rank (round ``r`` starts only where round ``r - 1`` completed,
    so every rank joined ``r - 1`` first), so one counter remembers them all.

    Example::

        a = Activation(rank=5, world_size=7)
        a.start(0)        # -> [4, 1]  (5 ^ 1, 5 ^ 4; 5 ^ 2 = 7 is not a rank)
        a.receive(0, 4)   # -> []      (a duplicate)
    """

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self.neighbours = hypercube_neighbours(rank, world_size)
        self.latest = -1  # highest round heard
        self.heard_from: set[int] = set()  # neighbours that sent the latest round: they need no copy

    def heard(self, round_number: int) -> bool:
        return round_number <= self.latest

    def still_to_tell(self, round_number: int) -> list[int]:
        """The neighbours not yet heard from in ``round_number`` (the latest
        round): where a held-back flood of it goes."""
        if round_number != self.latest:
            return []
        return [n for n in self.neighbours if n not in self.heard_from]

    def start(self, round_number: int) -> list[int]:
        """This rank starts ``round_number`` itself."""
        return self._first(round_number, source=None)

    def start_held(self, round_number: int) -> None:
        """This rank starts ``round_number`` itself but sends nothing now (its
        flood is held back: :meth:`still_to_tell` says where it goes later)."""
        self._join(round_number, source=None)

    def receive(self, round_number: int, source: int) -> list[int]:
        """An activation of ``round_number`` arrived from neighbour ``source``."""
        return self._first(round_number, source)

    def _first(self, round_number: int, source: int | None) -> list[int]:
        if round_number <= self.latest:
            if round_number == self.latest and source is not None:
                self.heard_from.add(source)
            return []  # a duplicate (concurrent initiators) or a late copy
        self._join(round_number, source)
        return [n for n in self.neighbours if n != source]

    def _join(self, round_number: int, source: int | None) -> None:
        """Record the first hearing of ``round_number`` (from ``source``, or this rank's own start)."""
        if round_number != self.latest + 1:
            raise EngineError(f"rank {self.rank}: activation of round {round_number} after round {self.latest}")
        self.latest = round_number
        self.heard_from = set() if source is None else {source}
