"""The result of one round of a stream, as handed to the caller."""

from __future__ import annotations

from typing import Any

import numpy as np

_ALL_FRESH: dict[int, np.ndarray] = {}


def all_fresh(world_size: int) -> np.ndarray:
    """The staleness row of a round every rank joined with fresh data (shared, read-only)."""
    row = _ALL_FRESH.get(world_size)
    if row is None:
        row = _ALL_FRESH[world_size] = np.ones(world_size, np.int64)
        row.flags.writeable = False
    return row


class RoundResult:
    """One round's reduced value and its facts.

    ``array`` is the result for a stream of one array; ``arrays`` the list of
    results for a grouped stream (``array`` is then ``None``). ``contributors``
    are the sorted ranks whose data was summed; ``staleness[rank]`` is how many
    rounds late that rank's data was (0 is fresh). ``initiator`` is the rank that
    started the round, or ``None`` for sync and flush rounds.

    The engine builds a result from the round's staleness row (per rank: 0 if
    it summed nothing, else 1 plus its lateness); ``contributors`` and
    ``staleness`` are read from it on first use, so a round costs no Python
    work per rank unless someone asks.

    Example::

        for result in hvd.synchronize(handle):
            print(result.round, result.contributors, result.staleness)
    """

    __slots__ = ("round", "initiator", "array", "arrays", "flush", "buffers", "_contributors", "_staleness",
                 "_row", "_count", "world_size", "world_version")

    def __init__(self, round: int, initiator: int | None, contributors: list[int] | None = None,
                 staleness: dict[int, int] | None = None, array: Any = None, arrays: list[Any] | None = None,
                 flush: bool = False, buffers: list[Any] | None = None, *, staleness_row: np.ndarray | None = None):
        if staleness_row is None and contributors is None:
            raise TypeError("RoundResult needs contributors or a staleness_row")
        self.round = round
        self.initiator = initiator
        self.array = array
        self.arrays = arrays
        self.flush = flush
        self.buffers = buffers  # the flat reduced buffers
        # The world the round completed on (elastic training: it shrinks when ranks die): its
        # size, which Average divided by, and its version (0 until the first change).
        self.world_size: int | None = None
        self.world_version = 0
        self._contributors = contributors
        self._staleness = staleness if staleness is not None or contributors is None else {}
        self._row = staleness_row
        if contributors is not None:
            self._count = len(contributors)
        else:  # every sync round is all fresh: no need to count
            self._count = len(staleness_row) if _ALL_FRESH.get(len(staleness_row)) is staleness_row else None

    @property
    def contributors(self) -> list[int]:
        if self._contributors is None:
            self._contributors = np.flatnonzero(self._row).tolist()
        return self._contributors

    @property
    def staleness(self) -> dict[int, int]:
        if self._staleness is None:
            ranks = self.contributors
            self._staleness = dict(zip(ranks, (self._row[ranks] - 1).tolist()))
        return self._staleness

    @property
    def has_data(self) -> bool:
        """Some rank's data was summed in this round."""
        return self.contributor_count > 0

    @property
    def contributor_count(self) -> int:
        if self._count is None:
            self._count = int(np.count_nonzero(self._row))
        return self._count

    def staleness_row(self, world_size: int) -> np.ndarray:
        """Per rank: 0 if it summed nothing, else 1 plus its lateness in rounds."""
        if self._row is not None:
            return self._row
        row = np.zeros(world_size, np.int64)
        for rank in self.contributors:
            row[rank] = 1 + self.staleness.get(rank, 0)
        return row

    def facts_only(self) -> "RoundResult":
        """The same round without its arrays (shares the read-only facts)."""
        return RoundResult(self.round, self.initiator, self._contributors, self._staleness, flush=self.flush,
                           staleness_row=self._row)

    def __eq__(self, other) -> bool:
        if not isinstance(other, RoundResult):
            return NotImplemented
        return ((self.round, self.initiator, self.contributors, self.staleness, self.flush)
                == (other.round, other.initiator, other.contributors, other.staleness, other.flush))

    __hash__ = None

    def __repr__(self) -> str:
        return (f"RoundResult(round={self.round}, initiator={self.initiator}, contributors={self.contributors}, "
                f"staleness={self.staleness}, flush={self.flush})")


def any_data(results) -> bool:
    """Whether some round of ``results`` summed somebody's data (or is a flush round, which answers a post)."""
    return any(r.has_data or r.flush for r in results)
