"""Process sets with Horovod's names. Only the global set is implemented:
``global_process_set`` is accepted by every collective, and any other set
raises :class:`~hvd_partial.errors.NotSupportedError` saying so.

Example::

    hvd.allreduce(x, process_set=hvd.global_process_set)   # fine
    hvd.add_process_set([0, 1])                            # NotSupportedError
"""

from __future__ import annotations

from .. import session
from ..errors import NotSupportedError


class ProcessSet:
    """A set of ranks (Horovod's ``hvd.ProcessSet``). ``ranks=None`` is every rank."""

    def __init__(self, ranks_or_comm=None):
        self.ranks = None if ranks_or_comm is None else sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = 0 if ranks_or_comm is None else None

    def size(self) -> int:
        return session.require().transport.size if self.ranks is None else len(self.ranks)

    def rank(self) -> int:
        mine = session.require().transport.rank
        return mine if self.ranks is None else self.ranks.index(mine)

    def included(self) -> bool:
        return self.ranks is None or session.require().transport.rank in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet(ranks={self.ranks})"


global_process_set = ProcessSet()


def add_process_set(process_set) -> ProcessSet:
    """Horovod registers sub-communicators here; hvd_partial has only the global set."""
    raise NotSupportedError(
        f"add_process_set({process_set!r}): hvd_partial supports only hvd.global_process_set; run a separate "
        "job per group, or pass the group's communicator to hvd.init(comm=...)")


def remove_process_set(process_set) -> bool:
    """Only sets added with :func:`add_process_set` can be removed: none here."""
    if process_set is global_process_set:
        raise NotSupportedError("remove_process_set: the global process set cannot be removed")
    return False


def check_process_set(process_set, what: str) -> None:
    if process_set is None or process_set is global_process_set or (
            isinstance(process_set, ProcessSet) and process_set.ranks is None):
        return
    raise NotSupportedError(f"{what}: process_set={process_set!r}: hvd_partial supports only "
                                "hvd.global_process_set")
