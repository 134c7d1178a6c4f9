"""Per-stream participation statistics, recorded by the engine and read by
``hvd_partial.stats()`` from any thread."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

_WAIT_SAMPLES = 2048  # recent waits kept per stream for the mean and p95


class StreamStats:
    def __init__(self, world_size: int):
        self.rounds = 0
        self.fresh = [0] * world_size
        self.stale = [0] * world_size
        self.initiated = [0] * world_size
        self.lag = [0] * world_size
        self.max_staleness_seen = 0
        self.posts = 0
        self.waits: deque[float] = deque(maxlen=_WAIT_SAMPLES)


class StatsRecorder:
    """Thread-safe counters; the engine writes, ``snapshot`` reads.

    Example::

        hvd.stats()["grads"]["fresh"]  # fresh contributions per rank
    """

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._lock = threading.Lock()
        self._streams: dict[str, StreamStats] = {}

    def _get(self, name: str) -> StreamStats:
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = StreamStats(self.world_size)
        return stream

    def round_completed(self, name: str, result) -> None:
        with self._lock:
            s = self._get(name)
            s.rounds += 1
            for rank in result.contributors:
                staleness = result.staleness.get(rank, 0)
                if staleness == 0:
                    s.fresh[rank] += 1
                else:
                    s.stale[rank] += 1
                s.max_staleness_seen = max(s.max_staleness_seen, staleness)
            if result.initiator is not None:
                s.initiated[result.initiator] += 1

    def round_started(self, name: str, lag) -> None:
        if lag:
            with self._lock:
                self._get(name).lag = list(lag)

    def post_finished(self, name: str, wait_seconds: float) -> None:
        with self._lock:
            s = self._get(name)
            s.posts += 1
            s.waits.append(wait_seconds)

    def snapshot(self) -> dict:
        with self._lock:
            out = {}
            for name, s in self._streams.items():
                waits = np.fromiter(s.waits, dtype=float) if s.waits else np.zeros(0)
                out[name] = {
                    "rounds": s.rounds,
                    "fresh": list(s.fresh),
                    "stale": list(s.stale),
                    "initiated": list(s.initiated),
                    "lag": list(s.lag),
                    "max_staleness_seen": s.max_staleness_seen,
                    "posts": s.posts,
                    "wait_mean_s": float(waits.mean()) if waits.size else 0.0,
                    "wait_p95_s": float(np.percentile(waits, 95)) if waits.size else 0.0,
                }
            return out
