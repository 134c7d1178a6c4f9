"""Time to accuracy under the paper's imbalance: hvd_partial sync vs solo vs
majority, and PyTorch DistributedDataParallel (gloo) as the peer baseline.

Every method trains the demo's model (examples/pytorch_straggler.py: an MLP on
scikit-learn's digits) from the same initial weights with the same injected
delays: at every local step each rank sleeps ``--delay`` seconds with
probability 1/P (about one straggler per step, as in eager-SGD's ResNet-50
experiment). An epoch is every rank's share of the training set (the same
data per epoch for every method; ``--epoch-by rounds`` counts a sync epoch's
rounds instead). Methods are interleaved (rotated order in each repeat) and the
medians over repeats are reported, since this machine is noisy. Evaluation
time is not counted; flushes are.

    mpiexec -n 4 python benchmarks/torch_train.py
    mpiexec -n 4 python benchmarks/torch_train.py --delay 0.1 --repeats 5 --target 0.95
    mpiexec -n 4 python benchmarks/torch_train.py --methods sync,majority,majority_quorum --quorum 3
"""

from __future__ import annotations

import argparse
import math
import os
import random
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_straggler import Shard, load_data, make_model  # noqa: E402

import hvd_partial.torch as hvd  # noqa: E402

METHODS = ["sync", "solo", "majority", "majority_quorum", "ddp"]
DEFAULT_METHODS = ["sync", "solo", "majority", "ddp"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    p.add_argument("--quorum", type=int, default=None,
                   help="k for the majority_quorum method (default: half the ranks, rounded up)")
    p.add_argument("--delay", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--epoch-by", choices=["samples", "rounds"], default="samples")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target", type=float, default=0.95, help="test accuracy for the time-to-accuracy column")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(method: str, args, data, repeat: int) -> dict:
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, x_test, y_test = data
    model = make_model(args.seed)
    rounds_per_epoch = math.ceil(len(y_train) / (args.batch_size * size))
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Decayed per epoch, after the flush (where every rank holds the same
    # rounds): the same schedule per sample for every method. A per-round
    # schedule would decay faster in solo, which takes more, smaller rounds.
    schedule = torch.optim.lr_scheduler.LambdaLR(base, lambda epoch: 1.0 / (1.0 + epoch / 4.0))
    if method == "ddp":
        net = DistributedDataParallel(model)
        opt = None
    else:
        net = model
        quorum = args.quorum or (size + 1) // 2
        mode = {"sync": hvd.Sync(), "solo": hvd.Solo(), "majority": hvd.Majority(seed=args.seed + repeat),
                "majority_quorum": hvd.Majority(seed=args.seed + repeat, quorum=quorum)}[method]
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), mode=mode,
                                       name=f"bench.{method}.{repeat}")
    shard = Shard(x_train, y_train, rank, size, args.batch_size, args.seed + repeat)
    rng = random.Random((args.seed + repeat) * 7919 + rank)  # the same delays for every method
    loss_fn = torch.nn.functional.cross_entropy

    hvd.barrier()
    train_time, steps, rounds_total = 0.0, 0, 0
    reached, accuracy = None, 0.0
    for epoch in range(args.epochs):
        started = time.perf_counter()
        if method == "ddp":
            for _ in range(rounds_per_epoch):
                if rng.random() < 1.0 / size:
                    time.sleep(args.delay)
                xb, yb = shard.next()
                base.zero_grad()
                loss_fn(net(xb), yb).backward()
                base.step()
                steps += 1
            rounds = rounds_per_epoch
        else:
            first, local = opt.rounds, 0
            while (local < rounds_per_epoch) if args.epoch_by == "samples" else \
                    (opt.rounds < first + rounds_per_epoch):
                local += 1
                if rng.random() < 1.0 / size:
                    time.sleep(args.delay)
                xb, yb = shard.next()
                opt.zero_grad()
                loss_fn(net(xb), yb).backward()
                opt.step()
                steps += 1
            opt.flush()
            rounds = opt.rounds - first
        schedule.step()
        # The slowest rank's clock counts: everybody has finished the epoch.
        elapsed = max(hvd.allgather_object(time.perf_counter() - started))
        train_time += elapsed
        rounds_total += rounds
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if reached is None and accuracy >= args.target:
            reached = train_time
    if opt is not None:
        opt.close()
    return {"time": train_time, "tta": reached, "acc": accuracy, "rounds_per_s": rounds_total / train_time,
            "samples_per_s": sum(hvd.allgather_object(steps)) * args.batch_size / train_time}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    args = parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if "ddp" in methods:
        port = hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    data = load_data(args.seed)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{size} ranks, delay {args.delay:g} s with probability 1/{size} per rank per step, {args.epochs} epochs, "
        f"{args.repeats} repeats, target accuracy {100 * args.target:.0f}%")

    runs = {m: [] for m in methods}
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods):] + methods[:repeat % len(methods)]
        for method in order:
            result = train(method, args, data, repeat)
            runs[method].append(result)
            tta = "never" if result["tta"] is None else f"{result['tta']:.2f} s"
            say(f"  repeat {repeat} {method:15s} {result['time']:6.2f} s  acc {100 * result['acc']:5.1f}%  "
                f"to {100 * args.target:.0f}%: {tta}  {result['rounds_per_s']:5.1f} rounds/s  "
                f"{result['samples_per_s']:6.0f} samples/s")

    table = {m: {k: median([r[k] for r in runs[m]]) for k in runs[m][0]} for m in methods}
    for m in methods:
        table[m]["reached"] = sum(r["tta"] is not None for r in runs[m])
    say(f"\nmedians over {args.repeats} repeats (time to accuracy over the repeats that reached it):")
    say(f"{'method':15s} {'train s':>8s} {'to target':>10s} {'reached':>8s} {'final acc':>10s} {'rounds/s':>9s} "
        f"{'samples/s':>10s}")
    for m in methods:
        row = table[m]
        tta = "never" if row["tta"] is None else f"{row['tta']:.2f} s"
        say(f"{m:15s} {row['time']:8.2f} {tta:>10s} {row['reached']:>4d}/{args.repeats:<3d} {100 * row['acc']:9.1f}% "
            f"{row['rounds_per_s']:9.1f} {row['samples_per_s']:10.0f}")

    def ratio(a, b, key):
        if a not in table or b not in table or table[a][key] is None or table[b][key] is None:
            return None
        return table[b][key] / table[a][key]

    say("\nratios (> 1: the first method is better)")
    for fast in ("solo", "majority", "majority_quorum"):
        for slow in ("sync", "ddp"):
            tta, tput = ratio(fast, slow, "tta"), ratio(slow, fast, "rounds_per_s")
            if tta is None and tput is None:
                continue
            samples = ratio(slow, fast, "samples_per_s")
            acc = (table[fast]["acc"] - table[slow]["acc"]) * 100
            say(f"  {fast} vs {slow}: time to {100 * args.target:.0f}% {'n/a' if tta is None else f'{tta:.2f}x'}, "
                f"samples/s {samples:.2f}x, rounds/s {'n/a' if tput is None else f'{tput:.2f}x'}, "
                f"final accuracy {acc:+.1f} points")
    if "sync" in table and "ddp" in table:
        say(f"  ddp vs hvd_partial sync: training time {table['sync']['time'] / table['ddp']['time']:.2f}x")
    say("  (eager-SGD paper, ResNet-50 on 64 GPUs with injected imbalance: solo 1.29x over sync)")
    hvd.shutdown()
    if "ddp" in methods:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
