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

With ``hosts_file`` set (``hvd-partial-run --host-discovery-script``),
:func:`follow_hosts` replaces step 1's trigger: the ranks plan from rank 0's
copy of the launcher's hosts file (:func:`~hvd_partial.core.hosts.plan_world`)
and, with every stream at rest, stop the engine, split off the ranks whose
hosts were drained (they raise :class:`~hvd_partial.errors.RankDrained`),
spawn ranks on free slots, and go on from step 4 (docs/elastic.md, "Hosts
from a discovery script").

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
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from .. import faults, session
from ..collectives.functions import adopt_name_counters, allgather_object, name_counters, run_on_engine
from ..core.growth import agreed_rounds
from ..core.hosts import plan_world, same_host
from ..core.world import World
from ..errors import RankFailedError
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
    program); with ``hosts_file`` set, follow the discovered hosts instead
    (:func:`follow_hosts`). Returns the number of ranks started (0: none)."""
    current = session.require()
    config, engine = current.config, current.engine
    if not config.elastic:
        return 0
    if config.hosts_file:
        return follow_hosts(current)
    world = engine.world
    missing = config.max_np - world.size
    if missing <= 0:
        return 0
    began = time.perf_counter()
    reports = allgather_object(run_on_engine(engine.readout.streams_at_rest), name=GROW_CHECK)
    carried = _at_rest(world, agreed_rounds(reports), f"has {world.size} of max_np {config.max_np} ranks")
    if carried is None:
        return 0
    return _change(current, carried, (), ((None, missing),), began)


def follow_hosts(current) -> int:
    """With ``hosts_file`` (``hvd-partial-run --host-discovery-script``): rank 0 reads the
    discovered hosts, every rank receives its copy and where every rank runs in one helper
    collective, and all plan alike (:func:`~hvd_partial.core.hosts.plan_world`): the ranks
    of hosts no longer listed drain (:class:`~hvd_partial.errors.RankDrained` on them), new
    ranks start on free slots. Waits for a later commit unless every stream is at rest.
    Returns the number of ranks started."""
    config, engine = current.config, current.engine
    world = engine.world
    began = time.perf_counter()
    document = read_hosts_file(config.hosts_file) if world.rank == 0 else None
    reports = allgather_object((run_on_engine(engine.readout.streams_at_rest), socket.gethostname(), document),
                               name=GROW_CHECK)
    document = reports[0][2]
    if document is None:
        return 0
    plan = plan_world([(name, slots) for name, slots in document["hosts"]], [r[1] for r in reports],
                      document["launcher_host"], config.min_np, config.max_np)
    if not plan.changes:
        return 0
    carried = _at_rest(world, agreed_rounds([r[0] for r in reports]),
                       f"of {world.size} ranks is to become {plan.target} (discovered hosts, serial "
                       f"{document['serial']})")
    if carried is None:
        return 0
    return _change(current, carried, plan.leave, plan.spawn, began, document["launcher_host"])


def read_hosts_file(path: str) -> dict | None:
    """The launcher's hosts document (:func:`~hvd_partial.core.hosts.hosts_document`), or
    None (logged) when it cannot be read: the world then stays as it is."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as err:
        log.warning("could not read the discovered hosts from %s (%s); the world stays as it is", path, err)
        return None


def _at_rest(world: World, carried: dict | None, what: str) -> dict | None:
    if carried is None:
        log.info("rank %d: the world %s, but some stream is not at rest on every rank (flush every stream "
                 "before state.commit()); the change waits for a later commit", world.rank, what)
    return carried


