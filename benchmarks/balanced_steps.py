"""Balanced training steps on the tasks of experiment 2 (benchmarks/paper_accuracy.py)
with no imbalance: the step time of every hvd_partial mode against PyTorch DDP (gloo),
and what the engine thread costs the training thread.

The same models as ``paper_accuracy.py`` (its LSTM and CNN, SGD with momentum, one
torch thread per rank); here every rank's step is alike: the LSTM's sequences all
have ``--length`` tokens (``--ms-per-token`` of simulated device time each, as
there), the CNN's step sleeps ``--step-ms`` and no rank is delayed. Every method
keeps its own model and optimizer for the whole launch; the launch runs
``--blocks`` blocks, each training every method for ``--steps`` steps in an order
rotated from block to block. A block's step time is the slowest rank's wall time
over the steps (a flush, DDP: a barrier, at the end included), its engine CPU the
engine thread's CPU time per step (``/proc/self/task/<tid>/schedstat``, slowest
rank) and its compute CPU the training thread's (``time.thread_time``). Each
figure is the median over the blocks; ``/ddp`` is the median over the blocks of
the block's step time over DDP's in the same block.

``local`` trains without communication (the engine thread idle beside it): the
floor of a step on this machine at this many ranks.

    mpiexec -n 4 python benchmarks/balanced_steps.py
    mpiexec -n 2 python benchmarks/balanced_steps.py --tasks lstm --methods ddp,sync,local
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# hvd_partial first: paper_accuracy puts this checkout's root on sys.path, and
# PYTHONPATH may pin another checkout (old code against new, same benchmark).
import hvd_partial  # noqa: F401  pylint: disable=unused-import
import hvd_partial.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from balanced_modes import engine_cpu_seconds, make_mode  # noqa: E402
from paper_accuracy import cnn_model, digits_data, lstm_model, start_ranks  # noqa: E402

METHODS = ["ddp", "sync", "solo", "majority", "local"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="lstm,cnn")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40, help="steps per method per block")
    parser.add_argument("--length", type=int, default=16, help="lstm: tokens per sequence")
    parser.add_argument("--ms-per-token", type=float, default=1.0, help="lstm: device time per token")
    parser.add_argument("--lstm-batch", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=20.0, help="cnn: device time per step")
    parser.add_argument("--cnn-batch", type=int, default=16)
    return parser.parse_args(argv)


class Trainer:
    """One method's model, optimizer and batches on one task."""

    def __init__(self, task: str, method: str, args, rank: int, size: int):
        import torch

        torch.manual_seed(0)
        self.task = task
        self.model = lstm_model() if task == "lstm" else cnn_model()
        inner = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        if method == "ddp":
            self.net, self.opt = torch.nn.parallel.DistributedDataParallel(self.model), inner
        elif method == "local":
            self.net, self.opt = self.model, inner
        else:
            self.net = self.model
            self.opt = hvd.DistributedOptimizer(inner, named_parameters=self.model.named_parameters(),
                                                mode=make_mode(method), name=f"balanced-steps.{task}.{method}")
        self.method = method
        g = torch.Generator().manual_seed(rank)
        if task == "lstm":
            self.x = torch.randint(0, 10, (512, args.length), generator=g)
            self.lengths = torch.full((512,), args.length, dtype=torch.int64)
            self.y = torch.randint(0, 6, (512,), generator=g)
            self.batch, self.sleep = args.lstm_batch, args.ms_per_token * args.length / 1000
        else:
            xtr, _, ytr, _ = digits_data(0)
            self.x, self.y = torch.tensor(xtr), torch.tensor(ytr)
            self.batch, self.sleep = args.cnn_batch, args.step_ms / 1000
        self.at = 0

    def step(self) -> None:
        import torch.nn.functional as F

        i = self.at
        self.at = (i + self.batch) % (len(self.y) - self.batch)
        time.sleep(self.sleep)
        self.opt.zero_grad()
        if self.task == "lstm":
            out = self.net(self.x[i:i + self.batch], self.lengths[i:i + self.batch])
        else:
            out = self.net(self.x[i:i + self.batch])
        F.cross_entropy(out, self.y[i:i + self.batch]).backward()
        self.opt.step()

    def finish(self) -> None:
        import torch.distributed as dist

        if self.method == "ddp":
            dist.barrier()
        elif self.method != "local":
            self.opt.flush()


def main(argv=None) -> int:
    import torch.distributed as dist

    args = parse_args(argv)
    rank, size = start_ranks()
    methods = args.methods.split(",")
    if rank == 0:
        print(f"{size} ranks, hvd_partial from {os.path.dirname(hvd_partial.__file__)}, {args.blocks} blocks of "
              f"{args.steps} steps per method, load average {os.getloadavg()[0]:.2f}", flush=True)
    for task in args.tasks.split(","):
        trainers = {m: Trainer(task, m, args, rank, size) for m in methods}
        for trainer in trainers.values():  # warm up: buffers, streams, DDP's buckets
            for _ in range(5):
                trainer.step()
            trainer.finish()
        step_ms = {m: [] for m in methods}
        engine_us = {m: [] for m in methods}
        compute_us = {m: [] for m in methods}
        for block in range(args.blocks):
            shift = block % len(methods)
            for m in methods[shift:] + methods[:shift]:
                trainer = trainers[m]
                hvd.barrier()
                start, cpu, compute = time.perf_counter(), engine_cpu_seconds(), time.thread_time()
                for _ in range(args.steps):
                    trainer.step()
                trainer.finish()
                seconds, cpu, compute = (max(v) for v in zip(*hvd.allgather_object(
                    (time.perf_counter() - start, engine_cpu_seconds() - cpu, time.thread_time() - compute))))
                step_ms[m].append(seconds / args.steps * 1e3)
                engine_us[m].append(cpu / args.steps * 1e6)
                compute_us[m].append(compute / args.steps * 1e6)
        if rank == 0:
            base = "ddp" if "ddp" in methods else methods[0]
            print(f"{task}: median over blocks; /{base}: per-block ratio, median")
            print(f"{'method':<10} {'step ms':>8} {'/' + base:>7} {'engine us/step':>15} {'compute us/step':>16}  "
                  "step ms per block")
            for m in methods:
                paired = statistics.median(a / b for a, b in zip(step_ms[m], step_ms[base]))
                print(f"{m:<10} {statistics.median(step_ms[m]):8.2f} {paired:7.3f} "
                      f"{statistics.median(engine_us[m]):15.0f} {statistics.median(compute_us[m]):16.0f}  "
                      + " ".join(f"{t:.1f}" for t in step_ms[m]), flush=True)
        for trainer in trainers.values():
            if trainer.method not in ("ddp", "local"):
                trainer.opt.close()
    if rank == 0:
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
