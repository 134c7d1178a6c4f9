"""Straggler demo: one slow rank, sync versus solo allreduce.

Run:  mpiexec -n 4 python examples/straggler_demo.py

Every rank "trains" for a number of steps (a sleep stands in for compute) and
posts a gradient each step; rank 1 is a straggler and takes 5x longer per
step. With sync allreduce every step waits for it; with solo allreduce the
others go on at their own pace and its gradients join later rounds. The demo
prints throughput for both, then checks that nothing was lost (the sum of all
round results equals the sum of all posted gradients) and that every rank took
bitwise identical results.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np

import hvd_partial as hvd


def run(mode, steps: int, step_s: float, slow_rank: int, slowdown: float, size_floats: int):
    rank, size = hvd.rank(), hvd.size()
    name = f"demo-{mode.kind}"
    rng = np.random.default_rng(rank)
    posted = np.zeros(size_floats)
    summed = np.zeros(size_floats)
    fingerprint = hashlib.sha256()
    rounds = 0
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        time.sleep(step_s * (slowdown if rank == slow_rank else 1.0))
        grad = rng.integers(0, 100, size_floats).astype(np.float64)  # exact sums
        posted += grad
        for result in hvd.partial_allreduce(grad, name, mode=mode, op=hvd.Sum):
            summed += result.array
            fingerprint.update(result.array.tobytes())
            rounds = result.round + 1
    elapsed = time.perf_counter() - start
    for result in hvd.flush(name):  # a final synchronous round empties every pending gradient
        summed += result.array
        fingerprint.update(result.array.tobytes())
    everyone = hvd.allgather_object((elapsed, rounds, fingerprint.hexdigest()))
    total_posted = hvd.allreduce(posted, op=hvd.Sum)
    return {
        "seconds": max(e for e, _, _ in everyone),
        "fast_seconds": max(e for j, (e, _, _) in enumerate(everyone) if j != slow_rank) if size > 1 else elapsed,
        "rounds": max(r for _, r, _ in everyone),
        "identical": len({f for _, _, f in everyone}) == 1,
        "conserved": bool(np.array_equal(summed, total_posted)),
        "stats": hvd.stats()[name],
    }


def main():
    parser = argparse.ArgumentParser(description="sync vs solo with one straggler")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--slowdown", type=float, default=5.0, help="how many times slower the straggler is")
    parser.add_argument("--slow-rank", type=int, default=1)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    slow = args.slow_rank % size
    if rank == 0:
        print(f"{size} ranks, {args.steps} steps of {args.step_ms:g} ms; rank {slow} is {args.slowdown:g}x slower")
    reports = {}
    for mode in (hvd.Sync(), hvd.Solo()):
        reports[mode.kind] = run(mode, args.steps, args.step_ms / 1000, slow, args.slowdown, 1000)
    ok = True
    if rank == 0:
        print(f"{'mode':>6} {'fast ranks done (s)':>20} {'all done (s)':>13} {'rounds':>7} {'rounds/s':>9} "
              f"{'nothing lost':>13} {'ranks agree':>12}")
        for kind, rep in reports.items():
            rps = rep["rounds"] / rep["fast_seconds"]
            print(f"{kind:>6} {rep['fast_seconds']:20.2f} {rep['seconds']:13.2f} {rep['rounds']:7d} {rps:9.1f} "
                  f"{str(rep['conserved']):>13} {str(rep['identical']):>12}")
            ok &= rep["conserved"] and rep["identical"]
        speedup = reports["sync"]["fast_seconds"] / reports["solo"]["fast_seconds"]
        st = reports["solo"]["stats"]
        print(f"solo: the fast ranks finished {speedup:.1f}x sooner than under sync")
        print(f"solo participation: fresh {st['fresh']}, stale {st['stale']}, initiated {st['initiated']}")
        print("OK: nothing lost, all ranks identical" if ok else "FAILED: see the table above")
    ok = hvd.broadcast_object(ok)
    hvd.shutdown()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
