"""Experiment 1 of the eager-SGD reproduction: throughput under injected imbalance.

Every rank "computes" each step by sleeping (so that 8 ranks fit on 2 cores)
and posts a gradient of ``--nbytes`` bytes; the modes compared are sync, solo,
majority and majority with quorum ceil(P/2). The sweeps:

- delay: every step takes ``--step-ms`` and one random rank per step (the same
  on every rank, the paper's pattern) sleeps 0/25/50/100/200 ms more, at every
  world size in ``--sizes``;
- delayed ranks per step (1, 2, P/2) at the largest world size, 100 ms;
- a persistent straggler: the last rank is always k times slower (k = 2, 4, 8,
  16), under a time budget (``--budget-s``): in solo and majority every rank
  trains until the budget is spent; sync needs every rank to post alike, so
  all do the steps the straggler fits in the budget;
- max_staleness (0..16) against throughput and staleness, for the straggler
  (k = 8) and for the random pattern.

Methodology is that of ``benchmarks/engine.py`` (b): a barrier, then each
rank's time until its last post returned, rounds counted from the results
(including those taken while flushing); seconds = the slowest rank's time.
Each case is also replayed with free communication through the same protocol
code (the ceiling any implementation of the rules could reach), which
``benchmarks/paper_scale.py`` compares with its network-priced simulation.

    python benchmarks/paper_throughput.py            # full run, ~5 minutes
    python benchmarks/paper_throughput.py --quick    # a smoke run, ~1 minute

Writes benchmarks/results/new/paper_throughput.{json,md} and paper_throughput_*.png (git ignores
new/; copy them over the published files in benchmarks/results/ to publish).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from hvd_partial.modes import Majority, Solo, Sync  # noqa: E402
from hvd_partial.sim import NetworkModel, persistent_straggler, simulate  # noqa: E402
from hvd_partial.sim.replay import sleeper_schedule  # noqa: E402
from result_files import new_result_path, save_figure  # noqa: E402

MODES = ["sync", "solo", "majority", "majority_q"]
MODE_LABELS = {"sync": "sync", "solo": "solo", "majority": "majority", "majority_q": "majority q=P/2"}
PAPER = "the paper: 1.29x over sync (ResNet-50, 64 GPUs, injected delays), 1.27x (LSTM/UCF101)"


# ===== cases ==================================================================================

def mode_for(name: str, world_size: int, seed: int = 0):
    """The mode object of a case's mode name."""
    if name == "sync":
        return Sync()
    if name == "solo":
        return Solo()
    if name == "majority":
        return Majority(seed=seed)
    if name == "majority_q":
        return Majority(seed=seed, quorum=math.ceil(world_size / 2))
    raise ValueError(name)


def compute_for(schedule: dict, world_size: int):
    """compute(rank, step) -> seconds for a case's schedule."""
    if schedule["kind"] == "random":
        return sleeper_schedule(world_size, schedule["step_s"], schedule["delay_s"], schedule["seed"],
                                schedule.get("delayed_per_step", 1))
    if schedule["kind"] == "straggler":
        return persistent_straggler(world_size, schedule["step_s"], schedule["slowdown"])
    raise ValueError(schedule["kind"])


