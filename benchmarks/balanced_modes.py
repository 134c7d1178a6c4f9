"""Balanced training, every method in one launch: rounds per second of sync,
solo and majority on the demo's MLP with no injected delay.

Each method keeps its own model and ``DistributedOptimizer`` for the whole
launch; the launch runs ``--blocks`` blocks, each training every method for
``--epochs`` epochs of ``--steps`` steps (a flush after each epoch, as a
training loop would), in an order rotated from block to block. A block's
rounds per second is its rounds over the slowest rank's wall time; each
method's figure is the median over the blocks, so that the machine's drift
hits every method alike, and ``paired`` is the median over the blocks of the
block's rate over the first method's in the same block (the least noisy
comparison on a busy machine). It also prints each method's time in ``flush()`` per
epoch, and its engine thread's and training thread's CPU time per round
(medians over the blocks, of the slowest rank), and, per rank, how many rounds each stream held its
activation flood back, dropped it, joined before its start was heard, or
joined at a flush (docs/control-plane.md, "Held-back activation").

    mpiexec -n 4 python benchmarks/balanced_modes.py
    HVD_PARTIAL_ACTIVATION_DELAY_US=0 mpiexec -n 4 python benchmarks/balanced_modes.py --blocks 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_straggler import Shard, load_data, make_model  # noqa: E402

import hvd_partial.torch as hvd  # noqa: E402
from hvd_partial import session  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="sync,solo,majority")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per method per block")
    parser.add_argument("--steps", type=int, default=23, help="steps per epoch (a flush after each)")
    parser.add_argument("--batch", type=int, default=16)
    return parser.parse_args(argv)


def make_mode(name: str):
    """``sync``, ``solo``, ``majority``, or ``majority_q<k>``: majority with quorum k."""
    if name.startswith("majority_q"):
        return hvd.Majority(seed=1, quorum=int(name[len("majority_q"):]))
    return {"sync": hvd.Sync(), "solo": hvd.Solo(), "majority": hvd.Majority(seed=1)}[name]


def stream_counts() -> dict:
    """This rank's held, dropped, early-joined and flush-joined rounds per decentralized stream."""
    control = session.current().engine._driver.control
    return {machine.name: (machine.stats.floods_held, machine.stats.floods_dropped, machine.stats.joined_early,
                           machine.stats.joined_at_flush, machine.completed,
                           machine.stats.quorum_additions, machine.stats.quorum_notices)
            for machine in getattr(control, "streams", {}).values()}


def engine_cpu_seconds() -> float:
    """CPU time of this process's engine thread so far (Linux; 0 elsewhere):
    the scheduler's nanosecond count, else the clock-tick one."""
    tid = session.current().engine._thread.native_id
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main(argv=None) -> int:
    args = parse_args(argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x_train, y_train, _, _ = load_data(0)
    methods = args.methods.split(",")
    trainers = {}
    for name in methods:
        model = make_model(0)
        base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        trainers[name] = (model, hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                                          mode=make_mode(name), name=f"balanced.{name}"))
    shard = Shard(x_train, y_train, rank, size, args.batch, 0)
    rates = {name: [] for name in methods}
    flush_ms = {name: [] for name in methods}  # per epoch, per block
    engine_us = {name: [] for name in methods}  # engine thread CPU per round, per block
    compute_us = {name: [] for name in methods}  # training thread CPU per round, per block
    for block in range(args.blocks):
        shift = block % len(methods)
        for name in methods[shift:] + methods[:shift]:
            model, optimizer = trainers[name]
            hvd.barrier()
            rounds_before, start, cpu_before = optimizer.rounds, time.perf_counter(), engine_cpu_seconds()
            compute_before = time.thread_time()
            flushing = 0.0
            for _ in range(args.epochs):
                for _ in range(args.steps):
                    xb, yb = shard.next()
                    optimizer.zero_grad()
                    torch.nn.functional.cross_entropy(model(xb), yb).backward()
                    optimizer.step()
                flush_start = time.perf_counter()
                optimizer.flush()
                flushing += time.perf_counter() - flush_start
            rounds = optimizer.rounds - rounds_before
            seconds, flushing, cpu, compute = (max(v) for v in zip(*hvd.allgather_object(
                (time.perf_counter() - start, flushing, engine_cpu_seconds() - cpu_before,
                 time.thread_time() - compute_before))))
            rates[name].append(rounds / seconds)
            flush_ms[name].append(flushing / args.epochs * 1e3)
            engine_us[name].append(cpu / max(rounds, 1) * 1e6)
            compute_us[name].append(compute / max(rounds, 1) * 1e6)
    counts = hvd.allgather_object(stream_counts())
    if rank == 0:
        print(f"{size} ranks, {args.blocks} blocks of {args.epochs} epochs x {args.steps} steps per method, "
              f"activation_delay_us={session.current().config.activation_delay_us:g}")
        first = statistics.median(rates[methods[0]])
        print(f"{'method':<10} {'rounds/s':>9} {'ratio':>6} {'paired':>6} {'flush ms':>9} {'engine us/round':>16} "
              f"{'compute us/round':>17}  per block")
        for name in methods:
            median = statistics.median(rates[name])
            # each block's rate over the first method's in the same block (run next to it), median
            paired = statistics.median(a / b for a, b in zip(rates[name], rates[methods[0]]))
            print(f"{name:<10} {median:9.1f} {median / first:6.3f} {paired:6.3f} "
                  f"{statistics.median(flush_ms[name]):9.2f} "
                  f"{statistics.median(engine_us[name]):16.0f} {statistics.median(compute_us[name]):17.0f}  "
                  + " ".join(f"{r:.0f}" for r in rates[name]))
        print("held / dropped / joined early / joined at a flush / rounds / quorum additions / quorum notices, "
              "per rank:")
        for stream in counts[0]:
            print(f"  {stream}: " + ", ".join("%d/%d/%d/%d/%d/%d/%d" % per_rank[stream] for per_rank in counts))
    for _, optimizer in trainers.values():
        optimizer.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
