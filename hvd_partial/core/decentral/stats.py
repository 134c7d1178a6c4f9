"""What a decentralized stream counts about its own work, for tests,
benchmarks and the engine's reports; the protocol never reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StreamStats:
    """Counters of one rank's :class:`~.stream.DecentralStream`."""

    quorum_additions: int = 0  # additions this rank made to quorum counters
    quorum_notices: int = 0  # ... that made a quorum at another rank, which it told
    deferred_additions: int = 0  # additions made only because the round's activation delay ended first
    floods_held: int = 0  # rounds whose flood was held back here (on the host's timer)
    floods_dropped: int = 0  # ... and never needed: the round completed first
    joined_early: int = 0  # rounds joined before their start was heard (majority)
    joined_at_flush: int = 0  # balanced rounds joined at a flush, without the flush gather
