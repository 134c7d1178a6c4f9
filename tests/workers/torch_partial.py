"""Solo or majority training with injected delays: every rank fingerprints its
parameters and optimizer state after every applied round, accumulates the
results it applied and the gradients it computed, and reports them; the test
checks replicas round by round, conservation and the staleness bound.

usage: torch_partial.py solo|majority
"""

from __future__ import annotations

import os
import random
import sys
import time

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, make_model

import hvd_partial.session
import hvd_partial.torch as hvd

TAU = 8
B = 8


def main():
    mode_name = sys.argv[1]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    mode = hvd.Solo() if mode_name == "solo" else hvd.Majority(seed=3)
    model = make_model(5)
    if mode_name == "solo":
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        inner = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), mode=mode, max_staleness=TAU,
                                   name="partial")

    per_round: dict[int, str] = {}
    applied = [torch.zeros_like(p) for p in model.parameters()]
    local = [torch.zeros_like(p) for p in model.parameters()]

    # cap_round_step scales a round that summed more posts than ranks; conservation is of the sums, so the
    # capture divides the scale back out (the scale is what the optimizer passed when it loaded the round).
    scales = []
    load = opt._grads.load

    def recording_load(result, ctxs, scale=1.0):
        scales.append(scale)
        load(result, ctxs, scale)

    opt._grads.load = recording_load

    def capture(optimizer, args, kwargs):  # before every applied round: the round's result
        for acc, p in zip(applied, model.parameters()):
            acc += p.grad / scales[-1]

    def record(optimizer, args, kwargs):  # after every applied round: the replica's state
        per_round[opt.rounds] = fingerprint(model, optimizer)

    opt.register_step_pre_hook(capture)
    if mode_name == "majority":  # per-round clipping, after the capture
        def clip(optimizer, args, kwargs):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)

        opt.register_step_pre_hook(clip)
    opt.register_step_post_hook(record)

    max_staleness = 0
    ks = []
    steps = 0

    def step(delay: float = 0.0):
        nonlocal max_staleness, steps
        if delay:
            time.sleep(delay)
        x, y = make_data(10_000 + 1000 * rank + steps, B)
        steps += 1
        opt.zero_grad()
        loss_of(model, x, y).backward()
        for acc, p in zip(local, model.parameters()):
            acc += p.grad
        opt.step()
        ks.append(len(opt.last_results))
        for r in opt.last_results:
            max_staleness = max([max_staleness, *r.staleness.values()])

    phase("random delays")
    rng = random.Random(100 + rank)
    for _ in range(25):
        step(rng.choice([0.0, 0.0, 0.005, 0.02]))

    catch_up_k = None
    if mode_name == "solo":
        # Deterministic catch-up: the last rank waits, in no hvd_partial call (one
        # would park it: it would take the rounds as they come), while the others
        # take 2 steps each (at most 6 rounds, within TAU - 1 of it), so its next
        # post must take >= 2 rounds at once, and its gradient is stale.
        phase("forced catch-up")
        opt.flush()
        if rank == size - 1:
            await_others("catch-up")
            # each other rank's two steps completed two rounds at least; wait until this engine has them too
            stream = hvd_partial.session.current().engine.readout.stream_state("partial")
            while stream.completed - stream.taken < 2:
                time.sleep(0.001)
        else:
            step()
            step()
            announce("catch-up")
        step()
        catch_up_k = len(opt.last_results)

    phase("persistent straggler")
    for _ in range(20):
        step(0.03 if rank == size - 1 else 0.0)

    phase("final flush")
    for r in opt.flush():
        max_staleness = max([max_staleness, *r.staleness.values()])
    final = fingerprint(model, opt)
    # (after a later collective a rank may also have taken an empty round another one has not yet)
    rounds, updates = opt.rounds, opt.updates
    local_all = hvd.allgather_object([t.tolist() for t in local])
    total_local = [sum(torch.tensor(local_all[j][i], dtype=torch.float64) for j in range(size)) / size
                   for i in range(len(local))]
    conservation = max(float((a - t).abs().max()) for a, t in zip(applied, total_local))
    scale = max(float(t.abs().max()) for t in total_local)
    stats = opt.stats()

    guard = None
    if mode_name == "solo":
        guard = horovod_clip_pattern_guard()

    hvd.shutdown()
    report({"per_round": per_round, "final": final, "rounds": rounds, "updates": updates, "ks": ks,
            "catch_up_k": catch_up_k, "max_staleness": max_staleness, "conservation": conservation, "scale": scale,
            "steps": steps, "stale": stats["stale"], "fresh": stats["fresh"], "guard": guard})


def announce(event: str) -> None:
    """This rank has done its part before ``event`` (a file: the ranks' order, not a time)."""
    path = os.path.join(os.environ["HVD_TEST_OUT"], f"{event}.{hvd.rank()}")
    with open(path + ".tmp", "w") as fh:
        fh.write("done")
    os.replace(path + ".tmp", path)


def await_others(event: str) -> None:
    """Wait, outside any hvd_partial call, until every other rank announced ``event``."""
    await_ranks(event, [j for j in range(hvd.size()) if j != hvd.rank()])


def await_ranks(event: str, ranks) -> None:
    """Wait, outside any hvd_partial call, until each of ``ranks`` announced ``event``."""
    paths = [os.path.join(os.environ["HVD_TEST_OUT"], f"{event}.{j}") for j in ranks]
    while not all(os.path.exists(p) for p in paths):
        time.sleep(0.001)


def horovod_clip_pattern_guard():
    """synchronize() + edit p.grad + step() when a rank took several rounds at
    once must raise (the edit cannot apply to every round), not diverge silently."""
    rank, size = hvd.rank(), hvd.size()
    model = make_model(11)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), mode=hvd.Solo(), name="guard",
                                   max_staleness=TAU)
    x, y = make_data(77, B)

    def step(pattern: bool):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if not pattern:
            opt.step()
            return None
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        try:
            with opt.skip_synchronize():
                opt.step()
        except hvd.SynchronizationError as err:
            return str(err)
        return None

    step(False)
    # The last rank waits, outside any call, until it has two completed rounds it has not taken; rank 0's
    # three posts after "guard ready" complete at least two rounds after it (each of its takes after the
    # first takes a round completed since its previous take), and at most 6 rounds come (within TAU).
    if rank == size - 1:
        announce("guard ready")
        stream = hvd_partial.session.current().engine.readout.stream_state("guard")
        while stream.completed - stream.taken < 2:
            time.sleep(0.001)
    elif rank == 0:
        await_ranks("guard ready", [size - 1])
        for _ in range(3):
            step(False)
    error = step(rank == size - 1)
    k = len(opt.last_results)
    opt.flush()
    return {"error": error, "k": k}


if __name__ == "__main__":
    main()
