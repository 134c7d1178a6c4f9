"""Per-stream participation statistics, recorded by the engine and read by
``hvd_partial.stats()`` from any thread."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from ..core.decentral.facts import lags

_WAIT_SAMPLES = 2048  # recent waits kept per stream for the mean and p95
# Staleness rows kept before they are counted in one vector operation (fewer for a large world).
_FOLD_ROWS, _FOLD_ENTRIES = 64, 1 << 16


class StreamStats:
    def __init__(self, world_size: int):
        self.rounds = 0
        self.fresh = np.zeros(world_size, np.int64)
        self.stale = np.zeros(world_size, np.int64)
        self.initiated = [0] * world_size
        self.lag: list | tuple = [0] * world_size  # or (round, known_taken row) to read on demand
        self.max_staleness_seen = 0
        self.posts = 0
        self.reductions = 0  # data reductions started here (one nonblocking allreduce per fused buffer)
        self.reductions_per_round = 0  # ... in the latest round that reduced data
        self.waits: deque[float] = deque(maxlen=_WAIT_SAMPLES)
        self.rows: list = []  # staleness rows of rounds not counted yet

    def fold(self) -> None:
        """Count the kept staleness rows (0: nothing summed, 1: fresh, k + 1: k rounds late)."""
        if not self.rows:
            return
        rows = np.stack(self.rows)
        self.rows = []
        self.fresh += (rows == 1).sum(axis=0)
        self.stale += (rows > 1).sum(axis=0)
        self.max_staleness_seen = max(self.max_staleness_seen, int(rows.max()) - 1)

    def lags(self) -> list:
        if isinstance(self.lag, tuple):
            return lags(*self.lag)
        return list(self.lag)


class StatsRecorder:
    """Thread-safe counters; the engine writes, ``snapshot`` reads.

    A round costs the engine O(1) Python work here: its staleness row is kept
    and counted with others later, and the lags are read from the last
    round's facts only when asked.

    Example::

        hvd.stats()["grads"]["fresh"]  # fresh contributions per rank
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._fold_rows = max(1, min(_FOLD_ROWS, _FOLD_ENTRIES // world_size))
        self._lock = threading.Lock()
        self._streams: dict[str, StreamStats] = {}

    def _get(self, name: str) -> StreamStats:
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = StreamStats(self.world_size)
        return stream

    def round_completed(self, name: str, result, known_taken: np.ndarray | None = None) -> None:
        """A round of ``name`` completed with ``result``; ``known_taken``: the
        rounds each rank had taken when it joined (from the round's facts, on
        the decentralized plane; a waiting post counts as taken): the lags."""
        with self._lock:
            s = self._get(name)
            if known_taken is not None:
                s.lag = (result.round, known_taken)
            s.rounds += 1
            s.rows.append(result.staleness_row(self.world_size))
            if len(s.rows) >= self._fold_rows:
                s.fold()
            if result.initiator is not None:
                s.initiated[result.initiator] += 1

    def round_started(self, name: str, lag) -> None:
        """The lags per rank when a round started (a ``Start``'s list, where one carries it)."""
        if lag:
            with self._lock:
                self._get(name).lag = list(lag)

    def reductions_started(self, name: str, count: int) -> None:
        """A round of ``name`` started ``count`` data reductions here (its fused buffers)."""
        with self._lock:
            s = self._get(name)
            s.reductions += count
            s.reductions_per_round = count

    def post_finished(self, name: str, wait_seconds: float) -> None:
        with self._lock:
            s = self._get(name)
            s.posts += 1
            s.waits.append(wait_seconds)

    def snapshot(self) -> dict:
        with self._lock:
            out = {}
            for name, s in self._streams.items():
                s.fold()
                waits = np.fromiter(s.waits, dtype=float) if s.waits else np.zeros(0)
                out[name] = {
                    "rounds": s.rounds,
                    "fresh": s.fresh.tolist(),
                    "stale": s.stale.tolist(),
                    "initiated": list(s.initiated),
                    "lag": s.lags(),
                    "max_staleness_seen": s.max_staleness_seen,
                    "posts": s.posts,
                    "reductions": s.reductions,
                    "reductions_per_round": s.reductions_per_round,
                    "wait_mean_s": float(waits.mean()) if waits.size else 0.0,
                    "wait_p95_s": float(np.percentile(waits, 95)) if waits.size else 0.0,
                }
            return out
