"""What ranks that wait cost the ranks that compute, where ranks outnumber cores.

Run with ``mpiexec -n 4 python benchmarks/waiting_cpu.py`` (on 2 cores).

Ranks 2..P-1 compute (single-threaded matrix products, as many as took
``--compute-s`` seconds with every rank computing at once) while ranks 0 and 1
wait for them in one of these ways, interleaved block by block:

- ``asleep``: in ``time.sleep`` (the baseline: nothing of theirs runs);
- ``majority post``: in a majority post whose round's designated initiator is
  a computing rank (the wait of eager-SGD's majority mode, and of a post held
  by the staleness bound): their engines nap on the doorbell;
- ``sync post``: in a sync post, whose reduction is in flight (their engines
  keep testing it, yielding the CPU: a reduction in progress needs them);
- ``bare Allreduce``: in a blocking mpi4py ``Allreduce`` (MPI's own wait).

It prints, per way of waiting, the computing ranks' median time and its ratio
to the baseline, and the CPU the waiting ranks used (process CPU time over
wall time: their engine thread and anything else).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvd_partial as hvd
from hvd_partial.modes import designated_initiator

WAYS = ("asleep", "majority post", "sync post", "bare Allreduce")
STREAM = "waiting"


def seed_designating(computing: list[int], streams: list[str], size: int, rounds=(2, 3, 4)) -> int:
    """A seed that designates a computing rank for rounds 2 to 4 of every stream."""
    for seed in range(1_000_000):
        if all(designated_initiator(seed, name, r, size) in computing for name in streams for r in rounds):
            return seed
    raise SystemExit("no seed found; use fewer blocks")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4, help="rounds of the four ways, interleaved")
    parser.add_argument("--compute-s", type=float, default=0.5,
                        help="computation per block, calibrated while every rank computes")
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size < 3:
        raise SystemExit("run on 3 or more ranks (4 on 2 cores shows the effect)")
    computing = list(range(2, size))
    waiting = rank < 2
    bare = MPI.COMM_WORLD.Dup()
    a = np.random.default_rng(rank).random((128, 128))
    start = time.perf_counter()
    for _ in range(100):
        a @ a
    products = int(args.compute_s / ((time.perf_counter() - start) / 100))
    products = int(hvd.allreduce(np.array([float(products)]), op=hvd.Average)[0])
    # A majority stream per block, registered beforehand (round 0 sums every
    # rank's first post, then a flush: round 1 is the flush round, or round 2
    # if a rank still trained when round 1 started): in the block, the next
    # round waits for its designated initiator, a computing rank.
    streams = [f"{STREAM}-{b}" for b in range(args.blocks)]
    mode = hvd.Majority(seed=seed_designating(computing, streams, size))
    grad = np.ones(256, np.float32)
    next_round = {}
    for name in streams:
        hvd.partial_allreduce(grad, name, mode=mode)
        next_round[name] = hvd.flush(name)[-1].round + 1
    hvd.partial_allreduce(grad, "sync", mode=hvd.Sync())
    compute_s = {w: [] for w in WAYS}
    waiting_cpu = {w: [] for w in WAYS}
    for block in range(args.blocks):
        for way in WAYS:
            # line up with a sync post: a rank in a barrier would be parked (it holds no round back)
            hvd.partial_allreduce(np.ones(1), "line up", mode=hvd.Sync())
            wall0, cpu0 = time.perf_counter(), time.process_time()
            if not waiting:
                for _ in range(products):
                    a @ a
                compute_s[way].append(time.perf_counter() - wall0)
            elif way == "asleep":
                time.sleep(2.0 * args.compute_s)
            if way == "majority post":
                taken = hvd.partial_allreduce(grad, streams[block], mode=mode)
                if waiting:  # a computing rank may also take the round a flushing waiting rank started
                    expected = [(next_round[streams[block]], True)]
                    assert [(r.round, r.initiator in computing) for r in taken] == expected, (expected, taken)
            elif way in ("sync post", "asleep"):
                hvd.partial_allreduce(grad, "sync", mode=hvd.Sync())
            else:
                bare.Allreduce(MPI.IN_PLACE, grad.copy())
            if waiting and way != "asleep":
                waiting_cpu[way].append((time.process_time() - cpu0) / (time.perf_counter() - wall0))
            if way == "majority post":
                hvd.flush(streams[block])
    everyone = hvd.allgather_object((compute_s, waiting_cpu))
    hvd.shutdown()
    bare.Free()
    if rank != 0:
        return
    times = {w: statistics.median([t for c, _ in everyone for t in c[w]]) for w in WAYS}
    cpus = {w: statistics.median([x for _, u in everyone for x in u[w]]) if w != "asleep" else 0.0 for w in WAYS}
    print(f"waiting ranks 0-1, computing ranks 2-{size - 1}; {os.cpu_count()} cores; "
          f"{MPI.Get_library_version().splitlines()[0].strip()}; {args.blocks} blocks, "
          f"{products} products of 128x128 matrices per block")
    print(f"{'waiting in':>15} {'compute s':>10} {'/asleep':>8} {'waiting CPU':>12}")
    for way in WAYS:
        cpu = "-" if way == "asleep" else f"{cpus[way]:.0%}"
        print(f"{way:>15} {times[way]:10.3f} {times[way] / times['asleep']:8.2f} {cpu:>12}")


if __name__ == "__main__":
    main()
