"""Which cost holds the decentralized control plane back: the cluster
simulator's projection of solo over sync (one slow rank per step, 20 ms
steps, 100 ms delays, 1 MiB, tau = 8) with one part of the fitted network
model (``benchmarks/results/paper_scale_network.json``) set to zero at a time.

the message latency, the reduction, the engines' own time (handling, sends,
the per-round view).

    python benchmarks/control_plane_sensitivity.py                     # 1,024 ranks, ~3 minutes
    python benchmarks/control_plane_sensitivity.py --sizes 1024,4096   # ~15 minutes more

Writes benchmarks/results/new/control_plane_sensitivity.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from paper_throughput import mode_for  # noqa: E402

from hvd_partial.sim import NetworkModel, random_delays, simulate  # noqa: E402
from result_files import new_result_path  # noqa: E402


def variants(net: NetworkModel, p: int) -> dict:
    return {"as fitted": net,
            "no message latency": net.replace(message_latency_s=0.0, message_per_rank_s=0.0),
            "no reduction cost": net.replace(reduce_base_s=0.0, reduce_alpha_s=0.0, reduce_beta_s_per_byte=0.0),
            "no engine time (handling, sends, view)": net.replace(
                coordinator_s=0.0, coordinator_per_rank_s=0.0, send_overhead_s=0.0, send_per_rank_s=0.0,
                view_per_rank_s=0.0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--network", default=os.path.join(HERE, "results", "paper_scale_network.json"))
    args = parser.parse_args(argv)
    with open(args.network) as fh:
        net = NetworkModel.from_dict(json.load(fh)["network"])
    rows = []
    for p in [int(x) for x in args.sizes.split(",")]:
        compute = random_delays(p, 0.02, 0.1, 0, 1)
        for name, model in variants(net, p).items():
            t = time.time()
            sync = simulate(p, mode_for("sync", p), 0, args.steps, compute, model, nbytes=1 << 20,
                            control_plane="decentral")
            solo = simulate(p, mode_for("solo", p), 8, args.steps, compute, model, nbytes=1 << 20,
                            control_plane="decentral")
            row = {"P": p, "steps": args.steps, "variant": name, "sync_posts_per_s": sync.posts_per_second,
                   "solo_posts_per_s": solo.posts_per_second, "ratio": solo.posts_per_second / sync.posts_per_second,
                   "sync_registered_s": sync.registered_s, "solo_registered_s": solo.registered_s,
                   "wall_s": time.time() - t}
            rows.append(row)
            print(f"P={p} {name}: sync {row['sync_posts_per_s']:.0f} posts/s, solo {row['solo_posts_per_s']:.0f} "
                  f"= {row['ratio']:.2f}x (round 0 done at {row['sync_registered_s']:.3f} s; {row['wall_s']:.0f} s)",
                  flush=True)
    command = "python benchmarks/control_plane_sensitivity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# Which cost holds the decentralized control plane back", "",
             f"`{command.strip()}`; solo over sync (posts/s), decentral plane, one slow rank per step, 20 ms steps, "
             "100 ms delays, 1 MiB, tau = 8; the fitted model of `paper_scale_network.json` with one part set to zero.",
             "", "| P | steps | model | sync posts/s | solo posts/s | solo/sync | round 0 done (sync) |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['P']} | {r['steps']} | {r['variant']} | {r['sync_posts_per_s']:.0f} | "
                     f"{r['solo_posts_per_s']:.0f} | {r['ratio']:.2f}x | {r['sync_registered_s'] * 1e3:.0f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(new_result_path("control_plane_sensitivity.md"), "w") as fh:
        fh.write(text)
    with open(new_result_path("control_plane_sensitivity.json"), "w") as fh:
        json.dump({"command": command.strip(), "network": net.to_dict(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
