"""The protocol driver's host on the engine thread: where the driver's
outputs go (:class:`~hvd_partial.core.driver.DriverHost`).

A message goes to :mod:`.dispatch`, a reduction to :mod:`.reductions`, a
held-back flood to :mod:`.held_floods`; a finished or refused call wakes its
compute thread and leaves the engine's calls in progress; the statistics, the
observer and the timeline hear of each round.

Example::

    host = EngineHost(engine_proxy, stats, calls, fail)
    driver = Driver(rank, size, weakref.proxy(host), ...)
    host.connect(dispatch, reductions, floods)   # the parts that need the driver first
"""

from __future__ import annotations

from typing import Callable

from ..core.rank_stream import Launch, RankStream, Waiter
from ..core.round_result import RoundResult
from .dispatch import Dispatch
from .handle import Handle
from .held_floods import HeldFloods
from .reductions import Reductions
from .stats import StatsRecorder


class EngineHost:
    """``engine``: a weak proxy of the engine, whose ``observer`` and
    ``timeline`` a framework adapter may replace while it runs; ``calls``: the
    engine's handles in progress (a finished call leaves it); ``fail(error)``:
    this rank cannot go on (every rank is told)."""

    def __init__(self, engine, stats: StatsRecorder, calls: set[Handle], fail: Callable[[Exception], None]):
        self._engine = engine
        self._stats = stats
        self._calls = calls
        self._fail = fail
        self._dispatch: Dispatch | None = None
        self._reductions: Reductions | None = None
        self._floods: HeldFloods | None = None

    def connect(self, dispatch: Dispatch, reductions: Reductions, floods: HeldFloods) -> None:
        """The parts the driver's outputs go to (built after the driver, which they call)."""
        self._dispatch = dispatch
        self._reductions = reductions
        self._floods = floods

    def send(self, dest: int, message) -> None:
        self._dispatch.send(dest, message)

    def rebase(self, stats: StatsRecorder) -> None:
        """The world shrank: statistics start again, sized to the new world."""
        self._stats = stats

    def stream_registered(self, stream: RankStream) -> None:
        if self._engine.config.elastic:
            stream.keep_rounds()
            stream.world_version = self._engine.world.version
        self._reductions.add_stream(stream)

    def defer_activation(self, stream_id: int, round_number: int) -> None:
        # This rank's reduction of the round is in flight meanwhile, so the engine looks again
        # within Pacing's focus interval.
        self._floods.hold(stream_id, round_number)

    def launch(self, stream: RankStream, launch: Launch) -> None:
        if launch.facts is not None:
            self._stats.round_started(stream.name, launch.facts.lag)
        if launch.send is not None:  # the facts travel in a buffer of their own
            self._stats.reductions_started(stream.name, len(launch.send) - launch.with_facts)
        timeline = self._engine.timeline
        if timeline is not None:
            timeline.launched(stream.name, launch)
        self._reductions.launch(stream, launch)

    def reduced(self, stream: RankStream, launch: Launch, result: RoundResult) -> None:
        # (decentralized plane: the lags travel in the round's facts)
        self._stats.round_completed(stream.name, result, stream.last_known_taken())
        timeline = self._engine.timeline
        if timeline is not None:
            timeline.reduced(stream.name, launch, result)

    def finished(self, stream: RankStream, waiter: Waiter) -> None:
        handle = waiter.handle
        if handle is None:  # a flush of shutdown's own
            return
        self._calls.discard(handle)
        handle.set_result(waiter.results)
        observer = self._engine.observer
        if observer is not None:
            observer.on_finish(stream.name, waiter)
        if waiter.kind == "post":
            self._stats.post_finished(stream.name, handle.wait_seconds or 0.0)

    def refused(self, waiter: Waiter, error: Exception) -> None:
        if waiter.handle is not None:
            self._calls.discard(waiter.handle)
            waiter.handle.set_error(error)

    def failed(self, error: Exception) -> None:
        self._fail(error)
