"""Many differently named helper collectives: the communicator count and the
memory must stay flat (every name is negotiated on one helper communicator).

Each rank makes ``--calls`` calls, cycling through allreduce, allgather,
broadcast and barrier, every call under a new name (``--shapes`` also gives
each allreduce its own shape). Every ``--every`` calls it records:

- free communicator slots: how many more communicators MPI can create now
  (``Dup`` of COMM_WORLD until MPI refuses, then all freed again; MPICH
  allows about 2,046 in all), which would drop by one per name if a name
  took a communicator;
- RSS of the process (MiB, after ``gc.collect()``).

Run::

    mpiexec -n 2 python benchmarks/many_names.py --calls 10000
    # prints a table; writes benchmarks/results/many_names.json; exit status 1 if either grew
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import hvd_partial as hvd


def rss_mib() -> float:
    gc.collect()
    with open("/proc/self/statm") as fh:
        resident_pages = int(fh.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


PROBE_LIMIT = 5000  # MPICH refuses after about 2,046; Open MPI allows more than this


def free_communicator_slots(limit: int = PROBE_LIMIT) -> int:
    """Collective over COMM_WORLD: how many Dup()s succeed before MPI refuses (at most ``limit``)."""
    comms = []
    try:
        while len(comms) < limit:
            comms.append(MPI.COMM_WORLD.Dup())
    except MPI.Exception:
        pass
    count = len(comms)
    for comm in comms:
        comm.Free()
    return count


def one_call(i: int, shapes: bool) -> None:
    r = hvd.rank()
    kind = i % 4
    if kind == 0:
        n = 1 + (i // 4) % 64 if shapes else 4
        out = hvd.allreduce(np.full(n, 1.0), name=f"allreduce/{i}", op=hvd.Sum)
        assert out[0] == hvd.size(), out
    elif kind == 1:
        out = hvd.allgather(np.array([r, i]), name=f"allgather/{i}")
        assert out.shape == (2 * hvd.size(),), out.shape
    elif kind == 2:
        out = hvd.broadcast(np.array([i, r]), root_rank=0, name=f"broadcast/{i}")
        assert out[1] == 0, out
    else:
        hvd.barrier()


def run(calls: int, every: int, shapes: bool) -> dict:
    hvd.init()
    samples = []
    started = time.perf_counter()
    for i in range(calls + 1):
        if i % every == 0:
            samples.append({"calls": i, "free_communicators": free_communicator_slots(), "rss_mib": rss_mib(),
                            "seconds": time.perf_counter() - started})
        if i < calls:
            one_call(i, shapes)
    hvd.shutdown()
    # At the cap the count cannot show a leak: MPI would still allow more than the probe counts.
    capped = all(s["free_communicators"] >= PROBE_LIMIT for s in samples)
    return {"ranks": MPI.COMM_WORLD.Get_size(), "calls": calls, "samples": samples, "probe_capped": capped}


def verdict(result: dict, warmup_index: int = 1, rss_slack_mib: float = 8.0) -> list[str]:
    """Problems: communicator slots that changed, memory that grew after the warm-up sample."""
    samples = result["samples"]
    problems = []
    free = {s["free_communicators"] for s in samples}
    if len(free) != 1:
        problems.append(f"free communicator slots changed: {sorted(free)}")
    base = samples[min(warmup_index, len(samples) - 1)]["rss_mib"]
    peak = max(s["rss_mib"] for s in samples[warmup_index:]) if len(samples) > warmup_index else base
    if peak - base > rss_slack_mib:
        problems.append(f"RSS grew by {peak - base:.1f} MiB after the warm-up (slack {rss_slack_mib} MiB)")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--shapes", action="store_true", help="give allreduces 64 different shapes too")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "many_names.json"))
    args = parser.parse_args(argv)
    result = run(args.calls, args.every, args.shapes)
    problems = verdict(result)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"{result['ranks']} ranks, {result['calls']} differently named helper calls")
        print(f"{'calls':>7} {'free comms':>11} {'RSS MiB':>8} {'seconds':>8}")
        for s in result["samples"]:
            print(f"{s['calls']:>7} {s['free_communicators']:>11} {s['rss_mib']:>8.1f} {s['seconds']:>8.1f}")
        print("OK: flat" if not problems else "PROBLEM: " + "; ".join(problems))
        if result["probe_capped"]:
            print(f"(this MPI allows more than {PROBE_LIMIT} communicators, the probe's cap: the communicator "
                  "count cannot show a leak here, only the memory can)")
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump({**result, "problems": problems}, fh, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
