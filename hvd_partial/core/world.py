"""The world a rank trains in, and how it changed: which ranks of the
world at ``init`` are gone, and the version that counts the changes.

Pure data: the engine makes a new :class:`World` each time the survivors of
a failure shrink the job (elastic training), and the elastic API compares
versions to tell that the world changed.

Example::

    w = World.initial(rank=2, size=4)
    w2 = w.shrunk(failed_old_ranks=(1,), new_rank=1, new_size=3)
    assert w2.version == 1 and w2.lost == (1,) and w2.original_rank == 2
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class World:
    """``rank`` and ``size`` in the current world; ``version`` counts the
    changes since ``init``; ``lost`` are the ranks, numbered as at ``init``,
    that died since; ``original_rank`` is this rank's number at ``init``;
    ``members`` the ``init`` numbers of the current ranks, in rank order;
    ``joined`` the numbers of the ranks started since ``init`` to grow the
    world back (numbered after every earlier one: the first after a job of
    4 is 4), in the order they joined; ``left`` the ranks that left cleanly
    because their hosts were drained (``hvd-partial-run
    --host-discovery-script``), numbered as ``members``."""

    version: int
    rank: int
    size: int
    original_rank: int
    members: tuple[int, ...]
    lost: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    left: tuple[int, ...] = ()

    @classmethod
    def initial(cls, rank: int, size: int) -> "World":
        return cls(0, rank, size, rank, tuple(range(size)))

    def shrunk(self, failed: tuple[int, ...], new_rank: int) -> "World":
        """The world after the ranks ``failed`` (current numbers) died; the
        survivors keep their order, so this rank becomes ``new_rank``."""
        members, gone = self._without(failed, new_rank)
        return World(self.version + 1, new_rank, len(members), self.original_rank, members,
                     tuple(sorted(set(self.lost) | gone)), self.joined, self.left)

    def drained(self, leaving: tuple[int, ...], new_rank: int) -> "World":
        """The world after the ranks ``leaving`` (current numbers) left cleanly; the
        others keep their order, so this rank becomes ``new_rank``."""
        members, gone = self._without(leaving, new_rank)
        return World(self.version + 1, new_rank, len(members), self.original_rank, members, self.lost, self.joined,
                     tuple(sorted(set(self.left) | gone)))

    def _without(self, ranks: tuple[int, ...], new_rank: int) -> tuple[tuple[int, ...], set[int]]:
        """The members left without the current ranks ``ranks``, and those ranks' numbers."""
        gone = set(ranks)
        members = tuple(m for r, m in enumerate(self.members) if r not in gone)
        if members[new_rank] != self.original_rank:
            raise ValueError(f"rank {self.rank}: new rank {new_rank} is not this rank in {members}")
        return members, {self.members[r] for r in gone}

    def grown(self, count: int) -> "World":
        """The world after ``count`` new ranks joined, after the current ones (this
        rank keeps its rank); they get the next unused numbers."""
        first = 1 + max((*self.members, *self.lost, *self.joined, *self.left))
        new = tuple(range(first, first + count))
        return World(self.version + 1, self.rank, self.size + count, self.original_rank, self.members + new,
                     self.lost, self.joined + new, self.left)

    def as_rank(self, rank: int) -> "World":
        """The same world seen by its rank ``rank`` (a joining rank learns the world from rank 0)."""
        return World(self.version, rank, self.size, self.members[rank], self.members, self.lost, self.joined,
                     self.left)
