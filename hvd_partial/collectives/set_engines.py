"""A process set's own engine: solo and majority rounds among the set's members.

A process set is a world of its own for partial rounds. When the set is added
(:mod:`.set_changes`) each member gets a communicator of the set's members for
it (the set's helper channel makes it, see
:meth:`~hvd_partial.transport.helper_channel.HelperChannel.on`); the first
solo or majority stream on the set (``DistributedOptimizer(...,
process_set=s, mode=Solo())``) starts, on each member, a second
:class:`~hvd_partial.engine.engine.Engine` over an
:class:`~hvd_partial.transport.mpi.MpiTransport` on that communicator. Its
driver, liveness, pacing and doorbells run with set ranks and set size: the
set's rounds, staleness and quorum are its own, and ranks outside the set
never hear of them.

This registry (one per session, :attr:`hvd_partial.session.Session.set_engines`)
is the only owner of the set engines:

- :meth:`SetEngines.engine` starts a set's engine on first use. Collective over
  the set's members: each member makes its first solo or majority stream on a
  set in the same order relative to its other sets' first ones.
- :meth:`SetEngines.stop` (``remove_process_set``, on the set's members) and
  :meth:`SetEngines.stop_all` (``shutdown()``, before the session's engine
  stops) shut a set engine down as the session's engine shuts down: every
  stream of the set is flushed (its final rounds reduced on every member), or
  the engine's failure is raised; then its stream communicators and transport
  are freed. The set's communicators stay with the set's helper channel (freed
  when the set is removed).
- Elastic training (``elastic=True``) refuses set engines: a world change
  drops every set, and a set engine would be left on a communicator whose
  ranks may be gone (see docs/design.md, "Process sets").

Example::

    engine = process_sets.set_engine(evens)   # members of evens only
    session.require().set_engines.stop(evens.process_set_id)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading

from ..errors import NotSupportedError, ProcessSetError

log = logging.getLogger("hvd_partial.collectives")


class SetEngines:
    """The engines of one session's process sets, by set id (see the module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._comms: dict[int, object] = {}  # set id -> its engine's communicator (sets this rank is in)
        self._engines: dict[int, tuple] = {}  # set id -> (engine, transport, stream name counter), once started

    def adopt(self, set_id: int, comm) -> None:
        """The set ``set_id`` was added; ``comm`` is its engine's communicator (None: not a member)."""
        with self._lock:
            if comm is not None:
                self._comms[set_id] = comm

    def engine(self, set_id: int, label: str, current):
        """The engine of set ``set_id`` (``label``: the set, for errors), started on first
        use (``current``: the session). The caller checked that the set is added and this
        rank a member (:func:`hvd_partial.collectives.process_sets.set_engine`)."""
        with self._lock:
            started = self._engines.get(set_id)
            if started is not None:
                return started[0]
            comm = self._comms.get(set_id)
            if comm is None:  # added in an earlier session or world (resolve checked this rank is a member)
                raise ProcessSetError(f"{label} has no engine communicator on this rank; add it again")
            self._engines[set_id] = started = _start(comm, current.config, set_id)
            # A wait on any engine of this process parks the streams of all (docs/design.md, "Parked ranks").
            session_engine = current.engine
            session_engine.companions = self.running
            started[0].companions = lambda: [session_engine, *(e for e in self.running() if e is not started[0])]
            return started[0]

    def running(self) -> list:
        """The set engines started and not stopped, in set id order."""
        with self._lock:
            return [self._engines[i][0] for i in sorted(self._engines)]

    def next_name(self, set_id: int) -> int:
        """The number of the next unnamed optimizer stream on set ``set_id``'s engine (the
        members wrap their optimizers in the same order, so they agree on it)."""
        with self._lock:
            return next(self._engines[set_id][2])

    def stop(self, set_id: int) -> None:
        """Shut set ``set_id``'s engine down, if started (collective over its members), and forget it."""
        with self._lock:
            self._comms.pop(set_id, None)
            started = self._engines.pop(set_id, None)
        if started is not None:
            _stop(*started[:2])

    def stop_all(self) -> None:
        """Shut every started set engine down, in set id order (``shutdown()``: every rank
        stops its sets in the same order, so that no member waits on another set's members)."""
        with self._lock:
            set_ids = sorted(self._engines)
        for set_id in set_ids:
            self.stop(set_id)


def _start(comm, config, set_id: int) -> tuple:
    from mpi4py import MPI

    from ..engine.engine import Engine
    from ..transport.mpi import MpiTransport, thread_level_name

    if config.elastic:
        raise NotSupportedError(
            "solo and majority on a process set with elastic=True: a world change drops every process set, and "
            "the set's engine cannot follow it; use mode=hvd.Sync() on process sets in elastic training")
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise NotSupportedError(
            f"solo and majority on a process set run a second engine thread, which needs MPI_THREAD_MULTIPLE; MPI "
            f"granted {thread_level_name(MPI.Query_thread())}")
    # The session's observer (stall inspector, reports, timeline) watches the session's engine only.
    own = dataclasses.replace(config, timeline_filename="", stall_warning_seconds=0.0, stall_shutdown_seconds=0.0,
                              report_seconds=0.0)
    transport = MpiTransport(comm, doorbell=own.doorbell, quorum_counters=True, own_comms=True)
    transport.barrier()  # every member's engine starts its liveness clock together
    engine = Engine(transport, own)
    engine.start()
    log.debug("process set %d: engine of set rank %d/%d started", set_id, transport.rank, transport.size)
    return engine, transport, itertools.count()


def _stop(engine, transport) -> None:
    """Flush every stream and stop ``engine`` (collective over its ranks), then free what it held."""
    try:
        engine.shutdown()
    finally:
        if engine.failure is None:
            engine.free_stream_comms()
            transport.free()
