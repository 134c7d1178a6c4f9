"""Zero-overhead replay: the protocol's own rules (every rank runs the same
protocol driver the engine runs, in a loopback world) on a simulated clock
where communication is free. It gives the best throughput any implementation of the rules could
reach for a given schedule of compute times, the yardstick for benchmarks.

Example::

    compute = sleeper_schedule(world_size=4, step_s=0.020, delay_s=0.100, seed=0)
    result = replay(4, Solo(), max_staleness=8, steps=100, compute_seconds=compute)
    print(result.rounds_per_second)
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.fusion import Layout
from ..modes import Mode, Sum
from .loopback import LoopbackWorld


@dataclass
class ReplayResult:
    rounds: int  # rounds started (the final flush round excluded)
    seconds: float  # when the last rank's last post returned
    finish: list  # per rank: when its last post returned

    @property
    def rounds_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds > 0 else float("inf")


def delayed_rank(seed: int, step: int, world_size: int) -> int:
    """The rank that sleeps the extra delay at ``step``: the same on every rank."""
    digest = hashlib.blake2b(f"delay\0{seed}\0{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % world_size


def sleeper_schedule(world_size: int, step_s: float, delay_s: float, seed: int,
                     delayed_per_step: int = 1) -> Callable[[int, int], float]:
    """The paper's imbalance pattern: every step takes ``step_s``, and at each
    step ``delayed_per_step`` random ranks (drawn from ``seed``) take ``delay_s`` more."""

    def compute(rank: int, step: int) -> float:
        chosen = {delayed_rank(seed * 1000 + k, step, world_size) for k in range(delayed_per_step)}
        return step_s + (delay_s if rank in chosen else 0.0)

    return compute


def replay(world_size: int, mode: Mode, max_staleness: int, steps: int,
           compute_seconds: Callable[[int, int], float]) -> ReplayResult:
    """Run ``steps`` posts per rank with free communication; compute of rank
    ``j`` at its step ``s`` takes ``compute_seconds(j, s)``."""
    world = LoopbackWorld(world_size, mode, Sum, max_staleness, Layout.of([np.zeros(1)]))
    done_steps = [0] * world_size
    computing = [False] * world_size
    finish = [0.0] * world_size
    events: list[tuple[float, int]] = []
    now = 0.0

    flushed = [False] * world_size

    def schedule_idle():
        changed = True
        while changed:
            changed = False
            for j in range(world_size):
                if computing[j] or flushed[j] or not world.idle(j):
                    continue
                if done_steps[j] < steps:
                    computing[j] = True
                    heapq.heappush(events, (now + compute_seconds(j, done_steps[j]), j))
                else:
                    # Done training: enter flush, so the others are not held by the staleness bound.
                    finish[j] = now
                    flushed[j] = True
                    world.flush(j)
                    world.run_communication()
                    changed = True

    schedule_idle()
    one = [np.ones(1)]
    while events:
        now, j = heapq.heappop(events)
        computing[j] = False
        done_steps[j] += 1
        world.post(j, one)
        world.run_communication()
        schedule_idle()
    if any(not world.idle(j) for j in range(world_size)):  # pragma: no cover - would be a protocol bug
        raise RuntimeError("replay ended with ranks still waiting")
    rounds = world.ranks[0].stream.started - 1  # the final flush round is not training
    return ReplayResult(rounds, max(finish), finish)
