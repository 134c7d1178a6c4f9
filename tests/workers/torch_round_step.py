"""Majority rounds on ranks of unequal speed (``cap_round_step`` as the
environment sets it): every post's gradient of the single parameter is 1 and
SGD runs with lr 1 and no momentum, so an applied round's step is its sum
(its number of posts n) divided by what the rule divides it by. A round sums
more posts than the world has ranks where a rank's posts pile up while the
round waits for its designated initiator: the slow rank sleeps before some of
its steps, so that happens in some rounds (the test checks that it did).
Every rank reports, per applied round, n (read from the round's carried
count) and the step, and its replica's fingerprint.
"""

from __future__ import annotations

import time

import torch
from support import phase, report
from torch_common import fingerprint

import hvd_partial.torch as hvd
from hvd_partial.core.carried_values import posts_in

STEPS = 60


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), named_parameters=[("w", weight)],
                                   mode=hvd.Majority(seed=3), name="piled")
    rounds = []
    load = opt._grads.load

    def recording_load(result, ctxs, scale=1.0):  # the round's post count, from its carried values
        rounds.append({"round": result.round, "posts": posts_in(result.arrays[-1], result.world_size)})
        load(result, ctxs, scale)

    opt._grads.load = recording_load
    before = {}
    opt.register_step_pre_hook(lambda o, a, k: before.update(w=weight.item()))
    opt.register_step_post_hook(lambda o, a, k: rounds[-1].update(step=before["w"] - weight.item()))
    for i in range(STEPS):
        phase(f"step {i}")
        if rank == size - 1 and i % 3 == 0:
            time.sleep(0.02)  # imbalance, not ordering: the slowest rank holds some rounds back
        opt.zero_grad()
        weight.sum().backward()
        opt.step()
    phase("flush")
    opt.flush()
    applied = [r for r in rounds if "step" in r]  # a round loaded at synchronize() and applied at step()
    report({"rounds": applied, "fingerprint": fingerprint(None, opt) + repr(weight.item()),
            "posts": STEPS})
    opt.close()
    hvd.shutdown()


main()