def _change(current, carried: dict, leave: tuple, spawn: tuple, began: float, launcher_host: str = "") -> int:
    """Every rank: stop the engine, let the ranks ``leave`` go, start ``spawn`` ((host or
    None, count) per group) new ranks, and start a new engine on the new world."""
    engine = current.engine
    world = engine.world
    before = world.size
    decided = time.perf_counter()
    count = sum(c for _, c in spawn)
    names = name_counters()  # (read while the engine runs)
    if world.rank == 0:
        parts = [f"ranks {list(leave)} (numbered {[world.members[r] for r in leave]}) leave, their hosts drained"]
        parts = (parts if leave else []) + [f"starting {n} rank(s) on {host or 'the hosts given to mpirun'}"
                                            for host, n in spawn]
        log.warning("changing the world of %d ranks: %s", before, "; ".join(parts))
    watch = FailureWatch(f"rank {world.rank}", f"the world changed from {before} to {before - len(leave) + count} "
                                              f"ranks", current.config.grow_timeout_seconds)
    watch.follow(current.transport.control, world.members)
    try:
        with watch:
            engine.shutdown()  # flushes every stream (at rest: no round carries data)
            engine.free_stream_comms()
            current.transport.free()
            stopped = time.perf_counter()
            faults.point("grow_stopped")
            from ..transport.ulfm import spawn_and_merge_on, split_off

            comm = current.transport.control
            if leave:
                watch.follow(None)  # (the ranks that leave end soon after the split: no failure)
                comm = split_off(comm, world.rank in leave)
                if comm is None:
                    _leave(current, world)
                world = world.drained(leave, [r for r in range(world.size) if r not in leave].index(world.rank))
                watch.follow(comm, world.members)
            grown_world = world.grown(count) if count else world
            started = grown_world.joined[-count:] if count else ()
            link = None
            if count:
                watch.expect(started)
                placements = [(_spawn_info(host, launcher_host), n) for host, n in spawn]
                grown = spawn_and_merge_on(comm, spawn_command(started[0]), placements)
                comm, link = grown.comm, grown.link
                watch.follow(comm, grown_world.members)
            spawned = time.perf_counter()
            faults.point("grow_merged")
            handshake = Handshake(grown_world, started, carried, names)
            size = len(pickle.dumps(handshake, protocol=pickle.HIGHEST_PROTOCOL))
            comm.bcast(handshake, root=0)
            watch.expect()  # the new ranks are in: from here a failure is one of MPI's
            _start(current, comm, link, handshake, list(engine.unpark_listeners))
    except Exception as err:
        if _mpi_error(err):
            watch.raise_if_lost(err)
        raise
    record = Growth(before, grown_world.size, started, size, began)
    record.seconds = {"check": decided - began, "stop": stopped - decided, "spawn": spawned - stopped,
                      "start": time.perf_counter() - spawned}
    _grown(current).history.append(record)
    log.info("rank %d: the world changed from %d to %d ranks in %.0f ms (%s)", grown_world.rank, before,
             grown_world.size, (time.perf_counter() - began) * 1e3,
             ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in record.seconds.items()))
    return count


def _mpi_error(err: BaseException) -> bool:
    """An error of MPI (mpi4py's), or the grow's :class:`RecoveryError` wrapping one."""
    from ..errors import RecoveryError

    return isinstance(err, RecoveryError) or type(err).__module__.startswith("mpi4py")


