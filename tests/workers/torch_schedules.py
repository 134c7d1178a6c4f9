"""Learning-rate schedulers built on the wrapped optimizer and stepped per
local step, as Horovod scripts do, in solo, majority or sync mode with
injected delays: every rank records, for every round it applies, the
hyperparameters the wrapped optimizer saw and its replica's fingerprint; the
test compares them across ranks.

usage: torch_schedules.py solo|majority|sync
"""

from __future__ import annotations

import random
import sys
import time

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, make_model

import hvd_partial.torch as hvd

B = 8
WARMUP = 5


def make_mode(name: str):
    return {"solo": hvd.Solo(), "majority": hvd.Majority(seed=5), "sync": hvd.Sync()}[name]


def record_rounds(opt, model) -> dict:
    """round -> [lr, momentum, weight_decay, fingerprint after the round], filled by step hooks."""
    rounds: dict = {}

    def before(optimizer, args, kwargs):
        group = optimizer.param_groups[0]
        rounds[opt.rounds - 1] = [group["lr"], group["momentum"], group["weight_decay"]]

    def after(optimizer, args, kwargs):
        rounds[opt.rounds - 1].append(fingerprint(model, optimizer))

    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)
    return rounds


def warmup_schedule(mode_name: str, steps: int) -> dict:
    """SequentialLR: a per-batch linear warm-up (LambdaLR), then StepLR; a weight
    decay that differs per rank (each round gets its posts' mean, or one rank's
    value exactly when only that rank's posts are in it)."""
    rank = hvd.rank()
    model = make_model(11)
    inner = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-4 * (rank + 1))
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), mode=make_mode(mode_name),
                                   name="warmup")
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: (n + 1) / WARMUP)
    decay = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[WARMUP])
    rounds = record_rounds(opt, model)
    contributors: dict = {}
    schedule, read_back = [sched.get_last_lr()[0]], []
    rng = random.Random(100 + rank)
    for step in range(steps):
        x, y = make_data(500 + 10 * step + rank, B)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if rng.random() < 0.4:
            time.sleep(rng.uniform(0.005, 0.03))  # some rank is slower at each step
        opt.step()
        contributors.update({r.round: r.contributors for r in opt.last_results})
        sched.step()
        schedule.append(sched.get_last_lr()[0])
        read_back.append(opt.param_groups[0]["lr"] == schedule[-1])  # the scheduler's own value, locally
    opt.flush()
    contributors.update({r.round: r.contributors for r in opt.last_results})
    return {"rounds": {str(k): v for k, v in sorted(rounds.items())},
            "contributors": {str(k): v for k, v in sorted(contributors.items()) if k in rounds},
            "schedule": schedule, "read_back": read_back, "weight_decay": 1e-4 * (rank + 1),
            "final": fingerprint(model, opt), "updates": opt.updates, "taken": opt.rounds}


def plateau_and_checkpoint(mode_name: str, steps: int) -> dict:
    """ReduceLROnPlateau stepped per batch on each rank's own loss (the ranks'
    learning rates differ), then a state_dict round trip after flush()."""
    rank = hvd.rank()
    model = make_model(12)
    inner = torch.optim.Adam(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), mode=make_mode(mode_name),
                                   name="plateau")
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    rng = random.Random(200 + rank)
    for step in range(steps):
        x, y = make_data(900 + step * (rank + 1), B)
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        if rng.random() < 0.4:
            time.sleep(rng.uniform(0.005, 0.03))
        opt.step()
        sched.step(float(loss))
    opt.flush()
    saved = opt.state_dict()
    copy = make_model(12)
    copy.load_state_dict(model.state_dict())
    again = hvd.DistributedOptimizer(torch.optim.Adam(copy.parameters(), lr=1.0), mode=make_mode(mode_name),
                                     name="plateau.restored")
    again.load_state_dict(saved)
    return {"final": fingerprint(model, opt), "restored": fingerprint(copy, again) == fingerprint(model, opt),
            "rounds_restored": again.rounds == opt.rounds, "local_lr": opt.param_groups[0]["lr"]}


def grad_scaler(mode_name: str, steps: int = 4) -> dict:
    """torch.amp.GradScaler: Horovod's pattern in sync mode (an inf on one rank
    at step 1 makes every rank skip that step); refused in solo and majority."""
    rank = hvd.rank()
    model = make_model(13, dtype=torch.float32)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), mode=make_mode(mode_name),
                                   name="scaler")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    try:
        for step in range(steps):
            x, y = make_data(1300 + step + rank, B, dtype=torch.float32)
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            if step == 1 and rank == 1:
                next(model.parameters()).grad[0, 0] = float("inf")
            if mode_name == "sync":
                opt.synchronize()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
    except hvd.HvdPartialError as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None, "scale": scaler.get_scale(), "final": fingerprint(model, opt), "updates": opt.updates,
            "rounds": opt.rounds, "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters())}


def main():
    mode_name = sys.argv[1]
    hvd.init()
    rank = hvd.rank()
    steps = 10 if mode_name == "sync" else 10 + rank  # uneven local steps outside sync mode
    phase("warm-up schedule")
    out = {"warmup": warmup_schedule(mode_name, steps)}
    phase("plateau and checkpoint")
    out["plateau"] = plateau_and_checkpoint(mode_name, steps)
    phase("grad scaler")
    out["scaler"] = grad_scaler(mode_name)
    phase("shutdown")
    hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
