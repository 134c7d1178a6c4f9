"""Control messages per rank per round, today's coordinator against the
coordinator-free control plane, for P = 2 .. 4096.

Both are counted by running the protocol's own code, not from a formula:

- both control planes as the engine runs them: every rank's protocol driver
  with ``control_plane="central"`` (rank 0's coordinator) or
  ``"decentral"`` (:class:`hvd_partial.core.control.DecentralControl`),
  driven by the cluster simulator
  (:class:`hvd_partial.sim.cluster.ClusterSimulator`, free network) through
  every event; a control message for rounds is one sent from one rank to
  another (a post or flush report to the coordinator and each copy of a round
  start; an activation, gather report or quorum notice; majority's one-sided
  additions to its quorum counter are counted apart), registration and
  shutdown (once per stream) apart; per rank, over the run, divided by the
  rounds started;
- the decentralized state machine alone,
  :class:`hvd_partial.core.decentral.DecentralStream` on every rank of
  :class:`hvd_partial.sim.decentral_world.DecentralWorld`, counted per rank
  and per round (the maximum over rounds), sent and received.

Every rank posts ``--posts`` times (compute 20 ms, one rank 100 ms slower
per step, as in the projection's "1 rank/step" rows), tau=8, then flushes.
Liveness is apart: today every rank sends a heartbeat to every peer (P - 1
per rank per period); the ring sends one (the tests measure at most 1.03).

    python benchmarks/control_plane_messages.py                  # P = 2..4096, ~5 minutes
    python benchmarks/control_plane_messages.py --quick          # P up to 256
    python benchmarks/control_plane_messages.py --coordinator-max 4096

Writes benchmarks/results/new/control_plane_messages.{json,md} (copy them
over benchmarks/results/ to publish).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import numpy as np  # noqa: E402

from hvd_partial.core.activation import max_hops  # noqa: E402
from hvd_partial.modes import Solo  # noqa: E402
from hvd_partial.sim import cluster  # noqa: E402
from hvd_partial.sim.decentral_world import DecentralWorld  # noqa: E402
from result_files import new_result_path  # noqa: E402

SIZES = [2, 3, 4, 7, 8, 16, 32, 64, 100, 128, 256, 512, 1000, 1024, 2048, 4096]


def compute_for(P: int, seed: int):
    """20 ms steps with jitter, and one random rank 100 ms slower per step."""
    rng = random.Random(seed)
    slow: dict[int, int] = {}

    def compute(j: int, step: int) -> float:
        if step not in slow:
            slow[step] = rng.randrange(P)
        return 0.020 * rng.uniform(0.95, 1.05) + (0.100 if slow[step] == j else 0.0)
    return compute


def driver_counts(P: int, posts: int, seed: int, plane: str) -> dict:
    """Run every rank's driver with the control plane ``plane`` (free network);
    control messages for rounds per rank, over the run, per round started."""
    sim = cluster.ClusterSimulator(P, Solo(), 8, posts, compute_for(P, seed), control_plane=plane)
    result = sim.run()
    rounds = result.rounds + 1
    per_round = np.asarray(sim.messages, float) / rounds
    return {"rounds": rounds, "rank0_per_round": float(per_round[0]),
            "other_per_round": float(per_round[1]) if P > 1 else 0.0,
            "max": float(per_round.max()), "mean": float(per_round.mean())}


def coordinator_counts(P: int, posts: int, seed: int) -> dict:
    """Today's protocol: rank 0's control messages for rounds, and rank 1's."""
    return driver_counts(P, posts, seed, "central")


