"""The result of one round of a stream, as handed to the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundResult:
    """One round's reduced value and its facts.

    ``array`` is the result for a stream of one array; ``arrays`` the list of
    results for a grouped stream (``array`` is then ``None``). ``contributors``
    are the sorted ranks whose data was summed; ``staleness[rank]`` is how many
    rounds late that rank's data was (0 is fresh). ``initiator`` is the rank that
    started the round, or ``None`` for sync and flush rounds.

    Example::

        for result in hvd.synchronize(handle):
            print(result.round, result.contributors, result.staleness)
    """

    round: int
    initiator: int | None
    contributors: list[int]
    staleness: dict[int, int]
    array: Any = None
    arrays: list[Any] | None = None
    flush: bool = False
    buffers: list[Any] = field(default=None, repr=False)  # the flat reduced buffers


def any_data(results) -> bool:
    """Whether some round of ``results`` summed somebody's data (or is a flush round, which answers a post)."""
    return any(r.contributors or r.flush for r in results)
