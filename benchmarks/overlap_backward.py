"""Balanced step time of sync mode with and without ``overlap_backward``, and
PyTorch DDP (gloo) beside them, on an MLP whose gradient is large enough to cut
into several buckets.

One launch trains every method in blocks, in an order rotated from block to
block: ``on`` and ``off`` are sync-mode ``DistributedOptimizer``s under
``hvd.init(overlap_backward=...)`` (a fresh ``init`` per block), ``ddp`` is
``DistributedDataParallel`` over gloo. Each block times ``--steps`` steps
(forward, backward, step; no injected delay) after ``--warmup`` untimed ones,
and the block's figures are the slowest rank's median step time and, of the
step, the median time in ``backward()`` and in ``step()`` (with overlap the
reductions move from ``step()`` into ``backward()``). Printed: each method's
medians over the blocks, and the median over the blocks of each method's step
time over ``off``'s in the same block (the paired ratio, least noisy on a busy
machine).

    mpiexec -n 2 python benchmarks/overlap_backward.py
    mpiexec -n 4 python benchmarks/overlap_backward.py --width 512 --layers 6 --bucket-mb 1
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hvd_partial.torch as hvd
from overlap_blocks import print_medians, run_blocks

METHODS = ["on", "off", "ddp"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--width", type=int, default=1024, help="hidden width (each layer width^2 float32)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=4.0,
                   help="fusion_threshold_bytes for on/off and DDP's bucket_cap_mb")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    return p.parse_args(argv)


def make_model(args) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block(method: str, args, rank: int) -> tuple[float, float, float]:
    """This rank's median step, ``backward()`` and ``step()`` times (seconds) of one block of ``method``."""
    model = make_model(args)
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if method == "ddp":
        net, opt = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb), inner
    else:
        net = model
        opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), mode=hvd.Sync(),
                                       name=f"overlap-{method}")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times: list[tuple[float, float, float]] = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        before_backward = time.perf_counter()
        loss.backward()
        before_step = time.perf_counter()
        opt.step()
        end = time.perf_counter()
        if step >= args.warmup:
            times.append((end - start, before_step - before_backward, end - before_step))
    if method != "ddp":
        opt.flush()
        opt.close()
    return tuple(statistics.median(t[i] for t in times) for i in range(3))


def main(argv=None):
    args = parse_args(argv)
    methods = args.methods.split(",")
    threshold = int(args.bucket_mb * 1024 * 1024)
    hvd.init(fusion_threshold_bytes=threshold)
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    if "ddp" in methods:
        port = hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    hvd.shutdown()
    per_block = run_blocks(hvd, methods, args.blocks, threshold, lambda method: block(method, args, rank))
    if "ddp" in methods:
        dist.destroy_process_group()
    if rank != 0:
        return
    params = sum(p.numel() for p in make_model(args).parameters())
    print(f"\n{size} ranks, {params * 4 / 2**20:.1f} MiB of float32 gradients, buckets of {args.bucket_mb} MiB, "
          f"batch {args.batch}, {args.blocks} blocks of {args.steps} steps")
    print_medians(per_block, methods, ["step ms", "backward ms", "step() ms"])  # medians over blocks


if __name__ == "__main__":
    main()
