"""Process sets with Horovod's names and semantics: helper collectives among
some ranks only.

- ``ProcessSet(ranks)`` describes a set; ``add_process_set(ranks_or_set)``
  registers it (collective: every rank calls it, in the same order, with the
  same ranks) and returns it with its ``process_set_id`` (the smallest free
  id from 1; the global set is 0). A set with the ranks of one already added,
  or of the global set, raises :class:`~hvd_partial.errors.ProcessSetError`
  (a ``ValueError``, as in Horovod).
- ``remove_process_set(set)`` (collective too) frees the set and clears its
  id; it returns False for the global set and for a set not registered.
- ``hvd.init(process_sets=[...])`` adds each listed set at start-up.
- Every helper collective (``allreduce``, ``grouped_allreduce``,
  ``allgather``, ``broadcast``, ``alltoall``, ``reducescatter``,
  ``broadcast_object``, ``allgather_object``, ``barrier``) takes
  ``process_set=`` and runs among the set's members only, on an MPI
  communicator of the set's own (split from the helper communicator when
  the set is added). ``root_rank`` stays a global rank; an alltoall's
  ``splits`` has one entry per member; results are ordered by set rank.
  A rank outside the set that calls a collective on it gets a
  ``ProcessSetError`` naming the rank and the set.
- Solo and majority streams on a set (PyTorch's ``DistributedOptimizer(...,
  process_set=s, mode=Solo())``) run on the set's own engine, a world of the
  set's members (:mod:`.set_engines`); ``remove_process_set`` stops it first.
- Elastic training: a set belongs to the world it was added in. When the
  world changes (a shrink or a grow), every set is dropped; passing one
  raises ``ProcessSetError`` saying so, and the program adds its sets again
  (in the reset callback) for the new world's ranks.

Example::

    evens = hvd.add_process_set(range(0, hvd.size(), 2))
    if evens.included():
        total = hvd.allreduce(x, op=hvd.Sum, process_set=evens)
    hvd.remove_process_set(evens)
"""

from __future__ import annotations

import weakref

from .. import session
from ..errors import NotSupportedError, ProcessSetError


class ProcessSet:
    """A set of ranks (Horovod's ``hvd.ProcessSet``): pass it to
    :func:`add_process_set` or ``hvd.init(process_sets=[...])``, then to the
    collectives' ``process_set=``. ``ranks`` is kept sorted;
    ``process_set_id`` is None until the set is added (and again once removed).

    Example::

        odds = hvd.add_process_set(hvd.ProcessSet([1, 3]))
        odds.size(), odds.rank(), odds.included()
    """

    def __init__(self, ranks_or_comm):
        if isinstance(ranks_or_comm, (str, bytes)) or not hasattr(ranks_or_comm, "__iter__"):
            raise NotSupportedError(
                f"ProcessSet({ranks_or_comm!r}): hvd_partial builds process sets from a list of ranks only "
                "(not from an MPI communicator); pass the communicator's ranks in the global one")
        ranks = list(ranks_or_comm)
        if any(isinstance(r, bool) or not isinstance(r, int) and not hasattr(r, "__index__") for r in ranks):
            raise ProcessSetError(f"ProcessSet({ranks!r}): ranks must be ints")
        self._ranks = sorted(int(r) for r in ranks)
        self._global = False
        self.process_set_id: int | None = None
        self.mpi_comm = None  # Horovod's attribute: always None here
        self._engine = None  # a weak reference to the engine (world) the set was added in

    @property
    def ranks(self) -> list[int]:
        if self._global:
            current = session.current()
            return list(range(current.transport.size)) if current is not None else []
        return list(self._ranks)

    @ranks.setter
    def ranks(self, value) -> None:
        if self._global:
            raise ProcessSetError("the global process set's ranks are every rank; they cannot be set")
        self._ranks = sorted(int(r) for r in value)

    @property
    def is_global(self) -> bool:
        """Whether this is ``global_process_set`` (every rank, id 0)."""
        return self._global

    def adopt(self, set_id: int, engine) -> None:
        """Record that the set was added under ``set_id`` in ``engine``'s current world."""
        self.process_set_id = set_id
        self._engine = (weakref.ref(engine), engine.world.version)

    def size(self) -> int | None:
        """The number of ranks in the set (None until it is added)."""
        if self._global:
            return session.require().transport.size
        return None if self.process_set_id is None else len(self._ranks)

    def rank(self) -> int | None:
        """This rank's index in the set (None until it is added). Collectives
        still take global ranks (``root_rank``); this numbers their results."""
        if self._global:
            return session.require().transport.rank
        if self.process_set_id is None:
            return None
        mine = session.require().transport.rank
        if mine not in self._ranks:
            raise ProcessSetError(f"rank {mine} is not in {self}: it has no rank in the set")
        return self._ranks.index(mine)

    def included(self) -> bool:
        """Whether this rank belongs to the set."""
        return self._global or session.require().transport.rank in self._ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm=None)"

    __repr__ = __str__


