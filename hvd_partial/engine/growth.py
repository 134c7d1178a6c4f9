"""Growing the world back (elastic training): new processes take the places
of dead ranks, at a point where every stream is at rest (docs/elastic.md,
"Growing back").

On the ranks already there, :func:`grow_world` (called by every rank at the
same point: the elastic API's ``check_host_updates``, after its helper
collective succeeded, so the world is agreed and acknowledged) does nothing
while the world has ``max_np`` ranks. Below that:

1. every rank reports, per stream, whether it is at rest and its rounds
   (:meth:`~.readout.EngineReadout.streams_at_rest`, gathered with one helper
   collective); unless every report is the same and every stream at rest,
   the grow waits for a later commit (every rank decides alike from the same
   reports);
2. the engine shuts down (its shutdown flushes every stream: at rest, so no
   round carries data) and frees the streams' communicators;
3. the ranks ``Spawn`` the missing processes, running the same program with
   the same arguments (through ``hvd-partial-run``'s rank wrapper when it
   started them), and ``Merge`` with them, the new ranks last
   (:func:`~hvd_partial.transport.ulfm.spawn_and_merge`);
4. rank 0 broadcasts the :class:`Handshake`: the new world, every stream's
   name and rounds, the counters of unnamed helper calls;
5. every rank, old and new, starts a new engine on the merged communicator;
   streams register again at their first post and number their rounds on.

A new process learns that it joins from its parent intercommunicator:
``hvd_partial.init`` calls :func:`join_grown_world`, which takes steps 3 to 5
from its side. Its ``hvd.elastic.run`` then starts, as always, with
``state.sync()``, which sends it rank 0's model and optimizer; the old ranks
get ``HostsUpdatedInterrupt`` from the commit, reset and sync the same way.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import time
from dataclasses import dataclass, field

from .. import session
from ..collectives.functions import adopt_name_counters, allgather_object, name_counters, run_on_engine
from ..core.growth import agreed_rounds
from ..core.world import World
from ..launch.rank_status import PROGRAM_DIR_ENV, PROGRAM_ENV, RESPAWN_ENV
from .engine import Engine

log = logging.getLogger("hvd_partial.elastic")

#: The helper collective by which the ranks compare their streams before a grow.
GROW_CHECK = "hvd_partial.elastic.grow"


@dataclass(frozen=True)
class Handshake:
    """What rank 0 sends every rank of the grown world: the world (as rank 0
    sees it), the ranks this grow started, per stream the rounds completed so
    far, and the counters of unnamed helper calls (``allreduce.noname.<n>``)."""

    world: World
    started: tuple[int, ...]
    carried: dict[str, int]
    names: dict[str, int]


@dataclass
class Growth:
    """What one grow did, on this rank: the sizes, the ranks started (numbered
    after every earlier rank), the bytes of the handshake and how long each
    step took (seconds): ``check`` (comparing the streams), ``stop`` (the old
    engine's shutdown), ``spawn`` (Spawn and Merge; on a new rank, from its
    start to the merge is not counted), ``start`` (handshake and new engine).
    ``began`` is ``time.perf_counter()`` when the grow was decided."""

    before: int
    after: int
    started: tuple[int, ...]
    handshake_bytes: int
    began: float
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _Grown:
    """A session's grows: what each did, and the links to keep until shutdown."""

    history: list = field(default_factory=list)
    links: list = field(default_factory=list)


def _grown(current) -> _Grown:
    return current.adapter_state("growth", _Grown)


def history() -> list[Growth]:
    """This session's grows, oldest first (empty before the first)."""
    return list(_grown(session.require()).history)


def spawn_command(first: int) -> list[str]:
    """The command that starts the new ranks: the program and its arguments as this
    process runs them, through hvd-partial-run's rank wrapper when it started this one
    (``--member first``: the wrapper's records name the new ranks by their numbers)."""
    program = json.loads(os.environ.get(PROGRAM_ENV) or "null") or [sys.executable, *sys.orig_argv[1:]]
    wrapper = json.loads(os.environ.get(RESPAWN_ENV) or "null")
    return [*wrapper, "--member", str(first), *program] if wrapper else list(program)


