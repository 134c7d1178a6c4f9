"""The MPI transport: every MPI call of hvd_partial after ``init`` goes through
this module, and only the engine thread makes them.

It owns three private duplicates of the user's communicator: one for control
messages (point-to-point, pickled), one for the Horovod-style helpers (all of
them, whatever their names: see :mod:`.helper_channel`), and
one from which each stream's own communicator is duplicated, so that
collectives of different streams never have to be ordered against each other.
Majority's quorum counters live in a one-sided window (:mod:`.quorum_window`)
made from the last.
"""

from __future__ import annotations

import logging
import math
import os
import signal

import numpy as np
from mpi4py import MPI

from ..errors import ConfigError, EngineError, TooManyStreamsError
from .doorbell import Doorbell
from .quorum_window import QuorumWindow

log = logging.getLogger("hvd_partial.transport")

from .tags import TAG_FAILURE, TAG_HEARTBEAT, TAG_PROTOCOL  # noqa: F401 - re-exported
from .tags import URGENT_TAGS as _URGENT_TAGS
# Sends that had not completed when their transport was freed (after a failure,
# or a peer that never took them): kept alive for the life of the process.
_UNFINISHED_SENDS: list = []


def thread_level_name(level: int) -> str:
    return {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
            MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}.get(
        level, str(level))


def check_communicator(comm) -> None:
    """Raise ConfigError unless ``comm`` is an intracommunicator this process
    belongs to: what a rank left out of ``Split`` gets (``MPI.COMM_NULL``) and
    anything else would otherwise fail inside MPI with a bare error stack."""
    world = MPI.COMM_WORLD.Get_rank()
    if not isinstance(comm, MPI.Comm):
        raise ConfigError(f"init(comm=...) on world rank {world}: expected an mpi4py communicator, "
                          f"got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ConfigError(f"init(comm=MPI.COMM_NULL) on world rank {world}: this process is not in the "
                          "communicator (Split with MPI.UNDEFINED?); call init only on its members")
    if comm.Is_inter():
        raise ConfigError(f"init(comm=...) on world rank {world}: an intercommunicator; "
                          "pass an intracommunicator (Merge it first)")


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [repr(err)])[0].removesuffix(", error stack:")


# Control messages carry their session in the tag: MPI reuses a freed communicator's context,
# so a message sent but never received in one init() ... shutdown() (a flood's late copy, a
# heartbeat) could otherwise be received in the next one. Tags: _TAG_BASE + session slot * _TAG_SPAN + tag.
_TAG_BASE = 100
_TAG_SPAN = 32
_SESSION_SLOTS = 8
_sessions_begun = 0  # in this process; agreed across ranks at each init


# The control and helper communicators outlive a session: per user communicator, made by the
# first init() and reused by later ones (told apart by the tag). Freeing them with a message
# still unreceived (a flood's late copy) lets MPI give their context to the next session's
# duplicate while that message is on its way, and Open MPI can then lose a message of the new
# session (sessions_back_to_back hung under Open MPI about one launch in ten).
_KEPT_COMMS: dict[int, tuple] = {}  # handle of the user communicator -> (control, helpers)


def _session_comms(comm):
    """``(control, helpers)`` for ``comm``: the kept ones if every rank still has them
    for this very communicator, else new duplicates (collective either way)."""
    key = MPI._handleof(comm)
    kept = _KEPT_COMMS.get(key)
    usable = False
    if kept is not None:  # the handle may now be another communicator: compare the members
        ours, theirs = kept[0].Get_group(), comm.Get_group()
        usable = MPI.Group.Compare(ours, theirs) == MPI.IDENT
        ours.Free()
        theirs.Free()
    if comm.allreduce(1 if usable else 0, op=MPI.MIN) == 1:
        return kept
    control, helpers = comm.Dup(), comm.Dup()
    _KEPT_COMMS[key] = (control, helpers)
    return control, helpers


def _agree_on_session(comm) -> int:
    """The number of this init() among the ranks (all agree; collective)."""
    global _sessions_begun
    session = comm.allreduce(_sessions_begun, op=MPI.MAX)
    _sessions_begun = session + 1
    return session