def _make_global() -> ProcessSet:
    ps = ProcessSet([])
    ps._global = True
    ps.process_set_id = 0
    return ps


global_process_set = _make_global()


def dropped(current, ps: ProcessSet) -> bool:
    """Whether ``ps`` was added in another engine or world than the current one."""
    owner = ps._engine
    engine = current.engine
    return owner is None or owner[0]() is not engine or owner[1] != engine.world.version


def set_engine(process_set):
    """The engine of ``process_set``'s own solo and majority streams on this rank (a
    member), started on first use: collective over the set's members
    (:mod:`.set_engines`)."""
    set_id, _ = resolve(process_set, "a solo or majority stream on a process set")
    current = session.require()
    return current.set_engines.engine(set_id, str(process_set), current)


def resolve(process_set, what: str) -> tuple[int, list[int] | None]:
    """``(id, ranks)`` of ``process_set`` for a collective (``ranks`` None for the
    global set); raises ``ProcessSetError`` where this rank may not use it."""
    if process_set is None or process_set is global_process_set:
        return 0, None
    if not isinstance(process_set, ProcessSet):
        raise ProcessSetError(f"{what}: process_set must be a hvd.ProcessSet, got {process_set!r}")
    if process_set._global:
        return 0, None
    rank = check_added(process_set, what)
    if rank not in process_set._ranks:
        raise ProcessSetError(f"rank {rank}: {what}: this rank is not in {process_set}; only its members may call "
                              "collectives on it")
    return process_set.process_set_id, list(process_set._ranks)


def check_added(process_set: ProcessSet, what: str) -> int:
    """Raise ``ProcessSetError`` unless ``process_set`` is added in this world; returns this rank."""
    current = session.require()
    rank = current.transport.rank
    if process_set.process_set_id is None:
        raise ProcessSetError(f"rank {rank}: {what}: {process_set} was never added or was removed; call "
                              "hvd.add_process_set first")
    if process_set._engine is None:
        raise ProcessSetError(f"rank {rank}: {what}: {process_set} was never added (its process_set_id was not "
                              "given by hvd.add_process_set)")
    if dropped(current, process_set):
        raise ProcessSetError(
            f"rank {rank}: {what}: {process_set} was dropped: the world changed since it was added (elastic "
            "training) or hvd_partial was initialized again; add it again with hvd.add_process_set")
    return rank


def members_size(ranks: list[int] | None) -> int:
    """The number of ranks a collective on a set of ``ranks`` (None: global) runs among."""
    return session.require().transport.size if ranks is None else len(ranks)


def check_process_set(process_set, what: str) -> None:
    """Raise unless this rank may run ``what`` on ``process_set`` (see :func:`resolve`)."""
    resolve(process_set, what)


def check_usable(process_set, what: str) -> ProcessSet:
    """The set ``what`` runs on (the global one for None), once it is known to be a
    set added in this world; ``ProcessSetError`` otherwise. Membership is not
    checked: a rank outside the set gets its ``ProcessSetError`` from the
    collective itself (an op that fails when it runs, as in Horovod)."""
    if process_set is None or process_set is global_process_set:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise ProcessSetError(f"{what}: process_set must be a hvd.ProcessSet, got {process_set!r}")
    if process_set.process_set_id is None:  # (also before init)
        raise ProcessSetError(f"{what}: {process_set} was never added or was removed; call hvd.add_process_set "
                              "first")
    if not process_set.is_global:
        check_added(process_set, what)
    return process_set


class _Registry:
    """Per session: the sets added in it, by id (for Horovod's ``process_set_id`` arguments)."""

    def __init__(self):
        self.sets: dict[int, ProcessSet] = {}


def registry() -> dict:
    """This session's added sets by id (set_changes keeps it)."""
    return session.require().adapter_state("process_sets", _Registry).sets


def by_id(process_set_id, what: str) -> ProcessSet:
    """The set added in this world under ``process_set_id`` (0: the global one);
    ``ProcessSetError`` (a ``ValueError``) for an id no set has."""
    if process_set_id == 0:
        return global_process_set
    found = registry().get(process_set_id)
    if found is None or found.process_set_id != process_set_id or dropped(session.require(), found):
        raise ProcessSetError(f"rank {session.require().transport.rank}: {what}: no process set has id "
                              f"{process_set_id} (add one with hvd.add_process_set)")
    return found