def decentral_counts(P: int, kind: str, posts: int, seed: int) -> dict:
    quorum = (P + 1) // 2 if kind == "majority" else None
    world = DecentralWorld(P, kind, 8, [posts] * P, seed=seed, quorum=quorum, compute=compute_for(P, seed),
                           delay_s=1e-4, keep_results=False)
    additions: dict = {}  # (owner, round) -> one-sided additions to its quorum counter

    def added(rank, owner):
        key = (owner, world.streams[rank].held.view.round)
        additions[key] = additions.get(key, 0) + 1

    world.quorum_counters.on_add = added
    world.run()
    if not all(world.done):  # pragma: no cover - a protocol bug
        raise RuntimeError(f"P={P} {kind}: not every rank finished")
    per_round_max, per_round_mean, activation_max, notices_max = [], [], 0, 0
    for per_kind in world.counts.values():
        total = np.zeros(P, np.int64)
        for name, (sent, recv) in per_kind.items():
            total += sent + recv
            if name == "Activate":
                activation_max = max(activation_max, int(max(sent.max(), recv.max())))
            if name == "QuorumMet":
                notices_max = max(notices_max, int(recv.max()))
        per_round_max.append(int(total.max()))
        per_round_mean.append(float(total.mean()))
    return {"rounds": world.streams[0].completed, "max": max(per_round_max),
            "mean": float(np.mean(per_round_mean)), "activation_max": activation_max,
            "notices_max_at_designated": notices_max,
            "additions_max_at_designated": max(additions.values(), default=0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=SIZES)
    parser.add_argument("--posts", type=int, default=3, help="posts per rank")
    parser.add_argument("--coordinator-max", type=int, default=1024,
                        help="largest P to run today's coordinator at (it takes ~150 s at 4096)")
    parser.add_argument("--quick", action="store_true", help="P up to 256")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    sizes = [P for P in args.sizes if not args.quick or P <= 256]
    rows = []
    print(f"{'P':>5} {'log2P':>6} {'ceil':>4} | {'coordinator':>11} {'its ranks':>9} | {'driver max':>10} {'mean':>5} | "
          f"{'solo max':>8} {'mean':>5} {'act':>3} | {'majority(q=P/2) max':>19} {'mean':>5} {'notes@D':>7} "
          f"{'adds@D':>6}  seconds")
    for P in sizes:
        t0 = time.monotonic()
        row = {"P": P, "log2P": math.log2(P), "ceil_log2P": max_hops(P)}
        if P <= args.coordinator_max:
            row["coordinator"] = coordinator_counts(P, args.posts, args.seed)
        row["solo_driver"] = driver_counts(P, args.posts, args.seed, "decentral")
        row["solo"] = decentral_counts(P, "solo", args.posts, args.seed)
        row["majority"] = decentral_counts(P, "majority", args.posts, args.seed)
        row["seconds"] = time.monotonic() - t0
        rows.append(row)
        c = row.get("coordinator")
        coord = f"{c['rank0_per_round']:>11.1f} {c['other_per_round']:>9.1f}" if c else f"{'-':>11} {'-':>9}"
        s, m, d = row["solo"], row["majority"], row["solo_driver"]
        print(f"{P:>5} {row['log2P']:>6.2f} {row['ceil_log2P']:>4} | {coord} | {d['max']:>10.1f} {d['mean']:>5.1f} | "
              f"{s['max']:>8} {s['mean']:>5.1f} "
              f"{s['activation_max']:>3} | {m['max']:>19} {m['mean']:>5.1f} {m['notices_max_at_designated']:>7} "
              f"{m['additions_max_at_designated']:>6}  "
              f"{row['seconds']:.0f}", flush=True)
    if not args.no_write:
        with open(new_result_path("control_plane_messages.json"), "w") as fh:
            json.dump({"posts_per_rank": args.posts, "max_staleness": 8, "rows": rows}, fh, indent=1)
        with open(new_result_path("control_plane_messages.md"), "w") as fh:
            fh.write(markdown(rows, args.posts))
    return 0


def markdown(rows, posts) -> str:
    lines = [
        "# Control messages per rank per round", "",
        f"Produced by `python benchmarks/control_plane_messages.py` ({posts} posts per rank, tau=8, one slow rank "
        "per step). Counted by running the protocol code: both control planes as every rank's protocol driver "
        "runs them (`control_plane=\"central\"` / `\"decentral\"`, through the cluster simulator, over the run "
        "divided by the rounds started, registration and shutdown apart), and the coordinator-free state machine "
        "alone through its event-driven world (the worst round). Sent plus received; liveness apart "
        "(today P - 1 heartbeats per rank per period, the ring 1). Majority's quorum counter is one-sided: "
        "its additions reach the designated rank's memory, not its engine, and are not messages here.", "",
        "| P | log2 P | ceil(log2 P) | central: rank 0 | central: other ranks | decentral driver: max rank "
        "| decentral driver: mean | state machine solo: max rank (worst round) | mean "
        "| state machine majority (quorum P/2): max rank | mean | quorum notices at the designated rank (max) "
        "| one-sided additions to its quorum counter (max) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        c = row.get("coordinator")
        s, m, d = row["solo"], row["majority"], row.get("solo_driver")
        today = f"{c['rank0_per_round']:.1f} | {c['other_per_round']:.1f}" if c else "not run | not run"
        wired = f"{d['max']:.1f} | {d['mean']:.1f}" if d else "not run | not run"
        lines.append(f"| {row['P']} | {row['log2P']:.2f} | {row['ceil_log2P']} | {today} | {wired} | {s['max']} | "
                     f"{s['mean']:.1f} | {m['max']} | {m['mean']:.1f} | {m['notices_max_at_designated']} | "
                     f"{m['additions_max_at_designated']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
