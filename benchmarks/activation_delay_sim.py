"""The activation delay at scale, by simulation: the decentralized plane with
floods sent at once (``activation_delay_us=0``) against floods held back in
balanced training (the engine's default, 2 ms), for sync, solo and majority.

Uses the network model that ``benchmarks/paper_scale.py`` fitted on this
machine (``benchmarks/results/paper_scale_network.json``, with the per-round
view priced as there), 20 ms steps, and either balanced load or one random
rank per step sleeping 100 ms more (tau = 8). Prints posts per second, the
ratio to sync, control messages per rank per round (mean, and at the
busiest rank) against log2 P, and for majority with a quorum of half
(``majority_q``) the additions to its counters per round, and writes the table to
``benchmarks/results/new/activation_delay_sim.{json,md}``.

    python benchmarks/activation_delay_sim.py
    python benchmarks/activation_delay_sim.py --sizes 64,256 --nbytes 4096,1048576 --delays-us 0,200,2000
    python benchmarks/activation_delay_sim.py --modes sync,majority_q --nbytes 1048576
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paper_scale import RESULTS, with_view_cost  # noqa: E402
from paper_throughput import mode_for  # noqa: E402
from result_files import new_result_path  # noqa: E402

from hvd_partial.sim import random_delays, simulate  # noqa: E402

PATTERNS = {"balanced": 0.0, "1 rank/step": 0.1}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,1024")
    parser.add_argument("--nbytes", default="4096,1048576", help="gradient bytes per round, comma-separated")
    parser.add_argument("--delays-us", default="0,2000")
    parser.add_argument("--modes", default="sync,solo,majority")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--network", default=os.path.join(RESULTS, "paper_scale_network.json"))
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.network) as fh:
        net = with_view_cost(json.load(fh))
    rows = []
    for p in [int(x) for x in args.sizes.split(",")]:
        for nbytes in [int(x) for x in args.nbytes.split(",")]:
            for pattern, late_s in PATTERNS.items():
                compute = random_delays(p, args.step_ms / 1000, late_s, args.seed, 1)
                for delay_us in [float(x) for x in args.delays_us.split(",")]:
                    for mode in args.modes.split(","):
                        tau = 0 if mode == "sync" else args.max_staleness
                        if mode == "sync" and delay_us != 0.0:
                            continue  # sync rounds send no activation: the delay changes nothing
                        started = time.time()
                        r = simulate(p, mode_for(mode, p, args.seed), tau, args.steps, compute, net, nbytes=nbytes,
                                     control_plane="decentral", activation_delay_s=delay_us / 1e6)
                        rows.append({"P": p, "nbytes": nbytes, "pattern": pattern, "delay_us": delay_us,
                                     "mode": mode, "posts_per_s": r.posts_per_second, "rounds": r.rounds,
                                     "messages_per_round_mean": r.messages_per_round_mean,
                                     "messages_per_round_max": r.messages_per_round_max,
                                     "quorum_additions_per_round": r.quorum_additions / max(r.rounds, 1),
                                     "sim_wall_s": time.time() - started})
                        print(f"P={p:5d} {nbytes:8d} B {pattern:>11} delay {delay_us:6.0f} us {mode:>8}: "
                              f"{r.posts_per_second:10.1f} posts/s, {r.messages_per_round_mean:5.1f} messages/round "
                              f"(busiest {r.messages_per_round_max:5.1f})"
                              + (f", {r.quorum_additions / max(r.rounds, 1):.1f} quorum additions/round"
                                 if r.quorum_additions else ""), flush=True)
    sync = {(r["P"], r["nbytes"], r["pattern"]): r["posts_per_s"] for r in rows if r["mode"] == "sync"}
    lines = ["| P | gradient | load | delay | mode | posts/s | / sync | messages per rank per round, mean (busiest) "
             "| log2 P | quorum additions per round |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mode"] == "sync":
            continue
        ratio = r["posts_per_s"] / sync[(r["P"], r["nbytes"], r["pattern"])]
        r["over_sync"] = ratio
        lines.append(f"| {r['P']} | {r['nbytes']} B | {r['pattern']} | {r['delay_us']:g} us | {r['mode']} | "
                     f"{r['posts_per_s']:.0f} | {ratio:.2f} | {r['messages_per_round_mean']:.1f} "
                     f"({r['messages_per_round_max']:.1f}) | {math.log2(r['P']):.0f} | "
                     f"{r['quorum_additions_per_round']:.1f} |")
    table = "\n".join(lines)
    print(table)
    with open(new_result_path("activation_delay_sim.json"), "w") as fh:
        json.dump({"args": vars(args), "rows": rows}, fh, indent=1)
    with open(new_result_path("activation_delay_sim.md"), "w") as fh:
        fh.write("`python benchmarks/activation_delay_sim.py " + " ".join(sys.argv[1:]) + "`\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
