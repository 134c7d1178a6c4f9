"""Per-step cost of hvd_partial's host staging of CUDA gradients, against DDP.

One training step of an MLP (``--width`` x ``--depth``, float32, batch 64) on
the GPU: forward, backward, gradient reduction, optimizer step, then
``torch.cuda.synchronize()``. Methods:

- ``plain``: no reduction (world size 1): the compute floor;
- ``hvd_sync`` / ``hvd_solo``: hvd_partial's DistributedOptimizer (gradients
  staged through pinned host buffers, reduced by the engine over MPI). In sync
  mode the gradients are cut into buckets of ``--bucket-mb`` posted during
  backward, each copied to the host on a side stream (``--no-overlap``: the
  whole gradient at ``step()``); the line then also gives the buckets per step
  and the median time from a bucket's staging to its copy found done (an upper
  bound: the hook looks at the next gradient it sees);
- ``ddp_nccl``: DistributedDataParallel over NCCL (world size 1 only: NCCL
  refuses two ranks on one GPU);
- ``ddp_gloo``: DistributedDataParallel over gloo with CUDA tensors.

Run under mpiexec (ranks come from MPI; DDP rendezvous on 127.0.0.1)::

    mpiexec -n 2 python benchmarks/gpu_staging.py --method hvd_sync
    mpiexec -n 2 python benchmarks/gpu_staging.py --method hvd_sync --bucket-mb 16
    # rank 0 prints one JSON line: method, ranks, median and p90 step ms, gradient MiB
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from mpi4py import MPI


def build(width: int, depth: int, device) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device)


class TimedCopy:
    """A bucket's copies to the host, timed from staging to the first look that finds them done."""

    def __init__(self, copied, seconds: list):
        self.copied, self.seconds, self.started = copied, seconds, time.perf_counter()

    def _done(self) -> None:
        if self.started is not None:
            self.seconds.append(time.perf_counter() - self.started)
            self.started = None

    def query(self) -> bool:
        done = self.copied.query()
        if done:
            self._done()
        return done

    def synchronize(self) -> None:
        self.copied.synchronize()
        self._done()


def time_bucket_copies(seconds: list) -> None:
    """Benchmark instrumentation: every bucket staged during backward is timed into ``seconds``."""
    from hvd_partial.torch.tensors import HostStaging

    stage = HostStaging.to_host_async

    def timed(self, tensors, names=None):
        arrays, copied = stage(self, tensors, names)
        return arrays, TimedCopy(copied, seconds)

    HostStaging.to_host_async = timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", required=True, choices=["plain", "hvd_sync", "hvd_solo", "ddp_nccl", "ddp_gloo"])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--port", type=int, default=29511)
    parser.add_argument("--bucket-mb", type=float, default=None, help="hvd methods: fusion_threshold_bytes in MiB")
    parser.add_argument("--no-overlap", action="store_true", help="hvd methods: overlap_backward off")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    model = build(args.width, args.depth, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    hvd = None
    if args.method.startswith("hvd"):
        import hvd_partial.torch as hvd

        settings = {"overlap_backward": not args.no_overlap}
        if args.bucket_mb is not None:
            settings["fusion_threshold_bytes"] = int(args.bucket_mb * 2**20)
        hvd.init(**settings)
        copy_seconds: list = []
        time_bucket_copies(copy_seconds)
        mode = hvd.Sync() if args.method == "hvd_sync" else hvd.Solo()
        opt = hvd.DistributedOptimizer(opt, mode=mode)
    elif args.method.startswith("ddp"):
        import torch.distributed as dist

        dist.init_process_group("nccl" if args.method == "ddp_nccl" else "gloo",
                                init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=size)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    x = torch.randn(64, args.width, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    times = []
    for step in range(args.warmup + args.steps):
        comm.Barrier() if args.method.startswith("ddp") or args.method == "plain" else None
        started = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    line = {}
    if hvd is not None:
        overlap = opt._overlap
        line = {"overlap": not args.no_overlap, "buckets": 1 if overlap is None else len(overlap.buckets),
                "bucket_copy_ms": 1e3 * statistics.median(copy_seconds) if copy_seconds else None}
        opt.flush()
        hvd.shutdown()
    grad_mib = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    if rank == 0:
        times.sort()
        print(json.dumps({"method": args.method, "ranks": size, "median_ms": 1e3 * statistics.median(times),
                          "p90_ms": 1e3 * times[int(0.9 * (len(times) - 1))], "grad_mib": round(grad_mib, 1),
                          **line, "gpu": torch.cuda.get_device_name(0)}), flush=True)
    if args.method.startswith("ddp"):
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