def build_cases(args) -> dict[int, list[dict]]:
    step_s = args.step_ms / 1000
    sizes = [int(s) for s in args.sizes.split(",")]
    delays = [float(d) for d in args.delays.split(",")]
    cases: dict[int, list[dict]] = {p: [] for p in sizes}

    def add(sweep, p, mode, schedule, steps, tau=args.max_staleness, deadline_s=None):
        cases[p].append({"sweep": sweep, "P": p, "mode": mode, "tau": 0 if mode == "sync" else tau,
                         "schedule": schedule, "steps": steps, "nbytes": args.nbytes, "seed": args.seed,
                         "deadline_s": deadline_s})

    def budget(p, mode, k):
        """(steps, deadline) of a straggler case: a time budget, or for sync the
        steps the straggler fits into it."""
        if mode == "sync":
            return {"steps": [max(1, int(args.budget_s / (step_s * k)))] * p, "deadline_s": None}
        return {"steps": [10 ** 6] * p, "deadline_s": args.budget_s}

    for p in sizes:
        for d in delays:
            for mode in MODES:
                add("delay", p, mode, {"kind": "random", "step_s": step_s, "delay_s": d / 1000, "seed": args.seed,
                                       "delayed_per_step": 1}, [args.steps] * p)
    big = max(sizes)
    for k in sorted({2, big // 2} - {1}):
        for mode in MODES:
            add("delayed_ranks", big, mode, {"kind": "random", "step_s": step_s, "delay_s": 0.1, "seed": args.seed,
                                             "delayed_per_step": k}, [args.steps] * big)
    sp = args.straggler_size
    if sp in cases:
        for k in [int(x) for x in args.slowdowns.split(",")]:
            for mode in MODES:
                add("straggler", sp, mode, {"kind": "straggler", "step_s": step_s, "slowdown": k}, **budget(sp, mode, k))
        for tau in [int(x) for x in args.taus.split(",")]:
            for mode in ["solo", "majority"]:
                add("tau_straggler", sp, mode, {"kind": "straggler", "step_s": step_s, "slowdown": 8},
                    tau=tau, **budget(sp, mode, 8))
                add("tau_random", sp, mode, {"kind": "random", "step_s": step_s, "delay_s": 0.1, "seed": args.seed,
                                             "delayed_per_step": 1}, [args.steps] * sp, tau=tau)
    return cases


# ===== the MPI worker ==========================================================================

def worker(cases_path: str, out_path: str):
    import numpy as np

    import hvd_partial as hvd

    with open(cases_path) as fh:
        cases = json.load(fh)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = []
    for index, case in enumerate(cases):
        mode = mode_for(case["mode"], size, case["seed"])
        compute = compute_for(case["schedule"], size)
        grad = np.ones(case["nbytes"] // 4, np.float32)
        name = f"case{index}"
        facts = []  # (round, contributors, staleness values) of every round taken; results are dropped at once

        def keep(results):
            facts.extend((r.round, len(r.contributors), sorted(r.staleness.values())) for r in results if not r.flush)

        hvd.barrier()
        start = time.perf_counter()
        deadline = case.get("deadline_s")
        step = 0
        while step < case["steps"][rank] and (deadline is None or time.perf_counter() - start < deadline):
            time.sleep(compute(rank, step))
            step += 1
            keep(hvd.partial_allreduce(grad, name, mode=mode, max_staleness=case["tau"]))
        finish = time.perf_counter() - start
        keep(hvd.flush(name))
        gathered = hvd.allgather_object((finish, step, facts if rank == 0 else None))
        if rank == 0:
            staleness = [s for _, _, st in facts for s in st]
            out.append({**case, "rounds": len(facts), "seconds": max(f for f, _, _ in gathered),
                        "finish": [f for f, _, _ in gathered], "posts": sum(n for _, n, _ in gathered),
                        "contributors_mean": float(np.mean([c for _, c, _ in facts])) if facts else 0.0,
                        "staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
                        "staleness_max": int(max(staleness)) if staleness else 0,
                        "fresh_fraction": sum(1 for s in staleness if s == 0) / (len(facts) * size) if facts else 0.0})
            print(f"  P={size} {case['sweep']:>13} {case['mode']:>10} tau={case['tau']:<2} "
                  f"{out[-1]['rounds']:4d} rounds {out[-1]['seconds']:6.2f} s", flush=True)
    hvd.shutdown()
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(out, fh)


# ===== orchestration, tables and plots ============================================================

def run_size(p: int, cases: list[dict], timeout: float) -> list[dict]:
    from hvd_partial.launch import mpiexec_command

    with tempfile.TemporaryDirectory(prefix="paper-throughput-") as tmp:
        cases_path, out_path = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
        with open(cases_path, "w") as fh:
            json.dump(cases, fh)
        cmd = mpiexec_command(p, [sys.executable, os.path.abspath(__file__), "--worker", cases_path, out_path])
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
        subprocess.run(cmd, check=True, timeout=timeout, env=env)
        with open(out_path) as fh:
            return json.load(fh)


def add_replay(row: dict):
    """The same case with free communication, through the same protocol code."""
    p = row["P"]
    sim = simulate(p, mode_for(row["mode"], p, row["seed"]), row["tau"], row["steps"], compute_for(row["schedule"], p),
                   NetworkModel.free(), deadline_s=row.get("deadline_s"))
    row["replay"] = {"rounds": sim.rounds, "seconds": sim.seconds, "posts": sim.posts,
                     "staleness_mean": sim.staleness_mean, "staleness_max": sim.staleness_max}


def rate(row, key="posts", source=None):
    src = row if source is None else row[source]
    return src[key] / src["seconds"]


def find(rows, **match):
    for row in rows:
        if all((row["schedule"].get(k[2:]) if k.startswith("s_") else row.get(k)) == v for k, v in match.items()):
            return row
    return None


def tables(rows: list[dict], args) -> str:
    out = []
    out.append("### Speedup over sync under random delays (posts/s ratio; same work per rank)")
    out.append("")
    out.append(f"One random rank per step sleeps the delay on top of a {args.step_ms:g} ms step; "
               f"{args.steps} steps per rank, gradient {args.nbytes // 1024} KiB, max_staleness={args.max_staleness}. "
               "In brackets: the same ratio with free communication (replay).")
    out.append("")
    out.append("| P | delay ms | sync posts/s | solo | majority | majority q=P/2 |")
    out.append("|---:|---:|---:|---:|---:|---:|")
    for p in sorted({r["P"] for r in rows if r["sweep"] == "delay"}):
        for d in sorted({r["schedule"]["delay_s"] for r in rows if r["sweep"] == "delay" and r["P"] == p}):
            sync = find(rows, sweep="delay", P=p, mode="sync", s_delay_s=d)
            cells = []
            for mode in MODES[1:]:
                row = find(rows, sweep="delay", P=p, mode=mode, s_delay_s=d)
                cells.append(f"{rate(row) / rate(sync):.2f}x ({rate(row, source='replay') / rate(sync, source='replay'):.2f}x)")
            out.append(f"| {p} | {d * 1000:g} | {rate(sync):.1f} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(PAPER + ".")
    out.append("")
    out.append("### Every case")
    out.append("")
    out.append("rounds/s = model updates per second; posts/s = gradients computed per second by all ranks "
               "(the paper's throughput); /replay = measured over free-communication replay of the same case; "
               "staleness in rounds (mean / max over contributions); fresh = fresh contributions per round / P.")
    out.append("")
    out.append("| sweep | P | pattern | mode | tau | rounds | s | rounds/s | posts/s | x sync | /replay | "
               "staleness | fresh |")
    out.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        s = row["schedule"]
        if s["kind"] == "random":
            pattern = f"{s.get('delayed_per_step', 1)}x{s['delay_s'] * 1000:g}ms"
        else:
            pattern = f"straggler {s['slowdown']:g}x"
        sync = find(rows, sweep=row["sweep"], P=row["P"], mode="sync", schedule=s) if row["sweep"] not in (
            "tau_straggler", "tau_random") else None
        if sync is None and row["sweep"] == "tau_random":
            sync = find(rows, sweep="delay", P=row["P"], mode="sync", s_delay_s=s["delay_s"])
        if sync is None and row["sweep"] == "tau_straggler":
            sync = find(rows, sweep="straggler", P=row["P"], mode="sync", s_slowdown=s["slowdown"])
        xs = f"{rate(row) / rate(sync):.2f}" if sync else "-"
        out.append(f"| {row['sweep']} | {row['P']} | {pattern} | {MODE_LABELS[row['mode']]} | {row['tau']} | "
                   f"{row['rounds']} | {row['seconds']:.2f} | {rate(row, 'rounds'):.1f} | {rate(row):.1f} | {xs} | "
                   f"{rate(row) / rate(row, source='replay'):.2f} | {row['staleness_mean']:.2f} / {row['staleness_max']} | "
                   f"{row['fresh_fraction']:.2f} |")
    return "\n".join(out)


def plots(rows: list[dict], args, prefix: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    colors = {"sync": "tab:gray", "solo": "tab:blue", "majority": "tab:orange", "majority_q": "tab:green"}
    sizes = sorted({r["P"] for r in rows if r["sweep"] == "delay"})
    if sizes:
        fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.6), squeeze=False, sharey=True)
        for ax, p in zip(axes[0], sizes):
            for mode in MODES:
                sel = sorted([r for r in rows if r["sweep"] == "delay" and r["P"] == p and r["mode"] == mode],
                             key=lambda r: r["schedule"]["delay_s"])
                xs = [r["schedule"]["delay_s"] * 1000 for r in sel]
                ideal = p / (args.step_ms / 1000)
                ax.plot(xs, [rate(r) / ideal for r in sel], "o-", color=colors[mode], label=MODE_LABELS[mode])
                ax.plot(xs, [rate(r, source="replay") / ideal for r in sel], ":", color=colors[mode])
            ax.set_title(f"P = {p}")
            ax.set_xlabel("injected delay (ms), 1 rank per step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(f"posts/s / ideal (P / {args.step_ms:g} ms)")
        axes[0][0].legend(fontsize=8)
        fig.suptitle("Throughput under random delays (dotted: free-communication replay)")
        fig.tight_layout()
        made.append(save_figure(fig, prefix + "_delay.png"))
    strag = [r for r in rows if r["sweep"] == "straggler"]
    if strag:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for mode in MODES:
            sel = sorted([r for r in strag if r["mode"] == mode], key=lambda r: r["schedule"]["slowdown"])
            ax.plot([r["schedule"]["slowdown"] for r in sel], [rate(r, "rounds") for r in sel], "o-",
                    color=colors[mode], label=MODE_LABELS[mode])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("slowdown k of one persistent straggler")
        ax.set_ylabel("rounds (model updates) per second")
        ax.set_title(f"Persistent straggler, P = {strag[0]['P']}, max_staleness={args.max_staleness}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(save_figure(fig, prefix + "_straggler.png"))
    taus = [r for r in rows if r["sweep"].startswith("tau_")]
    if taus:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        for ax, sweep, title in ((axes[0], "tau_straggler", "straggler 8x"), (axes[1], "tau_random", "1 x 100 ms per step")):
            ax2 = ax.twinx()
            for mode in ("solo", "majority"):
                sel = sorted([r for r in taus if r["sweep"] == sweep and r["mode"] == mode], key=lambda r: r["tau"])
                xs = [r["tau"] for r in sel]
                ax.plot(xs, [rate(r, "rounds") for r in sel], "o-", color=colors[mode], label=f"{mode} rounds/s")
                ax2.plot(xs, [r["staleness_mean"] for r in sel], "s--", color=colors[mode], alpha=0.6,
                         label=f"{mode} mean staleness")
            ax.set_xlabel("max_staleness (rounds)")
            ax.set_ylabel("rounds per second")
            ax2.set_ylabel("mean staleness (rounds)")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
            ax2.legend(fontsize=7, loc="lower right")
        fig.suptitle(f"Staleness bound against throughput, P = {taus[0]['P']}")
        fig.tight_layout()
        made.append(save_figure(fig, prefix + "_staleness.png"))
    return made


def machine() -> dict:
    load = os.getloadavg()
    try:
        from mpi4py import MPI

        mpi = MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - informational only
        mpi = "unknown"
    return {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
            "mpi": mpi, "loadavg_at_start": load}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("CASES", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="few steps, few cases (a smoke run)")
    parser.add_argument("--sizes", default="2,4,8", help="world sizes")
    parser.add_argument("--steps", type=int, default=60, help="steps per rank (fast ranks)")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--delays", default="0,25,50,100,200", help="injected delays (ms)")
    parser.add_argument("--nbytes", type=int, default=1 << 20, help="gradient size in bytes")
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--straggler-size", type=int, default=4, help="world size of the straggler sweeps")
    parser.add_argument("--slowdowns", default="2,4,8,16")
    parser.add_argument("--budget-s", type=float, default=2.0, help="time budget of the straggler cases")
    parser.add_argument("--taus", default="0,1,2,4,8,16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per world size before giving up")
    parser.add_argument("--out", default="paper_throughput", help="result file prefix under benchmarks/results")
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return
    if args.quick:
        args.steps, args.delays, args.slowdowns, args.taus, args.budget_s = 12, "0,100", "4", "0,8", 0.6
        if args.out == "paper_throughput":
            args.out = "paper_throughput_quick"
    os.makedirs(RESULTS, exist_ok=True)
    info = machine()
    print(f"experiment 1: {info}", flush=True)
    cases = build_cases(args)
    rows, started = [], time.time()
    for p, group in cases.items():
        print(f"P={p}: {len(group)} cases", flush=True)
        rows += run_size(p, group, args.timeout)
    for row in rows:
        add_replay(row)
    info["loadavg_at_end"] = os.getloadavg()
    info["wall_seconds"] = time.time() - started
    command = "python benchmarks/paper_throughput.py " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    text = tables(rows, args)
    header = (f"Command: `{command.strip()}`  \nMachine: {info['cores']} cores ({info['cpu']}), Python {info['python']}, "
              f"{info['mpi']}, control plane {info['control_plane']}; load average at start {info['loadavg_at_start'][0]:.2f}, at end "
              f"{info['loadavg_at_end'][0]:.2f}; wall time {info['wall_seconds']:.0f} s.\n\n")
    print(text)
    with open(new_result_path(args.out + ".md"), "w") as fh:
        fh.write(header + text + "\n")
    with open(new_result_path(args.out + ".json"), "w") as fh:
        json.dump({"command": command.strip(), "args": vars(args), "machine": info, "rows": rows}, fh, indent=1)
    for path in plots(rows, args, args.out):
        print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
