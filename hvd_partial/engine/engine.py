"""The engine: one background thread per process that alone calls MPI.

Compute threads submit commands (post, flush, helper collectives, shutdown)
and wait on handles. The engine thread runs this rank's protocol
:class:`~hvd_partial.core.driver.Driver` (the same one the loopback world and
the simulator run) and is its host: it moves the driver's messages, starts
and completes the reductions it launches, and wakes the calls it finishes.

Its parts, one job each: :mod:`.commands` (intake), :mod:`.dispatch`
(messages by tag), :mod:`.reductions` (rounds in flight), the helper collectives'
:class:`~hvd_partial.collectives.negotiator.Negotiator`, :mod:`.pacing` (the idle/wake policy) and
:mod:`.liveness` (ring heartbeats and the failure flood).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque

from ..collectives.negotiator import Negotiator
from ..collectives.requests import LOCAL
from ..config import Config
from ..core.driver import Driver
from ..core.rank_stream import Launch, RankStream, Waiter
from ..core.round_result import RoundResult
from ..errors import EngineError, HvdPartialError, NotInitializedError, RankFailedError, TooManyStreamsError
from ..observe.monitor import TAG_STATUS
from ..transport.tags import TAG_FAILURE, TAG_HEARTBEAT
from .commands import (AbortCommand, CommandIntake, FlushCommand, HelperCommand, ParkCommand, PostCommand,
                       ShutdownCommand, TakeCommand)
from .dispatch import Dispatch
from .handle import Handle
from .liveness import Liveness
from .pacing import Pacing
from .reductions import Reductions
from .stats import StatsRecorder

log = logging.getLogger("hvd_partial.engine")


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
        self.stats = StatsRecorder(self.size)
        from ..observe import attach_observer  # stall inspector, report, timeline; None when all are off

        self.observer = attach_observer(self)
        self.timeline = self.observer.timeline if self.observer is not None else None
        self.failure: HvdPartialError | None = None
        self.failed_at = 0.0  # time.monotonic() when failure was set
        self._calls: set[Handle] = set()  # posts, flushes and helpers in progress
        self._shutdown_handle: Handle | None = None
        self._leaving_requested = False  # set by the compute thread in shutdown()
        self._parked = 0  # compute threads waiting in a call that needs every rank (engine thread's count)
        # When the driver parks this rank's streams: such a wait that ends sooner (every rank came at
        # once) parks nothing, so it starts no round a designated rank would otherwise start there.
        self._park_at: float | None = None
        self._streams_parked = False
        self._takes: list = []  # TakeCommands waiting for rounds joined parked to complete
        # Called on the compute thread after it waited in such a call: adapters apply there the
        # rounds completed meanwhile, before the rank computes again (docs/design.md, "Parked ranks").
        self.unpark_listeners: list = []
        self._sends_wait_since: float | None = None  # shutdown done but for unsent messages
        self._stopped = threading.Event()
        # The parts reach the engine only through a weak proxy: a reference
        # cycle would keep every shut-down engine (with its buffers) alive
        # until a full garbage collection, which rarely comes.
        me = weakref.proxy(self)
        self._driver = Driver(self.rank, self.size, me, config.control_plane, config.activation_delay_us > 0,
                              getattr(transport, "quorum_counters", None))
        self._activation_delay = config.activation_delay_us / 1e6
        self._held_floods: deque = deque()  # (deadline, stream id, round): floods (with a quorum, additions) held back, oldest first
        self._bell = getattr(transport, "doorbell", None)
        self._intake = CommandIntake()
        relays = config.control_plane == "decentral" or self._driver.control.coordinator is not None
        self._pacing = Pacing(config, self._bell, self.size, relays,
                              self._intake.queue, self._driver.control.awaiting_start)
        self._intake.poke = self._pacing.poke
        self._reductions = Reductions(transport, self.rank, config.reduce_poll_us, self._driver.complete)
        # Negotiated helper collectives: submit(request), progress() each step, busy.
        self._helpers = Negotiator(transport, config, fail=lambda err: me.fail(err, notify=False, local=True),
                                   pending=self._calls)
        self._liveness = Liveness(transport, self.rank, self.size, config)
        self._dispatch = Dispatch(transport, self.rank, self._driver, {
            TAG_FAILURE: lambda source, notice: me.fail(me._liveness.failure_notice(source, notice)),
            TAG_HEARTBEAT: lambda source, beat: None,
            TAG_STATUS: lambda source, status: me._on_status(source, status)}, self._liveness.heard)
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
        self._intake.submit(command)
        return handle

    def submit_post(self, name, buffers, owned, layout, grouped, sync, op, signature) -> Handle:
        handle = Handle(name)
        return self._submit(PostCommand(name, buffers, owned, layout, grouped, sync, op, signature, handle), handle)

    def submit_flush(self, name: str) -> Handle:
        handle = Handle(name, parks=True)
        return self._submit(FlushCommand(name, handle), handle)

    def submit_helper(self, request) -> Handle:
        request.handle.parks = request.kind != LOCAL
        return self._submit(HelperCommand(request, request.handle), request.handle)

    def submit_take(self, name: str) -> Handle:
        handle = Handle(name)
        return self._submit(TakeCommand(name, handle), handle)

    def wait(self, handle: Handle):
        """Block until ``handle`` is done; raise the engine's failure if any.
        Waiting on a call that needs every rank parks this rank meanwhile."""
        if not handle.parks or handle.done():
            return self._wait(handle)
        self._intake.submit(ParkCommand(+1))
        try:
            value = self._wait(handle)
        finally:
            self._intake.submit(ParkCommand(-1))
        for listener in list(self.unpark_listeners):
            listener()
        return value

    def _wait(self, handle: Handle):
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
            self._leaving_requested = True
            self._intake.submit(ShutdownCommand(handle))
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
        self._intake.submit(AbortCommand(reason, handle))
        handle.wait(self.config.abort_grace_seconds + 1.0)
        self._stop_thread()

    def free_stream_comms(self) -> None:
        """Free the streams' communicators once the thread has stopped cleanly
        (collective: every rank frees them in stream order)."""
        if self._thread.is_alive() or self.failure is not None:
            return
        self._reductions.free_comms()

    def _stop_thread(self):
        self._stopped.set()
        self._pacing.poke()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(5.0, self.config.abort_grace_seconds + 1.0))

    # ===== what the observer may use (engine thread) =================================

    @property
    def busy(self) -> bool:
        """A call of this rank is in progress (or its shutdown)."""
        return bool(self._calls) or self._driver.leaving

    def tell(self, dest: int, tag: int, message) -> None:
        """Send ``message`` to rank ``dest`` under ``tag`` (the observer's statuses)."""
        self.transport.send(dest, tag, message)

    def fail(self, error: HvdPartialError, notify: bool = False, local: bool = False) -> None:
        """Fail every call in progress with ``error`` and stop; ``notify``: tell
        every other rank; ``local``: the error arose on this rank."""
        if self.failure is not None:
            return
        self.failure = error
        self.failed_at = time.monotonic()
        if local:
            log.error("rank %d: %s; telling the other ranks", self.rank, getattr(error, "reason", error))
        else:
            log.error("rank %d: %s", self.rank, error)
        if notify:
            self._liveness.notify(error)
        self._driver.fail(error)
        waiters = list(self._calls)
        if self._shutdown_handle is not None:
            waiters.append(self._shutdown_handle)
        for handle in waiters:
            handle.set_error(error)
        self._calls.clear()

    # ===== engine thread =============================================================

    def _run(self) -> None:
        pacing = self._pacing
        try:
            while not self._stopped.is_set():
                worked = self._step()
                if self._finished():
                    break
                if worked:
                    pacing.worked()
                else:
                    calls, held = self._calls, self._held_floods
                    timer = held[0][0] if held else None
                    if self._park_at is not None and (timer is None or self._park_at < timer):
                        timer = self._park_at
                    pacing.rest(self._reductions, self._helpers.busy,
                                min(h.posted_at for h in calls) if calls else None, timer)
        except TooManyStreamsError as exc:  # a limit the user can act on, not a crash
            self.fail(exc, notify=True, local=True)
            self._liveness.drain_notices()
        except BaseException as exc:  # the engine must never die silently
            log.exception("hvd_partial engine of rank %d crashed", self.rank)
            self.fail(EngineError(f"engine of rank {self.rank} crashed: {exc!r}"), notify=True)
            self._liveness.drain_notices()
        finally:
            if self.observer is not None:
                self.observer.close()
            self._stopped.set()

    def _step(self) -> bool:
        worked = False
        commands = self._intake.queue
        while commands:
            self._handle_command(commands.popleft())
            worked = True
        worked |= self._dispatch.deliver(self._pacing.take_ring())
        worked |= self._reductions.progress()
        if self._takes:
            self._finish_takes()
        held = self._held_floods
        if held and held[0][0] <= time.perf_counter():  # the oldest held flood's delay passed
            worked |= self._release_held_floods()
        if self._park_at is not None and self._park_at <= time.perf_counter():
            self._park_streams()
            worked = True
        worked |= self._helpers.progress()
        self._pacing.unsent = self.transport.progress_sends()
        now = time.monotonic()
        if self._liveness.due(now):
            if self.observer is not None:
                self.observer.tick()
            error = self._liveness.check(now)
            if error is not None:
                self.fail(error, notify=True)
        return worked

    def _finished(self) -> bool:
        if self.failure is not None:
            self._liveness.drain_notices()
            return True
        if not self._driver.left or self._reductions.in_flight or not self._helpers.finished:
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

    # -- commands -------------------------------------------------------------------

    def _handle_command(self, cmd) -> None:
        if isinstance(cmd, AbortCommand):
            self.fail(RankFailedError(self.rank, cmd.reason), notify=True, local=True)
            cmd.handle.set_result(None)
            return
        if isinstance(cmd, ParkCommand):
            self._park(cmd.delta)
            return
        if isinstance(cmd, TakeCommand):
            self._takes.append(cmd)
            self._finish_takes()
            return
        if self.observer is not None:
            self.observer.on_call(cmd.handle, cmd.describe(), cmd.name if isinstance(cmd, PostCommand) else None)
        if isinstance(cmd, ShutdownCommand):
            self._shutdown_handle = cmd.handle
            self._driver.leave()
            self._helpers.shutdown()
            return
        handle = cmd.handle
        self._calls.add(handle)
        try:
            _COMMANDS[type(cmd)](self, cmd)
        except HvdPartialError as err:
            self._calls.discard(handle)
            handle.set_error(err)

    def _post(self, cmd: PostCommand) -> None:
        self._driver.post(cmd.name, cmd.buffers, cmd.owned, cmd.layout, cmd.grouped, cmd.sync, cmd.op,
                          cmd.signature, Waiter("post", handle=cmd.handle))

    def _flush(self, cmd: FlushCommand) -> None:
        self._driver.flush(cmd.name, Waiter("flush", handle=cmd.handle))

    def _helper(self, cmd: HelperCommand) -> None:
        self._helpers.submit(cmd.request)

    def _finish_takes(self) -> None:
        waiting = []
        for cmd in self._takes:
            if self.failure is not None:
                cmd.handle.set_error(self.failure)
                continue
            results = self._driver.take(cmd.name)
            if results is None:
                waiting.append(cmd)
            else:
                cmd.handle.set_result(results)
        self._takes = waiting

    def _park(self, delta: int) -> None:
        """A compute thread begins or ends waiting in a call that needs every
        rank. Its streams are parked once the wait has lasted the activation
        delay (at once without one)."""
        before = self._parked
        self._parked += delta
        if before == 0 and self._parked > 0:
            self._park_at = time.perf_counter() + self._activation_delay
            if self._activation_delay <= 0:
                self._park_streams()
        elif before > 0 and self._parked == 0:
            self._park_at = None
            if self._streams_parked:
                self._streams_parked = False
                if self.failure is None:
                    self._driver.unpark()

    def _park_streams(self) -> None:
        self._park_at = None
        if self.failure is None and not self._streams_parked:
            self._streams_parked = True
            self._driver.park()

    def _on_status(self, source: int, status) -> None:
        if self.observer is not None:
            self.observer.on_status(source, status)

    # -- the protocol driver's host -------------------------------------------------------

    def send(self, dest: int, message) -> None:
        self._dispatch.send(dest, message)

    def stream_registered(self, stream: RankStream) -> None:
        self._reductions.add_stream(stream)

    def defer_activation(self, stream_id: int, round_number: int) -> None:
        # This rank's reduction of the round is in flight meanwhile, so the engine looks again
        # within Pacing's focus interval.
        self._held_floods.append((time.perf_counter() + self._activation_delay, stream_id, round_number))

    def _release_held_floods(self) -> bool:
        held = self._held_floods
        control = self._driver.control
        now = time.perf_counter()
        released = False
        while held:
            deadline, sid, round_number = held[0]
            if not control.holds_flood(sid, round_number):
                held.popleft()  # dropped already (the round completed): nothing to time
                continue
            if deadline > now:
                break
            held.popleft()
            joined = self._reductions.everyone_joined(sid, round_number)
            self._driver.on_message(self.rank, self._driver.release_message(sid, round_number, joined))
            released = True
        return released

    def launch(self, stream: RankStream, launch: Launch) -> None:
        if launch.facts is not None:
            self.stats.round_started(stream.name, launch.facts.lag)
        if self.timeline is not None:
            self.timeline.launched(stream.name, launch)
        self._reductions.launch(stream, launch)

    def reduced(self, stream: RankStream, launch: Launch, result: RoundResult) -> None:
        # (decentralized plane: the lags travel in the round's facts)
        self.stats.round_completed(stream.name, result, stream.last_known_taken())
        if self.timeline is not None:
            self.timeline.reduced(stream.name, launch, result)

    def finished(self, stream: RankStream, waiter: Waiter) -> None:
        handle = waiter.handle
        if handle is None:  # a flush of shutdown's own
            return
        self._calls.discard(handle)
        handle.set_result(waiter.results)
        if self.observer is not None:
            self.observer.on_finish(stream.name, waiter)
        if waiter.kind == "post":
            self.stats.post_finished(stream.name, handle.wait_seconds or 0.0)

    def refused(self, waiter: Waiter, error: Exception) -> None:
        if waiter.handle is not None:
            self._calls.discard(waiter.handle)
            waiter.handle.set_error(error)

    def failed(self, error: Exception) -> None:
        self.fail(error, notify=True, local=True)


_COMMANDS = {PostCommand: Engine._post, FlushCommand: Engine._flush, HelperCommand: Engine._helper}
