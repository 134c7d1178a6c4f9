"""The engine: one background thread per process that alone calls MPI.

Compute threads submit commands (post, flush, helper collectives, shutdown)
and wait on handles. The engine thread runs this rank's protocol
:class:`~hvd_partial.core.driver.Driver` (the same one the loopback world and
the simulator run) and hosts it: it moves the driver's messages, starts and
completes the reductions it launches, and wakes the calls it finishes.

Its parts, one job each: :mod:`.commands` (intake), :mod:`.host` (where the
driver's outputs go), :mod:`.dispatch` (messages by tag), :mod:`.reductions`
(rounds in flight), :mod:`.held_floods` (the activation delay's timer),
:mod:`.parking` (parked ranks and the takes that wait for them), the helper
collectives' :class:`~hvd_partial.collectives.negotiator.Negotiator`,
:mod:`.liveness` (ring heartbeats and the failure flood), :mod:`.pacing` (the
idle/wake policy) and :mod:`.leaving` (shutdown). It reaches the network only
through a :class:`~hvd_partial.transport.protocol.Transport`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from .. import faults
from ..collectives.negotiator import Negotiator
from ..collectives.requests import LOCAL
from ..config import Config
from ..core.driver import Driver
from ..core.growth import rests_carried, start_carried
from ..core.post_request import PostRequest
from ..core.rank_stream import Waiter
from ..core.world import World
from ..errors import (EngineError, HorovodInternalError, HvdPartialError, NotInitializedError, PartialResultError,
                      RankFailedError, TooManyStreamsError)
from ..observe.monitor import TAG_STATUS
from ..transport.protocol import Transport
from ..transport.tags import TAG_FAILURE, TAG_HEARTBEAT
from .commands import (AbortCommand, CommandIntake, FlushCommand, HelperCommand, ParkCommand, PostCommand,
                       ShutdownCommand, TakeCommand)
from .dispatch import Dispatch
from .handle import Handle
from .held_floods import HeldFloods
from .host import EngineHost
from .leaving import Leaving
from .liveness import Liveness
from .pacing import Pacing, reduce_poll_us, usable_cores
from .readout import EngineReadout
from .parking import Parking
from .recovery import recover
from .reductions import Reductions
from .stats import StatsRecorder

log = logging.getLogger("hvd_partial.engine")


class Engine:
    """The background progress thread of one process.

    Example (what ``hvd_partial.init`` does)::

        engine = Engine(MpiTransport(comm), config)
        engine.start()
        handle = engine.submit_post(PostRequest(...))
    """

    def __init__(self, transport: Transport, config: Config, world: World | None = None,
                 carried: dict[str, int] | None = None):
        """``world`` and ``carried``: where the world grew (elastic training,
        :mod:`.growth`), the world this engine starts in and, per stream, the rounds
        it completed on the engine before."""
        # -- who: this rank, its transport and configuration
        self.transport = transport
        self.config = config
        self.rank = transport.rank
        self.size = transport.size
        # -- what users, adapters and the observer read
        self.stats = StatsRecorder(self.size)
        from ..observe import attach_observer  # stall inspector, report, timeline; None when all are off

        self.observer = attach_observer(self)
        self.timeline = self.observer.timeline if self.observer is not None else None
        self.failure: HvdPartialError | None = None
        # -- the world: its rank and size now and the changes since init (elastic training)
        self.world = world or World.initial(self.rank, self.size)
        self.worlds = {self.world.version: self.world}  # every world since init (or since it grew), by version
        self.acknowledged_version = self.world.version  # the world version this rank's helper collectives run on
        self.recoveries: list = []  # elastic training: what each recovery did (Recovered)
        self.failed_at = 0.0  # time.monotonic() when failure was set
        # Called on the compute thread after it waited in a call that needs every rank: adapters apply
        # there the rounds completed meanwhile, before the rank computes again (docs/design.md, "Parked ranks").
        self.unpark_listeners: list = []
        # The other engines of this process (the session's and its process sets' own, see
        # collectives/set_engines.py): a wait here parks their streams too, as it parks this one's.
        self.companions = lambda: ()
        # -- the calls compute threads wait on: posts, flushes and helpers in progress
        self._calls: set[Handle] = set()
        # -- the parts, each built from those before it. They reach the engine only through
        # a weak proxy: a reference cycle would keep every shut-down engine (with its
        # buffers) alive until a full garbage collection, which rarely comes.
        me = weakref.proxy(self)
        self._intake = CommandIntake()
        self._host = EngineHost(me, self.stats, self._calls, lambda error: me.fail(error, notify=True, local=True))
        self._driver = Driver(self.rank, self.size, weakref.proxy(self._host), config.activation_delay_us > 0,
                              transport.quorum_counters)
        start_carried(self._driver, carried or {})
        self._liveness = Liveness(transport, self.rank, self.size, config)
        self._dispatch = Dispatch(transport, self.rank, self._driver, {
            TAG_FAILURE: lambda source, notice: _fail_if(me, me._liveness.failure_notice(source, notice)),
            TAG_HEARTBEAT: lambda source, beat: None,
            TAG_STATUS: lambda source, status: me._on_status(source, status)}, self._liveness.heard)
        poll_us = reduce_poll_us(config.reduce_poll_us, transport.local_size, usable_cores())
        self._reductions = Reductions(transport, self.rank, poll_us, self._driver.complete)
        if config.elastic:  # contributions outlive a failure (the transport raises MPI errors, never aborts)
            self._reductions.keep_contributions = True
        self._floods = HeldFloods(config.activation_delay_us / 1e6, self._driver.holds_flood,
                                  self._driver.release_flood, self._reductions.everyone_joined)
        self._host.connect(self._dispatch, self._reductions, self._floods)
        self._parking = Parking(self._driver, config.activation_delay_us / 1e6, lambda: me.failure)
        # Negotiated helper collectives: submit(request), progress() each step, busy.
        self._helpers = Negotiator(transport, config, fail=lambda err: me.fail(err, notify=False, local=True),
                                   pending=self._calls)
        if config.elastic:  # keep the latest results for survivors whose execution fails
            self._helpers.kept = {}
        self._bell = transport.doorbell
        relays = True  # every rank relays the floods of its streams
        self._pacing = Pacing(config, self._bell, self.size, relays,
                              self._intake.queue, self._driver.control.awaiting_start)
        self._intake.poke = self._pacing.poke
        self._leaving = Leaving(transport, self.rank, config.failure_timeout_seconds)
        self.readout = EngineReadout(self._pacing, self._driver)  # read-only views for tests and benchmarks
        # -- the thread
        self._stopped = threading.Event()
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
        if self._stopped.is_set() or self._leaving.requested:
            raise NotInitializedError("hvd_partial is shut down on this rank; call hvd_partial.init() first")
        self._intake.submit(command)
        return handle

    def submit_post(self, request: PostRequest) -> Handle:
        handle = Handle(request.name)
        return self._submit(PostCommand(request, handle), handle)

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
        Waiting on a call that needs every rank parks this rank meanwhile, on this
        engine's streams and on its companions' (a process set's engine's)."""
        if not handle.parks or handle.done():
            return self._wait(handle)
        engines = [self, *self.companions()]
        for engine in engines:
            engine._intake.submit(ParkCommand(+1))
        try:
            value = self._wait(handle)
        finally:
            for engine in engines:
                engine._intake.submit(ParkCommand(-1))
        for engine in engines:
            for listener in list(engine.unpark_listeners):
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
            self._leaving.requested = True
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
        """Free the streams' and the process sets' communicators once the thread has
        stopped cleanly (collective: every rank frees them in stream, then set, order)."""
        if self._thread.is_alive() or self.failure is not None:
            return
        self._reductions.free_comms()
        self._helpers.free_sets()

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
        if self._leaving.handle is not None:
            waiters.append(self._leaving.handle)
        for handle in waiters:
            handle.set_error(error)
        self._calls.clear()

    # ===== engine thread =============================================================

    def _run(self) -> None:
        try:
            pacing = self._pacing
            while not self._stopped.is_set():
                try:
                    worked = self._step()
                    if self._finished():
                        break
                    if worked:
                        pacing.worked()
                    else:
                        calls = self._calls
                        timer, park_at = self._floods.deadline, self._parking.park_at
                        if park_at is not None and (timer is None or park_at < timer):
                            timer = park_at
                        pacing.rest(self._reductions, self._helpers.busy,
                                    min(h.posted_at for h in calls) if calls else None, timer)
                except Exception as exc:  # noqa: BLE001 - a dead peer, where elastic training survives it
                    if not (self.config.elastic and (isinstance(exc, PartialResultError)
                                                     or self.transport.is_process_failure(exc))):
                        raise
                    self._recover()
                    pacing = self._pacing
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

    def _recover(self) -> None:
        """Survive a dead peer (elastic training): docs/elastic.md, hvd_partial/engine/recovery.py."""
        me = weakref.proxy(self)
        done = recover(self.transport, self._driver, self._reductions, self._helpers, self.world, self.worlds,
                       self._dispatch)
        self.recoveries.append(done)
        self.world = done.world
        self.rank, self.size = done.world.rank, done.world.size
        lost = HorovodInternalError(f"rank {self.rank}: the world changed (ranks {list(done.failed)}, numbered as "
                                    "at init, failed); helper collectives in flight were abandoned")
        self._helpers.abandon(lost)
        self._helpers = Negotiator(self.transport, self.config,
                                   fail=lambda err: me.fail(err, notify=False, local=True), pending=self._calls)
        self._helpers.kept = {}
        if self._leaving.handle is not None or self._driver.leaving:
            self._helpers.shutdown()
        self._liveness = Liveness(self.transport, self.rank, self.size, self.config)
        self._pacing = Pacing(self.config, self.transport.doorbell, self.size, True,
                              self._intake.queue, self._driver.control.awaiting_start)
        self._intake.poke = self._pacing.poke
        self.stats = StatsRecorder(self.size)
        self._host.rebase(self.stats)
        if self.config.min_np and self.size < self.config.min_np:
            self.fail(RankFailedError(done.failed[0] if done.failed else None, (
                f"elastic: {self.size} ranks left, fewer than min_np {self.config.min_np} (hvd-partial-run "
                f"--min-np); ranks lost since init (numbered as at init): {list(self.world.lost)}")), local=True)
        if self.observer is not None:
            self.observer.rebase(self.rank, self.size)

    def _step(self) -> bool:
        worked = False
        commands, handlers = self._intake.queue, _COMMANDS
        while commands:
            command = commands.popleft()
            handlers[type(command)](self, command)
            worked = True
        worked |= self._dispatch.deliver(self._pacing.take_ring())
        worked |= self._reductions.progress()
        parking = self._parking
        if parking.takes:
            parking.finish_takes()
        held = self._floods.held
        if held and held[0][0] <= time.perf_counter():  # the oldest held flood's delay passed
            worked |= self._floods.release_due()
        if parking.park_at is not None and parking.park_at <= time.perf_counter():
            parking.park_streams()
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
        if not self._leaving.last_sends_out():
            return False
        if self._leaving.handle is not None:
            self._leaving.handle.set_result(None)
        return True

    # -- commands -------------------------------------------------------------------

    # Posts, flushes and helpers are calls in progress until the driver or the
    # negotiator finishes them; one they refuse at once fails its handle.

    def _post(self, cmd: PostCommand) -> None:
        request, handle = cmd.request, cmd.handle
        faults.point("post_submitted")
        self._begin_call(cmd, request.name)
        try:
            self._driver.post(request, Waiter("post", handle=handle))
        except HvdPartialError as err:
            self._refuse_call(handle, err)

    def _flush(self, cmd: FlushCommand) -> None:
        faults.point("flush_submitted")
        self._begin_call(cmd, None)
        if rests_carried(self._driver, cmd.name):
            # carried over a grow and not posted to since: no rank can have a round of it yet
            self._calls.discard(cmd.handle)
            cmd.handle.set_result([])
            return
        try:
            self._driver.flush(cmd.name, Waiter("flush", handle=cmd.handle))
        except HvdPartialError as err:
            self._refuse_call(cmd.handle, err)

    def _helper(self, cmd: HelperCommand) -> None:
        self._begin_call(cmd, None)
        if self.world.version != self.acknowledged_version and cmd.request.kind != LOCAL:
            if cmd.request.release is not None:  # the name is free again (a reset calls it once more)
                cmd.request.release()
            self._refuse_call(cmd.handle, HorovodInternalError(
                f"rank {self.rank}: the world changed (version {self.world.version}, ranks {list(self.world.lost)} "
                "lost, numbered as at init); helper collectives fail until this rank calls "
                "acknowledge_world_change() (hvd.elastic.run's reset does)"))
            return
        try:
            self._helpers.submit(cmd.request)
        except HvdPartialError as err:
            self._refuse_call(cmd.handle, err)

    def _begin_call(self, cmd, stream: str | None) -> None:
        if self.observer is not None:
            self.observer.on_call(cmd.handle, cmd.describe(), stream)
        self._calls.add(cmd.handle)

    def _refuse_call(self, handle: Handle, error: HvdPartialError) -> None:
        self._calls.discard(handle)
        handle.set_error(error)

    def _shut_down(self, cmd: ShutdownCommand) -> None:
        if self.observer is not None:
            self.observer.on_call(cmd.handle, cmd.describe(), None)
        self._leaving.handle = cmd.handle
        self._driver.leave()
        self._helpers.shutdown()

    def _abort(self, cmd: AbortCommand) -> None:
        self.fail(RankFailedError(self.rank, cmd.reason), notify=True, local=True)
        cmd.handle.set_result(None)

    def _on_status(self, source: int, status) -> None:
        if self.observer is not None:
            self.observer.on_status(source, status)


def _fail_if(engine: Engine, error: HvdPartialError | None) -> None:
    """A failure notice fails the engine, unless elastic training survives it (``error`` None)."""
    if error is not None:
        engine.fail(error)


# Each command's handler, by its type (the engine thread takes every queued command through it).
_COMMANDS = {PostCommand: Engine._post, FlushCommand: Engine._flush, HelperCommand: Engine._helper,
             TakeCommand: lambda engine, cmd: engine._parking.add_take(cmd),
             ParkCommand: lambda engine, cmd: engine._parking.change(cmd.delta), ShutdownCommand: Engine._shut_down,
             AbortCommand: Engine._abort}
