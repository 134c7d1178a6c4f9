"""Worker: solo and majority DistributedOptimizers on process sets (4 ranks: evens [0, 2]
and odds [1, 3]), each set a world of its own.

Usage: process_set_modes_cases.py CASE   (train, unflushed)
Every rank reports a dict the test asserts on.
"""

from __future__ import annotations

import sys
import time

import torch

import hvd_partial.torch as hvd
from workers.support import phase, report

STEPS = 8


def _contribution(rank: int, step: int) -> torch.Tensor:
    """What ``rank`` posts at ``step``: small integers, so that every sum is exact."""
    return torch.tensor([float(rank + 1), float(step + 1), float((rank + 1) * (step + 1))])


def _train(opt, weight, rank: int, slow: bool, world=None, steps=range(STEPS)) -> None:
    """``steps`` of ``opt``; ``world``: (optimizer, weight) of a global stream stepped in between."""
    for step in steps:
        if slow:  # an imbalance only: nothing below depends on it
            time.sleep(0.02)
        for o, w in ((opt, weight),) if world is None else ((opt, weight), world):
            o.zero_grad()
            (w * _contribution(rank, step)).sum().backward()
            o.step()


def _expected(ranks) -> list[float]:
    """SGD with lr 1 from zero and op=Sum: minus everything the ranks posted (nothing lost)."""
    return (-sum(_contribution(r, s) for r in ranks for s in range(STEPS))).tolist()


def train() -> dict:
    r = hvd.rank()
    evens = hvd.add_process_set([0, 2])
    odds = hvd.add_process_set([1, 3])
    mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
    out = {}
    for label, mode in (("solo", hvd.Solo()), ("majority", hvd.Majority(seed=3, quorum=1))):
        phase(f"{label} on the set")
        weight = torch.nn.Parameter(torch.zeros(3))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), op=hvd.Sum, mode=mode, process_set=mine)
        # The other set's optimizer: on this rank, outside its set, it steps with this rank's gradients alone.
        alone = torch.nn.Parameter(torch.zeros(3))
        outside = hvd.DistributedOptimizer(torch.optim.SGD([alone], lr=1.0), op=hvd.Sum, mode=mode,
                                           process_set=other)
        # A global stream of the same mode, stepped in between: the session's engine runs beside the set's.
        everyone = torch.nn.Parameter(torch.zeros(3))
        world = hvd.DistributedOptimizer(torch.optim.SGD([everyone], lr=1.0), op=hvd.Sum, mode=mode)
        _train(opt, weight, r, slow=r in (2, 3), world=(world, everyone))
        opt.flush()
        world.flush()
        _train(outside, alone, r, slow=False)
        outside.flush()
        stats = opt.stats()
        out[label] = {"weight": weight.detach().tolist(), "bits": weight.detach().numpy().tobytes().hex(),
                      "expected": _expected(mine.ranks), "rounds": opt.rounds, "name": opt.name,
                      "stats_ranks": len(stats.get("fresh", [])),
                      "contributions": sum(stats.get("fresh", [])) + sum(stats.get("stale", [])),
                      "alone": alone.detach().tolist(),
                      "alone_expected": _expected([r]), "outside_mode": outside.mode.kind,
                      "world": everyone.detach().tolist(), "world_expected": _expected(range(hvd.size()))}
    phase("the global set still works")
    out["world_sum"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).tolist()
    phase("remove the sets (their engines stop)")
    engine = opt._engine()  # this rank's set's engine, to read once removed
    out["removed"] = [hvd.remove_process_set(evens), hvd.remove_process_set(odds)]
    out["stopped_by_remove"] = [not engine.running, engine.failure is None]
    try:
        hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), mode=hvd.Solo(),
                                 process_set=mine)
        out["after_remove"] = None
    except Exception as err:  # noqa: BLE001 - reported to the test
        out["after_remove"] = type(err).__name__
    return out


def unflushed() -> dict:
    """Members post, never flush, and shut down: the set engines flush at shutdown()."""
    r = hvd.rank()
    evens = hvd.add_process_set([0, 2])
    odds = hvd.add_process_set([1, 3])
    mine = evens if r % 2 == 0 else odds
    weight = torch.nn.Parameter(torch.zeros(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), op=hvd.Sum, mode=hvd.Solo(), process_set=mine)
    phase("posting, no flush")
    _train(opt, weight, r, slow=r in (2, 3))
    engine = opt._engine()  # the set's engine, to read once shutdown() stopped it
    phase("shutdown without flush")
    hvd.shutdown()
    return {"stopped": not engine.running, "failure": repr(engine.failure) if engine.failure else None,
            "rounds": engine.stats.snapshot()[opt.name]["rounds"]}


def parked() -> dict:
    """Uneven loops: after a first step everywhere (round 0 needs every member's first post),
    rank 0 waits in a global allreduce (which needs rank 2) before its other steps, rank 2
    makes its other steps first, past the staleness bound: rank 0 is parked on its set's
    stream meanwhile, or rank 2 would wait for it forever."""
    r = hvd.rank()
    evens = hvd.add_process_set([0, 2])
    odds = hvd.add_process_set([1, 3])
    mine = evens if r % 2 == 0 else odds
    weight = torch.nn.Parameter(torch.zeros(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), op=hvd.Sum, mode=hvd.Solo(), max_staleness=1,
                                   process_set=mine)
    phase("first step")
    _train(opt, weight, r, slow=False, steps=range(1))
    first = r != 2  # rank 2 trains before the allreduce, every other rank after it
    if not first:
        phase("training before the allreduce")
        _train(opt, weight, r, slow=False, steps=range(1, STEPS))
    phase("global allreduce")
    total = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="metric").tolist()
    if first:
        phase("training after the allreduce")
        _train(opt, weight, r, slow=False, steps=range(1, STEPS))
    phase("flush")
    opt.flush()
    return {"weight": weight.detach().tolist(), "bits": weight.detach().numpy().tobytes().hex(),
            "expected": _expected(mine.ranks), "total": total}


CASES = {"train": train, "unflushed": unflushed, "parked": parked}


if __name__ == "__main__":
    hvd.init()
    report(CASES[sys.argv[1]]())
    hvd.shutdown()
