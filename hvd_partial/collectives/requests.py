"""What a helper collective asks of the negotiation: a request.

A request carries the caller's arrays and two descriptions: ``signature``,
the fields every rank must agree on (compared across ranks before data moves,
as Horovod's coordinator does), and ``info``, what each rank may pass
differently (the first dimension of an allgather, an alltoall's splits, the
byte length of a broadcast object). Both travel in the negotiation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# Request kinds.
ALLREDUCE = "allreduce"
GROUPED_ALLREDUCE = "grouped_allreduce"
ALLGATHER = "allgather"
BROADCAST = "broadcast"
ALLTOALL = "alltoall"
REDUCESCATTER = "reducescatter"
BARRIER = "barrier"
JOIN = "join"
# Adding or removing a process set (on every rank, in negotiation order).
PROCESS_SET = "process_set"
# What a PROCESS_SET request asks (add_process_set, remove_process_set); the engine
# runs them in the same order on every rank (negotiator.py).
ADD = "add"
REMOVE = "remove"
# Not a collective: ``finish(None)`` runs on the engine thread at submission
# (how compute threads change what only the engine thread touches).
LOCAL = "local"


@dataclass
class Request:
    """One helper collective submitted on one rank.

    ``signature`` is a tuple of ``(field, value)`` pairs; ``finish`` turns the
    raw result the negotiator computed into the handle's value (on the engine
    thread); ``release`` is called once the request is over, whatever the
    outcome (it frees the name for reuse). ``process_set``: the id of the
    process set it runs on (0: every rank); names are matched per set.
    """

    name: str
    kind: str
    signature: tuple
    info: Any
    arrays: list
    handle: Any
    finish: Callable[[Any], Any] | None = None
    release: Callable[[], None] | None = None
    submitted_at: float = 0.0
    extra: dict = field(default_factory=dict)
    process_set: int = 0

    def announcement(self) -> tuple:
        """What the negotiation sends about this request (picklable)."""
        return (self.process_set, self.name, self.kind, self.signature, self.info)


def differences(name: str, kind: str, signatures: dict[int, tuple]) -> str | None:
    """Describe the first field on which ranks disagree, or None.

    The text is a pure function of ``signatures`` (rank -> signature), so
    every rank that computes it raises the same message.
    """
    ranks = sorted(signatures)
    fields_by_rank = {r: dict(signatures[r]) for r in ranks}
    reference = fields_by_rank[ranks[0]]
    names = list(reference)
    for r in ranks[1:]:
        for key in fields_by_rank[r]:
            if key not in names:
                names.append(key)
    for key in names:
        groups: dict[Any, list[int]] = {}
        for r in ranks:
            groups.setdefault(repr(fields_by_rank[r].get(key, "<missing>")), []).append(r)
        if len(groups) > 1:
            parts = "; ".join(f"{_ranks_text(rs)}: {value}" for value, rs in
                              sorted(groups.items(), key=lambda item: item[1][0]))
            return (f"{kind} {name!r}: ranks disagree on {key} ({parts}); every rank must pass the same "
                    f"{key} under one name")
    return None


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