def grow_world() -> int:
    """Grow the world back to ``max_np`` ranks if it is smaller and every stream
    is at rest (collective over the current ranks, at the same point of the
    program). Returns the number of ranks started (0: none)."""
    current = session.require()
    config, engine = current.config, current.engine
    world = engine.world
    missing = config.max_np - world.size
    if not config.elastic or missing <= 0:
        return 0
    began = time.perf_counter()
    reports = allgather_object(run_on_engine(engine.readout.streams_at_rest), name=GROW_CHECK)
    carried = agreed_rounds(reports)
    if carried is None:
        log.info("rank %d: the world has %d of max_np %d ranks, but some stream is not at rest on every rank "
                 "(flush every stream before state.commit()); growing waits for a later commit",
                 world.rank, world.size, config.max_np)
        return 0
    checked = time.perf_counter()
    grown_world = world.grown(missing)
    started = grown_world.joined[-missing:]
    command = spawn_command(started[0])
    names = name_counters()  # (read while the engine runs)
    if world.rank == 0:
        log.warning("growing the world from %d to %d ranks: starting ranks %s (numbered after every earlier "
                    "rank): %s", world.size, grown_world.size, list(started), " ".join(command))
    engine.shutdown()  # flushes every stream (at rest: no round carries data)
    engine.free_stream_comms()
    transport = current.transport
    transport.free()
    stopped = time.perf_counter()
    from ..transport.ulfm import spawn_and_merge

    grown = spawn_and_merge(transport.control, command, missing, info=_spawn_info())
    spawned = time.perf_counter()
    handshake = Handshake(grown_world, started, carried, names)
    size = len(pickle.dumps(handshake, protocol=pickle.HIGHEST_PROTOCOL))
    grown.comm.bcast(handshake, root=0)
    _start(current, grown, handshake, list(engine.unpark_listeners))
    record = Growth(world.size, grown_world.size, started, size, began)
    record.seconds = {"check": checked - began, "stop": stopped - checked, "spawn": spawned - stopped,
                      "start": time.perf_counter() - spawned}
    _grown(current).history.append(record)
    log.info("rank %d: the world grew from %d to %d ranks in %.0f ms (%s)", world.rank, world.size,
             grown_world.size, (time.perf_counter() - began) * 1e3,
             ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in record.seconds.items()))
    return missing


def join_grown_world():
    """In ``init`` with elastic on: None unless this process was started by a grow;
    then the merged communicator's :class:`~hvd_partial.transport.ulfm.Grown` and the
    :class:`Handshake` rank 0 sent (steps 3 and 4 of the module docstring)."""
    from ..transport.ulfm import has_parent, join_parent_link

    if not has_parent():
        return None
    grown = join_parent_link()
    handshake = grown.comm.bcast(None, root=0)
    return grown, handshake


def engine_arguments(handshake: Handshake, rank: int) -> dict:
    """The keyword arguments of :class:`Engine` for rank ``rank`` of the grown world."""
    return {"world": handshake.world.as_rank(rank), "carried": handshake.carried}


def joined(current, grown, handshake: Handshake) -> None:
    """A new rank's session has started (``init``): number unnamed helper calls as the
    others do, keep the link to the parents until shutdown, note what it received."""
    adopt_name_counters(handshake.names)
    state = _grown(current)
    state.links.append(grown.link)
    world = handshake.world
    state.history.append(Growth(world.size - len(handshake.started), world.size, handshake.started,
                                len(pickle.dumps(handshake, protocol=pickle.HIGHEST_PROTOCOL)), time.perf_counter()))
    log.info("rank %d (started as rank %d, numbered after every earlier rank) joined a world of %d ranks, version %d",
             current.engine.world.rank, current.engine.world.original_rank, world.size, world.version)


def disconnect_links(current) -> None:
    """At shutdown, after a clean stop: disconnect the links of every grow this process
    took part in, oldest first (Open MPI's MPI_Finalize crashes on a freed link)."""
    from ..transport.ulfm import disconnect

    for link in _grown(current).links:
        disconnect(link)
    _grown(current).links.clear()


def _start(current, grown, handshake: Handshake, listeners: list) -> None:
    """Every rank of the grown world (old ones here, a new one in ``init``): a new
    transport and engine on the merged communicator."""
    from ..transport.mpi import MpiTransport

    config = current.config
    transport = MpiTransport(grown.comm, doorbell=config.doorbell, quorum_counters=True, elastic=True)
    transport.barrier()
    engine = Engine(transport, config, **engine_arguments(handshake, transport.rank))
    engine.unpark_listeners.extend(listeners)
    engine.start()
    current.engine, current.transport = engine, transport
    _grown(current).links.append(grown.link)


def _spawn_info():
    """``Spawn``'s info: the new processes start in the directory this program started in
    (the rank wrapper's; the program may have changed directory since, and its path on the
    command line may be relative), else in this process's working directory."""
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("wdir", os.environ.get(PROGRAM_DIR_ENV) or os.getcwd())
    return info
