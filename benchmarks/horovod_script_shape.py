"""The most common Horovod script shape, run many times: no flush, a metric
``hvd.allreduce`` and a rank-0 ``torch.save`` at each epoch's end, one rank
slower per step, the default mode. Prints each launch's time, the median,
the slowest launch as a multiple of it, and in how many launches the
replicas ended bitwise identical (compared after the last epoch's allreduce).

    python benchmarks/horovod_script_shape.py --launches 100
    python benchmarks/horovod_script_shape.py --worker   # one launch's script (under mpiexec)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def worker(args) -> None:
    import hashlib

    import torch

    import hvd_partial.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(hvd.rank())
    checkpoint = os.path.join(tempfile.gettempdir(), f"hvd_shape_{os.getppid()}.pt")
    for _ in range(args.epochs):
        for _ in range(args.steps):
            x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if hvd.rank() == hvd.size() - 1:
                time.sleep(args.slow)
            opt.step()
        hvd.allreduce(loss.detach().reshape(1), name="val_loss")
        if hvd.rank() == 0:
            torch.save(model.state_dict(), checkpoint)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(f"DIGEST {hvd.rank()} {digest[:16]}", flush=True)
    if hvd.rank() == 0 and os.path.exists(checkpoint):
        os.remove(checkpoint)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--launches", type=int, default=100)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow", type=float, default=0.02, help="seconds the last rank sleeps per step")
    p.add_argument("--timeout", type=float, default=120)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    times, identical, failed = [], 0, 0
    for i in range(args.launches):
        cmd = ["mpiexec", "-n", str(args.np), sys.executable, __file__, "--worker", "--epochs", str(args.epochs),
               "--steps", str(args.steps), "--slow", str(args.slow)]
        started = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            ok = out.returncode == 0
        except subprocess.TimeoutExpired:
            out, ok = None, False
        elapsed = time.perf_counter() - started
        digests = {line.split()[2] for line in (out.stdout.splitlines() if out else []) if line.startswith("DIGEST")}
        same = ok and len(digests) == 1
        failed += not ok
        identical += same
        times.append(elapsed)
        print(f"launch {i + 1}: {elapsed:.2f} s, {'ok' if ok else 'FAILED or timed out'}, "
              f"replicas {'identical' if same else 'differ'}", flush=True)
    median = statistics.median(times)
    print(f"{args.launches} launches on {args.np} ranks: median {median:.2f} s, slowest {max(times):.2f} s "
          f"({max(times) / median:.2f}x the median), over 3x the median: {sum(t > 3 * median for t in times)}, "
          f"failed or timed out: {failed}, replicas identical: {identical}/{args.launches}")


if __name__ == "__main__":
    main()
