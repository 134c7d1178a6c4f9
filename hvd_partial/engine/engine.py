"""The engine: one background thread per process that alone calls MPI.

Compute threads enqueue commands (post, flush, helper collectives, shutdown)
and wait on handles. The engine feeds the protocol core with those commands
and with the control messages that arrive, starts the reductions the core asks
for, and completes them. Rank 0's engine also runs the coordinator.

It never blocks in MPI: every operation is nonblocking and polled, with a
back-off when there is nothing to do, so the training threads keep their CPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..collectives.negotiator import Negotiator
from ..config import Config
from ..core.buffer_pool import BufferPool
from ..core.coordinator import Coordinator
from ..core.fusion import Layout
from ..core.messages import (Closed, Failure, Flush, FlushBegun, Goodbye, Heartbeat, Post, Register, Registered,
                             Rejected, Start, StreamSignature)
from ..core.rank_stream import Launch, RankStream, Waiter
from ..errors import (EngineError, HvdPartialError, MismatchError, NotInitializedError, RankFailedError,
                      StreamConflictError, TooManyStreamsError)
from ..modes import ReduceOp
from ..transport.tags import TAG_FAILURE, TAG_FROM_COORDINATOR, TAG_HEARTBEAT, TAG_TO_COORDINATOR
from .handle import Handle
from ..observe.monitor import TAG_STATUS
from .stats import StatsRecorder

log = logging.getLogger("hvd_partial.engine")

# While a reduction is in flight the engine tests only it for this long before
# looking at commands and control messages again (bounds their extra latency).
_FOCUS_SECONDS = 2e-4
# How long a reduction is tested continuously before the tests space out
# (reduce_poll_us); see _poll_reductions.
_PATIENCE_SECONDS = 1e-3
# How long a post waiting for its round to start is watched continuously
# before the engine naps; see _nap_while_waiting. (1 ms made balanced
# majority steps a few % slower than 3 ms: the designated rank's jitter.)
_START_PATIENCE_SECONDS = 3e-3
# A nap lasts this fraction of the time waited so far (see
# _nap_while_waiting for its bounds): a message that comes mid-nap without a
# ring is seen at most that much later, relative to the wait, while a long
# wait costs few wake-ups.
_NAP_FRACTION = 0.25
_NAP_MIN_SECONDS = 5e-5
# With doorbells, the short naps (back-off from 40 us, about 1.2 ms in all) an
# idle engine takes after a wake-up that found nothing, before it sleeps
# doorbell_poll_ms at a time again.
_RECHECKS = 5
# A gap this long between two liveness checks means this process itself did
# not run (stopped, swapped out, starved): peers' silence then is no evidence.
_FROZEN_SECONDS = 0.25


@dataclass
class PostCommand:
    name: str
    buffers: list
    owned: bool
    layout: Layout
    grouped: bool
    sync: bool
    op: ReduceOp
    signature: StreamSignature
    handle: Handle


@dataclass
class FlushCommand:
    name: str
    handle: Handle


@dataclass
class HelperCommand:
    request: Any  # a hvd_partial.collectives request, for the negotiator
    handle: Handle


@dataclass
class ShutdownCommand:
    handle: Handle


@dataclass
class AbortCommand:
    reason: str
    handle: Handle


class _RoundEntry:
    __slots__ = ("launch", "recv", "requests", "started")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.recv = None
        self.requests = None
        self.started = 0.0


class Engine:
    """The background progress thread of one process.

    Example (what ``hvd_partial.init`` does)::

        engine = Engine(MpiTransport(comm), config)
        engine.start()
        handle = engine.submit_post(...)
    """

    def __init__(self, transport, config: Config):
        self.transport = transport
        self.config = config
        self.rank = transport.rank
        self.size = transport.size
        self.coordinator = Coordinator(self.size) if self.rank == 0 else None
        self.stats = StatsRecorder(self.size)
        from ..observe import attach_observer  # stall inspector, report, timeline; None when all are off

        self.observer = attach_observer(self)
        self.timeline = self.observer.timeline if self.observer is not None else None
        self._commands: deque = deque()
        # Unlocked means "a wake-up is pending": a bare lock is much cheaper to
        # hand between threads than threading.Event, and every post passes here.
        self._wake = threading.Lock()
        # Where the transport has doorbells, the idle engine sleeps on its
        # bell instead: rung by peers after urgent messages, poked by compute threads.
        self._bell = getattr(transport, "doorbell", None)
        self._bell_covers_all = self._bell is not None and self._bell.reachable == self.size - 1
        self._bell_poll = config.doorbell_poll_ms / 1000.0
        self._unsent = 0  # control messages still queued in MPI after the last step
        self._streams: dict[str, RankStream] = {}
        self._by_id: dict[int, RankStream] = {}
        self._held: dict[str, Waiter] = {}  # first posts waiting for registration
        self._held_commands: dict[str, PostCommand] = {}
        self._comms: dict[int, Any] = {}  # stream id -> its communicator, once duplicated
        self._awaiting_comm: deque = deque()  # stream ids, in registration order
        self._duplicating: tuple | None = None  # (stream id, communicator, request)
        self._rounds: dict[int, deque] = {}
        self._pools: dict[int, BufferPool] = {}
        self._local_inbox: deque = deque()  # rank 0: the coordinator's messages to itself
        self._coordinator_inbox: deque = deque()  # rank 0: its own messages to the coordinator
        self._pending_handles: set[Handle] = set()
        # Negotiated helper collectives: submit(request), progress() each step, busy.
        # (A weak reference: a cycle would keep every shut-down engine alive until a full collection.)
        failing = weakref.WeakMethod(self._fail)
        self._helpers = Negotiator(transport, config, fail=lambda err: failing()(err, notify=False, local=True),
                                   pending=self._pending_handles)
        self._reduce_poll = config.reduce_poll_us / 1e6
        self._nap_max = config.idle_poll_ms / 1000.0
        self._rung_unanswered = False  # a nap ended by a ring, and no step found work since
        self._leaving = False
        self._to_flush: set[int] = set()
        self._flushed: set[int] = set()
        self._goodbye_sent: frozenset | None = None
        self._closed = False
        self._shutdown_handle: Handle | None = None
        self._sends_wait_since: float | None = None  # shutdown done but for unsent messages
        self._leaving_requested = False  # set by the compute thread in shutdown()
        self.failure: HvdPartialError | None = None
        self.failed_at = 0.0  # time.monotonic() when failure was set
        self._stopped = threading.Event()
        # True only while the engine thread sleeps: compute threads wake it
        # (a syscall on each side) only then. It is set before the thread's
        # last look at the command queue, so no command can slip by unseen.
        self._asleep = False
        now = time.monotonic()
        self._last_heard = [now] * self.size
        self._next_heartbeat = now
        self._next_liveness_check = now
        self._last_liveness_check = now
        self._thread = threading.Thread(target=self._run, name=f"hvd_partial-engine-{self.rank}", daemon=True)

    # ===== compute-thread side =====================================================

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    def _submit(self, command, handle: Handle) -> Handle:
        if self.failure is not None:
            raise self.failure
        if self._stopped.is_set() or self._leaving_requested:
            raise NotInitializedError("hvd_partial is shut down on this rank; call hvd_partial.init() first")
        self._commands.append(command)
        self._poke()
        return handle

    def _poke(self) -> None:
        if not self._asleep:  # it is awake and polling: it will see the change
            return
        if self._bell is not None:
            self._bell.poke()
            return
        try:
            self._wake.release()
        except RuntimeError:  # already unlocked: a wake-up is pending anyway
            pass

    def submit_post(self, name, buffers, owned, layout, grouped, sync, op, signature) -> Handle:
        handle = Handle(name)
        return self._submit(PostCommand(name, buffers, owned, layout, grouped, sync, op, signature, handle), handle)

    def submit_flush(self, name: str) -> Handle:
        handle = Handle(name)
        return self._submit(FlushCommand(name, handle), handle)

    def submit_helper(self, request) -> Handle:
        return self._submit(HelperCommand(request, request.handle), request.handle)

    def wait(self, handle: Handle):
        """Block until ``handle`` is done; raise the engine's failure if any."""
        while not handle.wait(0.25):
            if self.failure is not None and not handle.done():
                raise self.failure
            if self._stopped.is_set() and not handle.done():
                raise self.failure or EngineError(f"engine of rank {self.rank} stopped")
        return handle.value()

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush every stream and stop the engine (collective)."""
        if self._stopped.is_set():
            return
        if self.failure is None:
            handle = Handle("shutdown")
            self._commands.append(ShutdownCommand(handle))
            self._leaving_requested = True
            self._poke()
            try:
                self.wait(handle)
            finally:
                self._stop_thread()
        else:
            self._stop_thread()

    def abort(self, reason: str) -> None:
        """Tell every other rank that this one failed, then stop (not collective)."""
        if self._stopped.is_set():
            return
        handle = Handle("abort")
        self._commands.append(AbortCommand(reason, handle))
        self._poke()
        handle.wait(self.config.abort_grace_seconds + 1.0)
        self._stop_thread()

    def free_stream_comms(self) -> None:
        """Free the streams' communicators once the thread has stopped cleanly
        (collective: every rank frees them in stream order)."""
        if self._thread.is_alive() or self.failure is not None:
            return
        if self._duplicating is not None:
            sid, comm, request = self._duplicating
            request.Wait()
            self._comms[sid] = comm
            self._duplicating = None
        for sid in sorted(self._comms):
            self._comms[sid].Free()
        self._comms.clear()

    def _stop_thread(self):
        self._stopped.set()
        self._poke()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(5.0, self.config.abort_grace_seconds + 1.0))

    # ===== engine thread =============================================================

    def _run(self) -> None:
        idle = 0
        recheck = 0  # short naps left after a wake-up that found nothing yet
        spin = self.config.spin_us / 1e6
        awake_until = 0.0
        poll_max = self.config.idle_poll_ms / 1000.0
        if self.coordinator is not None and (self._bell is None or self._bell.reachable < self.size - 1):
            poll_max /= 4  # other ranks' activations pass through here, not all by doorbell
        try:
            while not self._stopped.is_set():
                worked = self._step()
                if self._finished():
                    break
                if worked:
                    idle = recheck = 0
                    self._rung_unanswered = False
                    awake_until = time.perf_counter() + spin
                    continue
                idle += 1
                if self._rounds_in_flight():
                    # A reduction progresses only inside MPI calls: stay in them
                    # and look at the rest now and then.
                    self._poll_reductions(time.perf_counter() + _FOCUS_SECONDS)
                elif self._helpers.busy:
                    # A helper collective in progress needs this engine in MPI.
                    if idle < 5000:
                        os.sched_yield()
                    else:
                        time.sleep(1e-4)
                elif self._pending_handles:
                    # A compute thread waits for a round to start: look closely
                    # for a while, yielding. (Sleeping on the doorbell at once,
                    # woken by the start of the round, made posts of 4 B to 1 MiB
                    # slower by 0.2-0.6 ms on this VM: the datagram's wake-up is
                    # slow.) A longer wait is for another rank's computation:
                    # nap then, or this engine takes the CPU from the ranks it
                    # waits for where ranks outnumber cores.
                    self._nap_while_waiting(min(h.posted_at for h in self._pending_handles))
                elif time.perf_counter() < awake_until:
                    # Work just happened and more usually follows (the next post
                    # of a training loop): stay awake a little, yielding. A sleep
                    # and its wake-up cost tens of microseconds of CPU on each side.
                    os.sched_yield()
                elif self._bell is not None:
                    # Nothing in flight: sleep, but wake at once on a new command
                    # or a peer's urgent message, then poll closely again.
                    if self._bell_covers_all and not self._unsent and not recheck:
                        # Every message that needs this engine rings it and
                        # every post pokes it, so no back-off: the timer only
                        # catches a lost ring. Each wake-up preempts a
                        # computing thread (see doorbell_poll_ms), so first
                        # consume the rings of messages already handled while
                        # awake, looking once more if there were any, rather
                        # than wake for them.
                        if self._bell.drain():
                            continue
                        nap = self._bell_poll
                    else:
                        # Without doorbells from every peer; or after a wake-up
                        # that found nothing (a ring ahead of its message), or
                        # while this rank's own sends are queued in MPI (only
                        # its MPI calls move them): back off from short naps.
                        nap = min(poll_max, 2e-5 * (1 << min(idle, 20)))
                        recheck = max(0, recheck - 1)
                    self._asleep = True
                    if not self._commands and self._bell.wait(nap):
                        idle = 0
                        recheck = _RECHECKS
                    self._asleep = False
                else:
                    self._asleep = True
                    self._wake.acquire(blocking=False)  # consume a pending wake-up
                    if not self._commands:
                        self._wake.acquire(timeout=min(poll_max, 2e-5 * idle))
                    self._asleep = False
        except TooManyStreamsError as exc:  # a limit the user can act on, not a crash
            self._fail(exc, notify=True, local=True)
            self._drain_failure_notices()
        except BaseException as exc:  # the engine must never die silently
            log.exception("hvd_partial engine of rank %d crashed", self.rank)
            self._fail(EngineError(f"engine of rank {self.rank} crashed: {exc!r}"), notify=True)
            self._drain_failure_notices()
        finally:
            if self.observer is not None:
                self.observer.close()
            self._stopped.set()

    def _poll_reductions(self, deadline: float) -> None:
        """Test the oldest reduction of every stream until one completes, a
        command arrives or ``deadline`` passes; the main loop does the rest.

        Tests follow each other, yielding the CPU in between. With
        ``reduce_poll_us`` set, a reduction in flight for over a millisecond
        is tested that often instead, sleeping in between: where ranks
        outnumber cores, a large round that runs while ranks compute (solo
        rounds do) then leaves them the CPU. On 4 ranks and 2 cores, 100 us
        took a step with a grouped 16 MiB solo post from 52 to 44 ms, but
        made 1 MiB steps up to 15% slower (a waiting rank's sleep ends late on
        a busy CPU), so it is off by default. (Napping a growing share of the
        wait instead doubled per-call times from 1 MiB up: a reduction in
        progress needs every rank's engine in MPI at each of its steps, and
        nothing tells a napping engine that the last rank has joined.)
        """
        entries = [q[0] for q in self._rounds.values() if q and q[0].requests is not None]
        if not entries:
            os.sched_yield()
            return
        heads = [e.requests for e in entries]
        # With no spacing set the tests never sleep: no need to know the age.
        patient_until = min(e.started for e in entries) + _PATIENCE_SECONDS if self._reduce_poll else float("inf")
        done = self.transport.done
        while not self._commands:
            for requests in heads:
                if done(requests):
                    return
            now = time.perf_counter()
            if now >= deadline:
                return
            if now < patient_until:
                os.sched_yield()
            else:
                time.sleep(self._reduce_poll)

    def _nap_while_waiting(self, since: float) -> None:
        """While a post waits for its round to start: yield the CPU once or,
        when the wait began over 3 ms ago (the oldest waiting call was made
        at ``since``), nap a quarter of the time waited: from 50 us up to
        ``doorbell_poll_ms`` where every peer can ring this rank's doorbell,
        else up to ``idle_poll_ms``.

        Such a wait is for another rank's computation (a majority round's
        designated rank, a laggard holding the staleness bound), and the
        round's start reaches this rank as a coordinator message, which rings
        its doorbell: a nap ends at once. Yielding instead took the CPU from
        the ranks waited for, where ranks outnumber cores.
        """
        waited = time.perf_counter() - since
        if waited < _START_PATIENCE_SECONDS:
            os.sched_yield()
            return
        # Where every peer rings, the nap only bounds the delay of a lost ring
        # (as when idle). It is at most idle_poll_ms while this rank's own
        # sends are queued (only its MPI calls move them), and after a ring
        # that found no message yet: a ring can come before MPI shows its
        # message, and a long nap then made majority rounds under imbalance
        # up to 13% slower.
        long_ok = self._bell_covers_all and not self._unsent and not self._rung_unanswered
        nap = min(self._bell_poll if long_ok else self._nap_max, max(_NAP_MIN_SECONDS, _NAP_FRACTION * waited))
        if self._nap(nap):
            self._rung_unanswered = True  # until a step finds work

    def _nap(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; a new command wakes the engine at once, and
        so does a peer's ring where there is a doorbell. True if woken so."""
        self._asleep = True
        try:
            if self._bell is not None:
                return bool(self._commands) or self._bell.wait(seconds)
            self._wake.acquire(blocking=False)  # consume a pending wake-up
            return bool(self._commands) or self._wake.acquire(timeout=seconds)
        finally:
            self._asleep = False

    def _finished(self) -> bool:
        if self.failure is not None:
            self._drain_failure_notices()
            return True
        if not (self._leaving and self._closed):
            return False
        if self._to_flush or self._rounds_in_flight() or not self._helpers.finished:
            return False
        if any(s.waiter is not None for s in self._streams.values()):
            return False
        if not self._last_sends_out():
            return False
        if self._shutdown_handle is not None:
            self._shutdown_handle.set_result(None)
        return True

    def _last_sends_out(self) -> bool:
        """True once this rank's control messages have all left, or a peer
        has had ``failure_timeout_seconds`` to take them.

        The last ones (rank 0's ``Closed``, say) may still be queued in MPI
        when the rest of the shutdown is done, and only MPI calls move them:
        an engine that stopped here left its peers waiting for them.
        """
        outstanding = self.transport.progress_sends()
        if outstanding == 0:
            return True
        now = time.monotonic()
        if self._sends_wait_since is None:
            self._sends_wait_since = now
        waited = now - self._sends_wait_since
        if waited < self.config.failure_timeout_seconds:
            return False
        log.warning("rank %d: %d control messages still unsent after %.1f s at shutdown; stopping without them",
                    self.rank, outstanding, waited)
        return True

    def _drain_failure_notices(self):
        deadline = time.monotonic() + self.config.abort_grace_seconds
        while time.monotonic() < deadline:
            try:
                if self.transport.progress_sends() == 0:
                    return
            except Exception:  # noqa: BLE001 - a dead peer may fail its sends
                break
            time.sleep(0.001)
        self.transport.retain_unfinished_sends()

    def _rounds_in_flight(self) -> bool:
        return any(self._rounds.values())

    def _step(self) -> bool:
        worked = False
        while self._commands:
            self._handle_command(self._commands.popleft())
            worked = True
        rung = self._bell is not None and self._bell.take_ring()
        for source, tag, message in self.transport.receive(rung):
            self._last_heard[source] = time.monotonic()
            self._handle_message(source, tag, message)
            worked = True
        while self._coordinator_inbox:
            self._coordinate(self._coordinator_inbox.popleft())
            worked = True
        while self._local_inbox:
            self._from_coordinator(self._local_inbox.popleft())
            worked = True
        if self._duplicating is not None or self._awaiting_comm:
            worked |= self._progress_comms()
        worked |= self._progress_rounds()
        worked |= self._helpers.progress()
        if self._leaving:
            worked |= self._progress_leaving()
        self._unsent = self.transport.progress_sends()
        self._liveness()
        return worked

    # -- commands -------------------------------------------------------------------

    def _handle_command(self, cmd) -> None:
        if self.observer is not None:
            self.observer.on_command(cmd)
        if isinstance(cmd, AbortCommand):
            self._fail(RankFailedError(self.rank, cmd.reason), notify=True, local=True)
            cmd.handle.set_result(None)
            return
        if isinstance(cmd, ShutdownCommand):
            self._leaving = True
            self._shutdown_handle = cmd.handle
            self._to_flush = {sid for sid in self._by_id} - self._flushed
            self._helpers.shutdown()
            return
        self._pending_handles.add(cmd.handle)
        try:
            if isinstance(cmd, PostCommand):
                self._post(cmd)
            elif isinstance(cmd, FlushCommand):
                self._flush(cmd)
            elif isinstance(cmd, HelperCommand):
                self._helpers.submit(cmd.request)
            else:  # pragma: no cover
                raise EngineError(f"unknown command {cmd!r}")
        except HvdPartialError as err:
            self._pending_handles.discard(cmd.handle)
            cmd.handle.set_error(err)

    def _post(self, cmd: PostCommand) -> None:
        stream = self._streams.get(cmd.name)
        waiter = Waiter("post", handle=cmd.handle)
        if stream is None:
            stream = RankStream(self.rank, self.size, cmd.name, cmd.layout, cmd.sync, cmd.op, grouped=cmd.grouped)
            self._streams[cmd.name] = stream
            self._held[cmd.name] = waiter
            self._held_commands[cmd.name] = cmd
            self._to_coordinator(Register(self.rank, cmd.name, cmd.signature))
            return
        if stream.id is None:
            raise StreamConflictError(
                f"stream {cmd.name!r} is still registering on rank {self.rank}; synchronize its first post first")
        msg, launch, done = stream.post(cmd.buffers, cmd.owned, waiter)
        self._after_post(stream, msg, launch, done, waiter)

    def _after_post(self, stream, msg, launch, done, waiter):
        if msg is not None:
            self._to_coordinator(msg)
        if launch is not None:
            self._launch(stream, launch)
        if done:
            self._finish(stream, waiter)

    def _flush(self, cmd: FlushCommand) -> None:
        stream = self._streams.get(cmd.name)
        if stream is None:
            raise StreamConflictError(f"flush({cmd.name!r}) on rank {self.rank}: this rank never posted to that stream")
        if stream.id is None:
            raise StreamConflictError(
                f"flush({cmd.name!r}) on rank {self.rank}: the stream is still registering; synchronize its first post")
        self._to_coordinator(stream.flush(Waiter("flush", handle=cmd.handle)))

    def _finish(self, stream: RankStream, waiter: Waiter) -> None:
        handle = waiter.handle
        if handle is None:
            return
        self._pending_handles.discard(handle)
        handle.set_result(waiter.results)
        if self.observer is not None:
            self.observer.on_finish(stream.name, waiter)
        if waiter.kind == "post":
            self.stats.post_finished(stream.name, handle.wait_seconds or 0.0)

    # -- messages -------------------------------------------------------------------

    def _to_coordinator(self, message) -> None:
        if self.rank == 0:
            self._coordinator_inbox.append(message)
        else:
            self.transport.send(0, TAG_TO_COORDINATOR, message)

    def _handle_message(self, source: int, tag: int, message) -> None:
        if tag == TAG_TO_COORDINATOR:
            self._coordinate(message)
        elif tag == TAG_FROM_COORDINATOR:
            self._from_coordinator(message)
        elif tag == TAG_FAILURE:
            if message.rank == self.rank:  # the others gave up on this rank (it was stopped, say)
                self._fail(RankFailedError(self.rank, f"declared failed by rank {source}: {message.reason}"),
                           notify=False)
            else:
                self._fail(RankFailedError(message.rank, message.reason), notify=False)
        elif tag == TAG_HEARTBEAT:
            pass
        elif tag == TAG_STATUS:
            if self.observer is not None:
                self.observer.on_status(source, message)
        else:
            log.warning("rank %d: ignoring a message with unknown tag %d from rank %d", self.rank, tag, source)

    def _coordinate(self, message) -> None:
        coord = self.coordinator
        if isinstance(message, Post):
            out = coord.on_post(message)
        elif isinstance(message, Register):
            out = coord.on_register(message)
        elif isinstance(message, Flush):
            out = coord.on_flush(message)
        elif isinstance(message, Goodbye):
            out = coord.on_goodbye(message)
        else:  # pragma: no cover
            raise EngineError(f"coordinator got an unknown message {message!r}")
        self._broadcast(out)

    def _broadcast(self, messages) -> None:
        for message in messages:
            for dest in range(1, self.size):
                self.transport.send(dest, TAG_FROM_COORDINATOR, message)
            self._local_inbox.append(message)

    def _from_coordinator(self, message) -> None:
        if isinstance(message, Start):
            stream = self._by_id[message.stream]
            self.stats.round_started(stream.name, message.lag)
            self._launch(stream, stream.on_start(message))
        elif isinstance(message, Registered):
            self._registered(message)
        elif isinstance(message, Rejected):
            self._rejected(message)
        elif isinstance(message, FlushBegun):
            problem = self._by_id[message.stream].on_flush_begun(message)
            if problem is not None:
                # A round of this stream is in flight that the flushing rank
                # will never join; MPI cannot cancel it, so the engine stops.
                self._fail(MismatchError(problem), notify=True, local=True)
        elif isinstance(message, Closed):
            self._closed = True
        else:  # pragma: no cover
            raise EngineError(f"unknown message from the coordinator: {message!r}")

    def _registered(self, message: Registered) -> None:
        stream = self._streams[message.name]
        stream.id = message.stream
        self._by_id[message.stream] = stream
        self._awaiting_comm.append(message.stream)
        self._rounds[message.stream] = deque()
        self._pools[message.stream] = BufferPool()
        waiter = self._held.pop(message.name)
        cmd = self._held_commands.pop(message.name)
        msg, launch, done = stream.post(cmd.buffers, cmd.owned, waiter, registered=False)
        self._after_post(stream, msg, launch, done, waiter)
        if self._leaving:
            self._to_flush.add(message.stream)

    def _rejected(self, message: Rejected) -> None:
        self._streams.pop(message.name, None)
        self._held_commands.pop(message.name, None)
        waiter = self._held.pop(message.name, None)
        if waiter is not None and waiter.handle is not None:
            self._pending_handles.discard(waiter.handle)
            waiter.handle.set_error(MismatchError(f"rank {self.rank}: {message.reason}"))

    # -- rounds -----------------------------------------------------------------------

    def _launch(self, stream: RankStream, launch: Launch) -> None:
        if self.timeline is not None:
            self.timeline.launched(stream.name, launch)
        self._rounds[stream.id].append(_RoundEntry(launch))
        self._start_entries(stream.id)

    def _progress_comms(self) -> bool:
        """Duplicate the streams' communicators one at a time, in registration
        order (the same on every rank). With several duplications of one
        communicator in flight at once, Open MPI deadlocked or failed with
        MPI_ERR_INTERN in most runs of the many-streams test."""
        worked = False
        sid = None
        try:
            if self._duplicating is not None:
                sid, comm, request = self._duplicating
                if not self.transport.stream_comm_ready(request):
                    return False
                self._duplicating = None
                self._comms[sid] = comm
                self._start_entries(sid)
                worked = True
            if self._awaiting_comm:
                sid = self._awaiting_comm.popleft()
                comm, request = self.transport.new_stream_comm()
                self._duplicating = (sid, comm, request)
                worked = True
        except TooManyStreamsError as err:
            raise TooManyStreamsError(
                f"MPI could not create a communicator for stream {self._by_id[sid].name!r} (stream number "
                f"{len(self._comms) + 1}) on rank {self.rank}: {err}. Every stream holds an MPI communicator of its "
                "own and MPI allows only so many (MPICH about 2,000): reduce many arrays as one stream with "
                "grouped_partial_allreduce_async") from err
        return worked

    def _start_entries(self, sid: int) -> None:
        comm = self._comms.get(sid)
        if comm is None:  # still being duplicated
            return
        pool = self._pools[sid]
        for entry in self._rounds[sid]:
            launch = entry.launch
            if entry.requests is None and launch.send is not None:
                # Every reduction is in place: MPI requires MPI_IN_PLACE on all
                # ranks of an allreduce or on none (Open MPI's libnbc picks
                # another algorithm for it, and a mixed round failed with
                # MPI_ERR_TRUNCATE), while whether a rank's send buffer is its
                # own is a local fact. A buffer the stream owns becomes the
                # result; the caller's arrays (and the zeros of a rank with
                # nothing to send) are copied into a pooled one first, which
                # costs what MPI's own copy into a separate receive buffer does.
                entry.recv = [s if mine else pool.copy_of(s) for s, mine in zip(launch.send, launch.owned)]
                entry.requests = [self.transport.iallreduce_in_place(comm, r) for r in entry.recv]
                entry.started = time.perf_counter()

    def _progress_rounds(self) -> bool:
        worked = False
        for sid, queue in self._rounds.items():
            if not queue:
                continue
            while queue:
                entry = queue[0]
                if entry.launch.send is not None:
                    if entry.requests is None or not self.transport.done(entry.requests):
                        break
                queue.popleft()
                self._complete(self._by_id[sid], entry)
                worked = True
        return worked

    def _complete(self, stream: RankStream, entry: _RoundEntry) -> None:
        launch = entry.launch
        waiter = stream.complete(launch, entry.recv)
        self.stats.round_completed(stream.name, waiter.results[-1] if waiter is not None else stream.results[-1])
        if self.timeline is not None:
            self.timeline.reduced(stream.name, launch, waiter.results[-1] if waiter is not None else stream.results[-1])
        if waiter is not None:
            self._finish(stream, waiter)
        if self.coordinator is not None and not stream.sync and launch.facts is not None \
                and launch.facts.round is not None:
            self._broadcast(self.coordinator.on_round_complete(stream.id, launch.round, stream.last_included))

    # -- shutdown ---------------------------------------------------------------------

    def _progress_leaving(self) -> bool:
        worked = False
        for sid in sorted(self._to_flush):
            stream = self._by_id[sid]
            if stream.waiter is None:
                self._to_coordinator(stream.flush(Waiter("flush")))
                self._to_flush.discard(sid)
                self._flushed.add(sid)
                worked = True
        if not self._to_flush and self._goodbye_sent != frozenset(self._flushed):
            self._goodbye_sent = frozenset(self._flushed)
            self._to_coordinator(Goodbye(self.rank, tuple(sorted(self._flushed))))
            worked = True
        return worked

    # -- liveness and failure ----------------------------------------------------------

    def _liveness(self) -> None:
        now = time.monotonic()
        if now < self._next_liveness_check:
            return
        self._next_liveness_check = now + 0.01
        gap = now - self._last_liveness_check
        self._last_liveness_check = now
        if gap > _FROZEN_SECONDS:
            # Count only the silence this rank saw while it ran: a rank that was
            # stopped and resumed must not blame the peers it could not hear.
            self._last_heard = [min(now, heard + gap) for heard in self._last_heard]
        if self.observer is not None:
            self.observer.tick()
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_seconds
            for dest in range(self.size):
                if dest != self.rank:
                    self.transport.send(dest, TAG_HEARTBEAT, Heartbeat(self.rank))
        limit = self.config.failure_timeout_seconds
        for peer, heard in enumerate(self._last_heard):
            if peer != self.rank and now - heard > limit:
                self._fail(RankFailedError(peer, f"no message from it for {now - heard:.1f} s "
                                                 f"(failure_timeout_seconds={limit:g}): it died, hung or was stopped"),
                           notify=True)
                return

    def _fail(self, error: HvdPartialError, notify: bool, local: bool = False) -> None:
        if self.failure is not None:
            return
        self.failure = error
        self.failed_at = time.monotonic()
        if local:
            log.error("rank %d: %s; telling the other ranks", self.rank, getattr(error, "reason", error))
        else:
            log.error("rank %d: %s", self.rank, error)
        if notify:
            reason = getattr(error, "reason", str(error))
            origin = getattr(error, "rank", self.rank)
            if not isinstance(error, RankFailedError) or error.rank is None:
                origin = self.rank
            # The accused rank is told too: if it was only stopped, it learns on
            # resuming that it is the one that failed instead of blaming a peer.
            for dest in range(self.size):
                if dest != self.rank:
                    try:
                        self.transport.send(dest, TAG_FAILURE, Failure(origin, reason))
                    except Exception:  # noqa: BLE001 - best effort towards a broken peer
                        pass
        waiters = list(self._pending_handles)
        if self._shutdown_handle is not None:
            waiters.append(self._shutdown_handle)
        for handle in waiters:
            handle.set_error(error)
        self._pending_handles.clear()