class FailureWatch:
    """A rank that dies during a grow is not survived (docs/elastic.md, "What is left"),
    but must not leave the others waiting: MPI's ``Spawn`` waits forever for a participant
    that died, and no engine runs during the grow to notice. While the grow's steps run, a
    thread looks every :attr:`POLL_SECONDS` at the failures MPI knows of on the
    communicator in use (``follow``); on one it logs an error naming the ranks lost (numbered
    as in ``World.members``) and ends this process with status 1, so the job fails instead
    of hanging. A step that raises instead (an MPI error) becomes :class:`RankFailedError`
    naming them (:meth:`raise_if_lost`). Watching MPI's failures needs
    ``MPI_THREAD_MULTIPLE`` (else only the errors are turned into
    :class:`RankFailedError`). A new rank that dies before it joins (an import error, a
    program not found) is no rank of any communicator yet, and ``Spawn`` waits for it
    forever: under ``hvd-partial-run --elastic`` the thread also looks for the rank
    wrapper's record of its end (``expect``), and ends this process the same way; new
    ranks not in after ``join_timeout`` seconds (``grow_timeout_seconds``) end it too."""

    POLL_SECONDS = 0.05
    REPORT_SECONDS = 5.0

    def __init__(self, who: str, what: str, join_timeout: float = float("inf")):
        self._who, self._what = who, what
        self._comm, self._members = None, None
        self._joiners: tuple[int, ...] = ()  # the numbers of the new ranks not in yet
        self._join_timeout = join_timeout
        self._join_deadline = float("inf")  # (time.monotonic) while new ranks are expected
        self._mpi_watch = False  # whether MPI may be asked from this thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def follow(self, comm, members=None) -> None:
        """Watch ``comm`` (None: nothing; an intercommunicator: its remote group) whose rank
        r is numbered ``members[r]`` (None: r)."""
        with self._lock:
            self._comm, self._members = comm, None if members is None else tuple(members)

    def expect(self, numbers=()) -> None:
        """Watch for the end of the new ranks numbered ``numbers`` (by the launcher's records)
        until they are in (``expect()`` then)."""
        with self._lock:
            self._joiners = tuple(numbers)
            self._join_deadline = time.monotonic() + self._join_timeout if numbers else float("inf")

    def ended_joiners(self) -> dict:
        """The expected new ranks that ended (number -> the launcher's record or None)."""
        from ..launch.rank_status import ended_joiners

        with self._lock:
            return ended_joiners(self._joiners) if self._joiners else {}

    def lost(self) -> list[int]:
        """The ranks of the watched communicator MPI knows have failed, numbered as members."""
        from ..transport.ulfm import failed_ranks

        with self._lock:
            if self._comm is None:
                return []
            return [r if self._members is None else self._members[r] for r in failed_ranks(self._comm)]

    def raise_if_lost(self, err: BaseException) -> None:
        """Raise :class:`RankFailedError` from ``err`` (a grow step's) if a rank failed: MPI may
        report the failure itself a moment after the error it caused (``Spawn``'s root gets
        ``MPI_ERR_INTERN``), so look for :attr:`REPORT_SECONDS` before concluding there was none."""
        deadline = time.monotonic() + self.REPORT_SECONDS
        lost, ended = self.lost(), self.ended_joiners()
        while not (lost or ended) and time.monotonic() < deadline:
            time.sleep(self.POLL_SECONDS)
            lost, ended = self.lost(), self.ended_joiners()
        if lost and not ended:  # an old rank that a dead new rank made leave was not the cause
            ended = self.ended_joiners()
        if ended:
            message = self._joiners_ended(ended)
            log.error("%s", message)
            raise RankFailedError(min(ended), f"{message} ({self._who} got: {err})") from err
        if lost:
            raise RankFailedError(lost[0], f"rank(s) {lost} died while {self._what} ({self._who} got: {err}); "
                                           f"a failure during a grow is not survived") from err

    def _joiners_ended(self, ended: dict) -> str:
        from ..launch.rank_status import describe

        return (f"{self._who}: new rank(s) "
                f"{', '.join(f'{n} ({describe(record)})' for n, record in sorted(ended.items()))} ended before "
                f"joining while {self._what}; a failure during a grow is not survived")

    def __enter__(self):
        from mpi4py import MPI

        self._mpi_watch = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self._thread = threading.Thread(target=self._run, name="hvdp-grow-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.POLL_SECONDS):
            lost = self.lost() if self._mpi_watch else []
            ended = self.ended_joiners()
            with self._lock:
                late = self._joiners if time.monotonic() > self._join_deadline else ()
            if self._stop.is_set() or not (lost or ended or late):
                continue
            if ended:  # (an old rank lost with it left because of it)
                log.error("%s: ending this process", self._joiners_ended(ended))
            elif late and not lost:
                log.error("%s: new rank(s) %s did not join within %.0f s (grow_timeout_seconds) while %s; a "
                          "failure during a grow is not survived: ending this process", self._who,
                          ", ".join(map(str, late)), self._join_timeout, self._what)
            else:
                log.error("%s: rank(s) %s died while %s; a failure during a grow is not survived: ending this "
                          "process", self._who, lost, self._what)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            logging.shutdown()
            os._exit(1)


def _leave(current, world: World):
    """This rank's host was drained: its engine has stopped (every round it took part in
    completed everywhere), so end its session, tell the launcher, make sure the process
    ends without ``MPI_Finalize`` (which would wait for the whole job), and raise
    :class:`RankDrained`."""
    from ..errors import RankDrained
    from ..launch.rank_status import note_drained

    session.end()
    note_drained()
    _exit_without_finalize()
    log.warning("rank %d (numbered %d) leaves the world: its host is no longer listed by the discovery script "
                "(or lists fewer slots); every round it took part in is summed on the others", world.rank,
                world.original_rank)
    raise RankDrained(f"rank {world.rank} (numbered {world.original_rank}) left the world: its host was drained")


def _exit_without_finalize() -> None:
    """At this process's exit, end it before ``MPI_Finalize`` (registered last, so run
    first), with status 1 after an uncaught exception, else 0."""
    import atexit

    failed = []
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        failed.append(exc_type)
        previous(exc_type, exc, tb)

    def leave():
        from ..launch.rank_status import mark_exit_now

        mark_exit_now()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(1 if failed else 0)

    sys.excepthook = hook
    atexit.register(leave)


def join_grown_world():
    """In ``init`` with elastic on: None unless this process was started by a grow;
    then the merged communicator's :class:`~hvd_partial.transport.ulfm.Grown` and the
    :class:`Handshake` rank 0 sent (steps 3 and 4 of the module docstring)."""
    from mpi4py import MPI

    from ..transport.ulfm import has_parent, join_parent_link

    if not has_parent():
        return None
    watch = FailureWatch("a process started by a grow", "it joined the grown world (numbered as the ranks that "
                                                        "started it)")
    watch.follow(MPI.Comm.Get_parent())
    try:
        with watch:
            grown = join_parent_link()
            watch.follow(grown.comm)
            handshake = grown.comm.bcast(None, root=0)
    except Exception as err:
        if _mpi_error(err):
            watch.raise_if_lost(err)
        raise
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


def _start(current, comm, link, handshake: Handshake, listeners: list) -> None:
    """Every old rank of the new world (a new one starts in ``init``): a new transport
    and engine on ``comm``; ``link`` (the grow's, or None) is kept until shutdown."""
    from ..transport.mpi import MpiTransport

    config = current.config
    transport = MpiTransport(comm, doorbell=config.doorbell, quorum_counters=True, elastic=True)
    transport.barrier()
    engine = Engine(transport, config, **engine_arguments(handshake, transport.rank))
    engine.unpark_listeners.extend(listeners)
    engine.start()
    current.engine, current.transport = engine, transport
    if link is not None:
        _grown(current).links.append(link)


def _spawn_info(host: str | None = None, launcher_host: str = ""):
    """``Spawn``'s info: the new processes start in the directory this program started in
    (the rank wrapper's; the program may have changed directory since, and its path on the
    command line may be relative), else in this process's working directory; on ``host``
    unless it is None or this one (Open MPI's ``host`` and ``add-host``: a host the
    discovery script added may not be in the job's allocation yet)."""
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("wdir", os.environ.get(PROGRAM_DIR_ENV) or os.getcwd())
    if host is not None and not same_host(host, socket.gethostname(), launcher_host):
        info.Set("add-host", host)
        info.Set("host", host)
    return info