class MpiTransport:
    """Point-to-point control messages and nonblocking collectives over MPI: the
    engine's :class:`~hvd_partial.transport.protocol.Transport`."""

    def __init__(self, comm=None, doorbell: bool = True, quorum_counters: bool = False, elastic: bool = False):
        comm = MPI.COMM_WORLD if comm is None else comm
        check_communicator(comm)
        level = MPI.Query_thread()
        if level < MPI.THREAD_SERIALIZED:
            raise EngineError(
                f"MPI granted {thread_level_name(level)}; hvd_partial's engine thread needs at least "
                "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE if your code also calls MPI). "
                "Do not set mpi4py.rc.thread_level below 'multiple'.")
        if level < MPI.THREAD_MULTIPLE:
            log.warning("MPI granted %s: do not call MPI from your own threads while hvd_partial runs",
                        thread_level_name(level))
        self.thread_level = level
        self.user_comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.control, self.helpers = _session_comms(comm)
        self.tag_base = _TAG_BASE + (_agree_on_session(self.control) % _SESSION_SLOTS) * _TAG_SPAN
        self.factory = comm.Dup()
        # Elastic training: every rank's (host, process id), so that a rank that stops
        # answering on this host can be ended (a stopped process would block the shrink).
        self.processes: list | None = None
        if elastic:  # ULFM: a peer's failure must raise MPI.Exception on every communicator, never abort
            for own in (self.control, self.helpers, self.factory):  # stream communicators inherit it from factory
                own.Set_errhandler(MPI.ERRORS_RETURN)
            self.processes = self.control.allgather((MPI.Get_processor_name(), os.getpid()))
        # majority's quorum counters (decentralized plane; one-sided, made now because making them is collective)
        self.quorum_window = QuorumWindow(self.factory) if quorum_counters and self.size > 1 else None
        self.quorum_counters = self.quorum_window.for_stream if self.quorum_window is not None else None
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self.doorbell = Doorbell.open(self.control.allgather, MPI.Get_processor_name(), self.rank) \
            if doorbell and self.size > 1 else None
        self._sends: list = []
        self.failed_over = False  # survived a failure: the old communicators are revoked, never freed
        self._status = MPI.Status()
        # Probes a rung receive makes before it gives up (a few microseconds):
        # twice what MPICH needed, see receive.
        self.rung_probes = 2 + 2 * math.ceil(math.log2(max(2, self.size)))

    # -- collective start-up, called by init before the engine thread starts ----

    def barrier(self):
        self.control.Barrier()

    # -- control messages --------------------------------------------------------

    def send(self, dest: int, tag: int, message) -> None:
        self._sends.append(self.control.isend(message, dest=dest, tag=self.tag_base + tag))
        if self.doorbell is not None and tag in _URGENT_TAGS:
            self.doorbell.ring(dest)

    def receive(self, rung: bool = False) -> list[tuple[int, int, object]]:
        """Every control message that has arrived: (source, tag, message).

        ``rung``: a peer rang this rank's doorbell, so a message is probably
        there: probe until it shows, up to ``self.rung_probes`` times.
        """
        out = []
        probes = self.rung_probes if rung else 1
        while True:
            handle = self.control.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status)
            if handle is None:
                # A probe matches only what earlier progress brought in (MPICH
                # needs about log2(size) probes to show a message that just
                # arrived), so a rung engine looks again; an unrung one does
                # not, which would slow every receive.
                probes -= 1
                if out or probes <= 0:
                    return out
                continue
            source, tag = self._status.Get_source(), self._status.Get_tag() - self.tag_base
            message = handle.recv()
            if 0 <= tag < _TAG_SPAN:  # else a late message of an earlier session: dropped
                out.append((source, tag, message))

    def progress_sends(self) -> int:
        """Drop completed sends; returns how many are still outstanding."""
        if self._sends:
            self._sends = [r for r in self._sends if not r.Test()]
        return len(self._sends)

    def retain_unfinished_sends(self) -> None:
        """Keep the sends still in flight alive for the life of the process.

        A send owns its pickled buffer until MPI is done with it; dropping the
        request would free that buffer while MPI may still be copying it out,
        and a peer would receive garbage.
        """
        _UNFINISHED_SENDS.extend(self._sends)
        self._sends = []

    # -- stream communicators and reductions -------------------------------------

    def new_stream_comm(self):
        """Start duplicating a communicator for a new stream: (comm, request)."""
        try:
            return self.factory.Idup()
        except MPI.Exception as err:
            raise TooManyStreamsError(_first_line(err)) from err

    @staticmethod
    def stream_comm_ready(request) -> bool:
        """Whether a duplication started by ``new_stream_comm`` is done. MPICH
        reports running out of communicators here, as an "Other MPI error"."""
        try:
            return request.Test()
        except MPI.Exception as err:
            raise TooManyStreamsError(_first_line(err)) from err

    @staticmethod
    def iallreduce_in_place(comm, buffer: np.ndarray):
        """Start summing ``buffer`` over ``comm``, in place (so on every rank)."""
        return comm.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

    @staticmethod
    def done(requests) -> bool:
        return MPI.Request.Testall(requests)

    @staticmethod
    def done_checked(requests) -> bool:
        """:meth:`done`, raising when a request completed in error (elastic training:
        Open MPI's nonblocking collectives can complete with the error only in their
        status when a peer died)."""
        statuses = [MPI.Status() for _ in requests]
        if not MPI.Request.Testall(requests, statuses):
            return False
        for status in statuses:
            code = status.Get_error()
            if code != MPI.SUCCESS:
                raise MPI.Exception(code)
        return True

    # -- elastic training: surviving a dead rank ---------------------------------

    @staticmethod
    def is_process_failure(exc: BaseException) -> bool:
        """Whether ``exc`` says a peer died (or a survivor revoked a communicator after one did).
        A test of several requests reports their errors as ``ERR_IN_STATUS``: on the
        engine's communicators under ULFM that is a failure of one of them."""
        from .ulfm import is_process_failure

        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_IN_STATUS:
            return True
        return is_process_failure(exc)

    @staticmethod
    def is_mpi_error(exc: BaseException) -> bool:
        """Whether ``exc`` is any error MPI raised (during a recovery, a second failure can
        also surface as another class, e.g. ``MPI_ERR_OTHER`` from a ``Dup``)."""
        return isinstance(exc, MPI.Exception)

    def revoke_control(self) -> None:
        """Revoke the control communicator, which every engine polls: each survivor
        still working (or idle) hears of the failure. The other communicators are
        abandoned, not revoked (Open MPI crashes a rank that is still creating a
        communicator another rank revokes, and nothing waits on them after this)."""
        try:
            if not self.control.Is_revoked():
                self.control.Revoke()
        except MPI.Exception as err:
            log.debug("revoking the control communicator failed: %s", err)

    def revoke_abandoned(self, comms) -> None:
        """After the shrink (every survivor is recovering): revoke the old helper and
        factory communicators and ``comms``, so that requests still pending on them
        complete (in error) and MPI_Finalize does not wait for them."""
        for comm in (self.helpers, self.factory, *comms):
            try:
                if not comm.Is_revoked():
                    comm.Revoke()
            except MPI.Exception as err:
                log.debug("revoking an abandoned communicator failed: %s", err)

    def shrink(self):
        """Agree with every survivor on the failed ranks and shrink the control
        communicator to the survivors (:func:`~.ulfm.agree_and_shrink`)."""
        from .ulfm import agree_and_shrink

        return agree_and_shrink(self.control)

    def rebuild(self, control) -> None:
        """Go on with the survivors' communicator ``control`` (collective over it):
        new helper and factory duplicates, the quorum window made again (the old
        one is abandoned, not freed: one-sided windows do not survive a failure),
        the doorbell reopened with the new ranks. Sends in flight on the old
        communicators are kept alive but never waited for."""
        self.retain_unfinished_sends()
        _KEPT_COMMS.pop(MPI._handleof(self.user_comm), None)  # the survivors' comms serve this session only
        self.control = control
        self.rank = control.Get_rank()
        self.size = control.Get_size()
        self.helpers = control.Dup()
        self.factory = control.Dup()
        for comm in (self.helpers, self.factory):
            comm.Set_errhandler(MPI.ERRORS_RETURN)
        had_window = self.quorum_window is not None
        self.quorum_window = QuorumWindow(self.factory) if had_window and self.size > 1 else None
        self.quorum_counters = self.quorum_window.for_stream if self.quorum_window is not None else None
        if self.doorbell is not None:
            self.doorbell.close()
            self.doorbell = Doorbell.open(self.control.allgather, MPI.Get_processor_name(), self.rank) \
                if self.size > 1 else None
        self.rung_probes = 2 + 2 * math.ceil(math.log2(max(2, self.size)))
        self.processes = self.control.allgather((MPI.Get_processor_name(), os.getpid()))
        self.failed_over = True

    def end_process(self, rank: int) -> bool:
        """End rank ``rank``'s process (SIGKILL) if it runs on this host, so that MPI
        reports it failed (elastic training: it stopped answering but is not dead). False
        where it cannot (another host, or no process list)."""
        if self.processes is None:
            return False
        host, pid = self.processes[rank]
        if host != MPI.Get_processor_name():
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone: MPI reports it anyway
            pass
        return True

    def new_stream_comm_now(self):
        """A new stream's communicator, made at once (the survivors remake theirs in stream order)."""
        comm = self.factory.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        return comm

    def gather_objects(self, value) -> list:
        """Every survivor's ``value``, in rank order (collective over the control communicator)."""
        return self.control.allgather(value)

    def broadcast_object(self, value, root: int):
        return self.control.bcast(value, root=root)

    # -- teardown ------------------------------------------------------------------

    def free(self):
        if self.doorbell is not None:
            self.doorbell.close()
        self.retain_unfinished_sends()
        if self.failed_over:  # the survivors' communicators are dropped with the session
            return
        try:  # only the factory and the window: control and helpers are kept for the next session
            if self.quorum_window is not None:
                self.quorum_window.free()
            self.factory.Free()
        except MPI.Exception:  # pragma: no cover - freeing after a failure
            pass
