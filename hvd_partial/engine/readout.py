"""Read-only views of one engine's state, for tests and benchmarks (any thread).

Example::

    engine = hvd_partial.session.current().engine
    engine.readout.stream_counters("grads").joined_early
"""

from __future__ import annotations

from ..core.decentral.stats import StreamStats
from ..core.driver import Driver
from ..core.growth import streams_at_rest
from ..core.rank_stream import RankStream
from .pacing import Pacing


class EngineReadout:
    """What an engine's parts show of themselves; nothing here changes them."""

    def __init__(self, pacing: Pacing, driver: Driver):
        self._pacing = pacing
        self._driver = driver

    @property
    def asleep(self) -> bool:
        """The engine thread sleeps now (idle, or napping while a call waits)."""
        return self._pacing.asleep

    @property
    def naps(self) -> int:
        """How many naps the engine thread took while a call of this rank waited."""
        return self._pacing.naps

    def stream_state(self, name: str) -> RankStream | None:
        """This rank's protocol state of stream ``name`` (None if unknown). To read, not to change."""
        return self._driver.streams.get(name)

    def stream_counters(self, name: str) -> StreamStats | None:
        """What the decentralized rounds of stream ``name`` counted on this rank, or None for a
        stream without them (sync, unknown). To read, not to change."""
        stream = self._driver.streams.get(name)
        machine = None if stream is None or stream.id is None else self._driver.control.streams.get(stream.id)
        return None if machine is None else machine.stats

    def streams_at_rest(self) -> dict[str, int | None] | None:
        """Per stream, the rounds it completed if it is at rest on this rank (registered,
        no post or flush in progress, nothing pending, every round started here completed
        and taken), else None for it; None altogether while a stream is still registering.
        Read it on the engine thread (``run_on_engine``): where the world may grow."""
        return streams_at_rest(self._driver)
