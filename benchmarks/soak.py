"""Soak: many rounds with random delays; memory must stay flat and nothing be lost.

Every rank posts to a solo stream (random compute times: short sleeps, and now
and then a long one on a random rank), and every 100 rounds also to a sync
stream, a helper allreduce and ``stats()``, until it has taken ``--rounds``
rounds of the solo stream. Each post adds 1.0 at the rank's own index (op=Sum),
so the sum of every result must equal the number of posts of each rank: a
conservation check over the whole run. RSS is read from /proc at start (after
init), after a warm-up, every 1,000 rounds, and at the end.

Run::

    mpiexec -n 4 python benchmarks/soak.py --rounds 10000
    # writes benchmarks/results/new/soak.json; exit status 1 if memory grew or a post was lost
    # --out benchmarks/results/soak.json replaces the published result
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import sys
import time

import numpy as np

import hvd_partial as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import new_result_path  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        resident_pages = int(fh.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure() -> float:
    gc.collect()
    return rss_mib()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10_000, help="solo rounds to run (default 10000)")
    p.add_argument("--floats", type=int, default=4096, help="float32 elements per post (default 4096 = 16 KiB)")
    p.add_argument("--delay-ms", type=float, default=0.5, help="mean compute time per step, ms")
    p.add_argument("--long-delay-ms", type=float, default=20.0, help="the occasional long step, ms")
    p.add_argument("--long-every", type=int, default=50, help="one step in N is long, on a random rank")
    p.add_argument("--sync-every", type=int, default=100, help="a sync post and a helper every N rounds")
    p.add_argument("--warmup", type=int, default=1000, help="rounds before the reference RSS")
    p.add_argument("--max-growth-mib", type=float, default=8.0, help="allowed RSS growth after warm-up")
    p.add_argument("--out", default=None,
                   help="result file (default benchmarks/results/new/soak.json; the published one is never "
                        "overwritten unless named here)")
    args = p.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rss = {"start": measure()}
    series = []
    rng = np.random.default_rng(1000 + rank)
    grad = np.zeros(args.floats, np.float32)
    total = np.zeros(args.floats, np.float64)
    sync_total = np.zeros(size, np.float64)
    posts = sync_posts = step = 0
    taken = 0
    next_mark = args.warmup
    started = time.perf_counter()
    while taken < args.rounds:
        step += 1
        delay = rng.exponential(args.delay_ms) / 1000.0
        if rng.integers(args.long_every) == 0:
            delay += args.long_delay_ms / 1000.0
        time.sleep(delay)
        grad[:] = 0.0
        grad[rank] = 1.0
        checkpoints = 0
        for result in hvd.partial_allreduce(grad, "soak", mode=hvd.Solo(), op=hvd.Sum):
            total += result.array
            # Every rank takes every round once, so keying the blocking calls to round
            # numbers (not to local steps, which differ) makes every rank make them.
            checkpoints += result.round % args.sync_every == 0 and result.round < args.rounds
        posts += 1
        taken = int(result.round) + 1
        for _ in range(checkpoints):
            one = np.zeros(size)
            one[rank] = 1.0
            sync_total += hvd.partial_allreduce(one, "soak-sync", mode=hvd.Sync(), op=hvd.Sum)[0].array
            hvd.allreduce(np.ones(8), name="soak-helper")
            sync_posts += 1
            hvd.stats()
        if taken >= next_mark:
            if "warm" not in rss:
                rss["warm"] = measure()
                rss["warm_round"] = taken
            series.append((taken, round(measure(), 2)))
            next_mark += 1000
    for result in hvd.flush("soak"):
        total += result.array
    elapsed = time.perf_counter() - started
    rss["end"] = measure()
    counts = hvd.allgather_object((posts, sync_posts))
    stats = hvd.stats()["soak"]
    mine = {"rank": rank, "posts": posts, "rounds": taken, "rss_mib": rss, "series": series,
            "lost": [float(total[j] - counts[j][0]) for j in range(size)],
            "sync_ok": bool(np.all(sync_total == max(c[1] for c in counts))), "elapsed_s": elapsed}
    everyone = hvd.allgather_object(mine)
    config = dataclasses.asdict(hvd.config())
    hvd.shutdown()
    if rank != 0:
        return 0
    growth = [r["rss_mib"]["end"] - r["rss_mib"]["warm"] for r in everyone]
    lost = any(any(x != 0 for x in r["lost"]) for r in everyone)
    summary = {
        "benchmark": "soak", "ranks": size, "cpus": os.cpu_count(), "python": platform.python_version(),
        "rounds": everyone[0]["rounds"], "final_round_after_flush": stats["rounds"],
        "posts_per_rank": [r["posts"] for r in everyone], "elapsed_s": round(elapsed, 1),
        "rounds_per_second": round(everyone[0]["rounds"] / elapsed, 1),
        "rss_mib_start": [round(r["rss_mib"]["start"], 2) for r in everyone],
        "rss_mib_after_warmup": [round(r["rss_mib"]["warm"], 2) for r in everyone],
        "warmup_rounds": args.warmup,
        "rss_mib_end": [round(r["rss_mib"]["end"], 2) for r in everyone],
        "rss_growth_after_warmup_mib": [round(g, 2) for g in growth],
        "rss_series_rank0": everyone[0]["series"],
        "max_staleness_seen": stats["max_staleness_seen"], "stale_per_rank": stats["stale"],
        "fresh_per_rank": stats["fresh"], "initiated_per_rank": stats["initiated"],
        "contributions_lost": lost, "sync_stream_ok": all(r["sync_ok"] for r in everyone),
        "settings": vars(args), "config": config,
    }
    summary["memory_flat"] = max(growth) <= args.max_growth_mib
    print(json.dumps(summary, indent=2))
    out = args.out or new_result_path("soak.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(summary, fh, indent=2)
    ok = summary["memory_flat"] and not lost and summary["sync_stream_ok"]
    print("soak:", "PASS" if ok else "FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
