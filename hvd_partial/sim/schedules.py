"""Compute-time schedules for the simulators: how long rank ``j`` computes
at its step ``s``, as a function ``compute(j, s) -> seconds``.

Example::

    compute = random_delays(world_size=64, step_s=0.02, delay_s=0.32, seed=0, delayed_per_step=2)
    compute(5, 0)  # 0.02, or 0.34 if rank 5 is one of the two delayed at step 0
"""

from __future__ import annotations

from typing import Callable

from .replay import delayed_rank


def random_delays(world_size: int, step_s: float, delay_s: float, seed: int,
                  delayed_per_step: int = 1) -> Callable[[int, int], float]:
    """The paper's injected imbalance: every step takes ``step_s``, and at
    each step ``delayed_per_step`` random ranks (drawn from ``seed``, the same
    on every rank) take ``delay_s`` more. Identical to
    :func:`hvd_partial.sim.replay.sleeper_schedule` (the benchmarks' MPI runs
    use that), but draws each step's delayed ranks once, which matters at a
    thousand ranks."""
    chosen: dict[int, frozenset] = {}

    def compute(rank: int, step: int) -> float:
        ranks = chosen.get(step)
        if ranks is None:
            ranks = chosen[step] = frozenset(delayed_rank(seed * 1000 + k, step, world_size)
                                             for k in range(delayed_per_step))
        return step_s + (delay_s if rank in ranks else 0.0)

    return compute


def persistent_straggler(world_size: int, step_s: float, slowdown: float,
                         straggler: int | None = None) -> Callable[[int, int], float]:
    """One rank (the last by default) always takes ``slowdown`` times longer."""
    slow = world_size - 1 if straggler is None else straggler
    if not 0 <= slow < world_size:
        raise ValueError(f"straggler rank {slow} outside a world of {world_size}")

    def compute(rank: int, step: int) -> float:
        return step_s * slowdown if rank == slow else step_s

    return compute
