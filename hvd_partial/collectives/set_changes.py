"""Adding and removing process sets (collective: see :mod:`.process_sets`).

Example::

    evens = hvd.add_process_set(range(0, hvd.size(), 2))
    hvd.remove_process_set(evens)
"""

from __future__ import annotations

from .. import session
from ..errors import ProcessSetError
from .functions import run_process_set_request
from .process_sets import ProcessSet, dropped, registry
from .requests import ADD, REMOVE


def add_process_set(process_set) -> ProcessSet:
    """Register ``process_set`` (a :class:`ProcessSet` or a list of ranks) on
    every rank and return it with its ``process_set_id``. Collective: every
    rank calls it, in the same order, with the same ranks.

    Example::

        evens = hvd.add_process_set([0, 2])
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    current = session.require()
    size, rank = current.transport.size, current.transport.rank
    ranks = process_set.ranks
    what = f"add_process_set({process_set})"
    if process_set.is_global:
        raise ProcessSetError(f"rank {rank}: {what}: the global process set is always there; it cannot be added")
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= size:
        raise ProcessSetError(f"rank {rank}: {what}: ranks must be distinct ints in [0, {size}), at least one")
    if process_set.process_set_id is not None and not dropped(current, process_set):
        raise ProcessSetError(f"rank {rank}: {what}: this set is already added")
    if len(ranks) == size:
        raise ProcessSetError(f"rank {rank}: {what}: a duplicate of the global process set (every rank); use "
                              "hvd.global_process_set")
    set_id, engine_comm = run_process_set_request(ADD, tuple(ranks), what)
    current.set_engines.adopt(set_id, engine_comm)
    process_set.adopt(set_id, current.engine)
    registry()[set_id] = process_set
    return process_set


def remove_process_set(process_set) -> bool:
    """Free an added set (collective over every rank, like :func:`add_process_set`)
    and clear its ``process_set_id``; False for the global set and for a set
    not registered in this world (nothing to remove).

    Example::

        hvd.remove_process_set(evens)
    """
    if not isinstance(process_set, ProcessSet) or process_set.is_global or process_set.process_set_id is None:
        return False
    current = session.require()
    set_id = process_set.process_set_id
    process_set.process_set_id = None
    if registry().get(set_id) is process_set:
        del registry()[set_id]
    if dropped(current, process_set):
        return False
    current.set_engines.stop(set_id)  # its members flush and stop the set's engine, if it has one
    return bool(run_process_set_request(REMOVE, (set_id,), f"remove_process_set({process_set})"))


def init_process_sets(process_sets) -> None:
    """``hvd.init(process_sets=...)``: add each set, in order (``"dynamic"`` or None: none)."""
    if process_sets is None or isinstance(process_sets, str) and process_sets.lower() == "dynamic":
        return
    for ps in process_sets:
        if isinstance(ps, ProcessSet) and ps.is_global:
            continue
        add_process_set(ps)
