"""Experiment 3 of the eager-SGD reproduction: scale by simulation.

The simulator (:func:`hvd_partial.sim.simulate`) runs the protocol's own
code (coordinator and rank streams) on a simulated clock and prices each
message and reduction with a :class:`hvd_partial.sim.NetworkModel`. This
script

1. **calibrates** the model on this machine: under ``mpiexec -n P`` for P in
   ``--sizes`` it measures the coordinator's cost of sending a round start
   to one rank (pickle + isend, plain mpi4py), the host overhead of a step
   (a sync loop of 20 ms sleeps and posts of ``--nbytes``: period - 20 ms -
   reduction),
   (a) the reduction of a sync round (the wait of the
   last rank to arrive, which waits only for the reduction) at several buffer
   sizes, and (b) the activation latency of a solo round started by one rank
   while the others sleep (post -> coordinator -> round start to every rank ->
   reduction); in-process it times the coordinator's decision code and the
   pickling of a round start at 4..1024 ranks. It fits the model's constants
   by non-negative least squares. The host overhead is kept per world size for
   the validation (P ranks share this machine's 2 cores); projections use the
   one measured with a core per rank;
2. **validates** it against experiment 1 (``benchmarks/results/paper_throughput.json``,
   produced by ``benchmarks/paper_throughput.py``): every measured case at 2-8
   ranks is simulated with the fitted model; the target is within 15%;
3. **projects** throughput to 16, 64, 256 and 1024 ranks under the paper's
   delay pattern (one random rank per step, and P/32 ranks per step: about 2
   of 64 as in the paper) and balanced load, with the control plane of
   ``--control-plane`` (decentral, the default; central: the simulator's reference coordinator;
   or both);
4. with ``--planes``, compares the two **control planes** side by side (the
   issue's targets): solo over sync at 256, 1,024 and 4,096 ranks with one
   slow rank per step, balanced solo over sync and P/32 slow ranks per step
   against the free-communication ceiling at 1,024, and control messages per
   rank per round against log2 P. The decentralized plane's per-round view
   (vector work over P ranks) is priced by ``view_per_rank_s``, timed here
   in-process on the real code when the network file lacks it.

The decentralized plane runs with the engine's activation delay
(``--activation-delay-us``, 2 ms by default, as ``activation_delay_us``; 0
floods every activation at once); ``--planes-compared decentral`` leaves
rank 0's coordinator out of the comparison (its columns read "not run").

    python benchmarks/paper_scale.py                       # 1-3, ~6 minutes
    python benchmarks/paper_scale.py --skip-calibration    # reuse the fitted model
    python benchmarks/paper_scale.py --quick               # a smoke run
    python benchmarks/paper_scale.py --skip-calibration --planes-only   # 4 alone
    python benchmarks/paper_scale.py --skip-calibration --planes-only --planes-compared decentral

Writes to benchmarks/results/new/ (git ignores it; copy over benchmarks/results/ to publish)
paper_scale.{json,md}, paper_scale_network.json and
paper_scale_{validation,projection}.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from paper_throughput import MODE_LABELS, MODES, compute_for, machine, mode_for  # noqa: E402

from hvd_partial.config import Config  # noqa: E402
from hvd_partial.core.messages import Start  # noqa: E402
from hvd_partial.sim import NetworkModel, random_delays, simulate  # noqa: E402
from hvd_partial.sim.cluster import ClusterSimulator  # noqa: E402
from hvd_partial.sim.network import fit_linear, fit_reduce, nonnegative_least_squares  # noqa: E402
from result_files import new_result_path, save_figure  # noqa: E402

TOLERANCE = 0.15
CAL_SIZES_BYTES = [4, 64 * 1024, 1 << 20, 4 << 20]


# ===== 1. calibration =============================================================================

def calibrate_worker(out_path: str, iters: int, gap_s: float, host_bytes: int):
    """Under mpiexec: the reduction and activation measurements."""
    import numpy as np
    from mpi4py import MPI

    import hvd_partial as hvd

    out = {"reduce": [], "activation": [], "host": [], "send": []}
    # The coordinator's own cost of sending a round start to one rank (pickle + isend),
    # measured with plain mpi4py before the engine runs.
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    if size > 1:
        msg = Start(0, 7, 1, lag=tuple([1] * size))
        repeats = 200
        comm.Barrier()
        if rank == 0:
            requests = []
            t = time.perf_counter()
            for _ in range(repeats):
                for dest in range(1, size):
                    requests.append(comm.isend(msg, dest=dest, tag=5))
            elapsed = time.perf_counter() - t
            MPI.Request.Waitall(requests)
            out["send"].append({"P": size, "seconds": elapsed / (repeats * (size - 1))})
        else:
            for _ in range(repeats):
                comm.recv(source=0, tag=5)
        comm.Barrier()
    comm.Free()
    hvd.init()
    hvd.barrier()
    # Host overhead per step: every rank "computes" 20 ms (a sleep) and then posts
    # the experiment's gradient to a sync stream; a step lasts 20 ms + the
    # reduction + this overhead (timer slack, waking up, taking the result, and
    # on this machine 2 cores shared by P ranks).
    grad = np.ones(max(1, host_bytes // 4), np.float32)
    returns, waits = [], []
    for i in range(iters + 2):
        time.sleep(0.02)
        t = time.perf_counter()
        hvd.partial_allreduce(grad, "host", mode=hvd.Sync())
        returns.append(time.perf_counter())
        waits.append(returns[-1] - t)
    hvd.flush("host")
    every = hvd.allgather_object(waits)
    overhead = [returns[i] - returns[i - 1] - 0.02 - min(w[i] for w in every) for i in range(2, iters + 2)]
    out["host"].append({"P": size, "nbytes": host_bytes, "seconds": statistics.median(overhead)})
    for nbytes in CAL_SIZES_BYTES:
        grad = np.ones(max(1, nbytes // 4), np.float32)
        name = f"sync-{nbytes}"
        waits = []
        hvd.barrier()
        for i in range(iters + 2):
            time.sleep(0.004 + 0.001 * ((i + rank) % 3))  # the last to arrive changes
            t = time.perf_counter()
            hvd.partial_allreduce(grad, name, mode=hvd.Sync())
            if i >= 2:
                waits.append(time.perf_counter() - t)
        hvd.flush(name)
        every = hvd.allgather_object(waits)
        per_iteration = [min(w[i] for w in every) for i in range(len(waits))]
        out["reduce"].append({"P": size, "nbytes": nbytes, "seconds": statistics.median(per_iteration)})
    for nbytes in CAL_SIZES_BYTES:
        grad = np.ones(max(1, nbytes // 4), np.float32)
        name = f"solo-{nbytes}"
        tau = 4 * size
        hvd.partial_allreduce(grad, name, mode=hvd.Solo(), max_staleness=tau)  # registers the stream
        hvd.barrier()
        t0 = time.perf_counter()
        mine = []
        for i in range((iters + 1) * size):
            if i % size != rank:
                continue
            time.sleep(max(0.0, t0 + (i + 1) * gap_s - time.perf_counter()))
            hvd.partial_allreduce(grad, name, mode=hvd.Solo(), max_staleness=tau)  # takes what completed
            t = time.perf_counter()
            hvd.partial_allreduce(grad, name, mode=hvd.Solo(), max_staleness=tau)  # starts a round, waits
            if i >= size:
                mine.append(time.perf_counter() - t)
        time.sleep(max(0.0, t0 + ((iters + 1) * size + 1) * gap_s - time.perf_counter()))
        hvd.flush(name)
        every = hvd.allgather_object(mine)
        for poster, waits in enumerate(every):
            out["activation"].append({"P": size, "nbytes": nbytes, "poster": poster, "seconds": statistics.median(waits)})
    hvd.shutdown()
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(out, fh)


def measure_in_process(sizes=(4, 16, 64, 256, 1024), steps: int = 20) -> dict:
    """Time the coordinator's decisions (the real code, in this process) and
    the pickling of a round start, against the world size."""
    coordinator = []
    for p in sizes:
        for mode in ("solo", "majority"):
            sim = ClusterSimulator(p, mode_for(mode, p), 8, max(4, steps * 16 // p) if p > 64 else steps,
                                   random_delays(p, 0.02, 0.1, 0), NetworkModel.free())
            coord = sim.world.coordinator
            spent = [0.0, 0]

            def timed(fn):
                def wrapper(*a, **k):
                    t = time.perf_counter()
                    try:
                        return fn(*a, **k)
                    finally:
                        spent[0] += time.perf_counter() - t
                        spent[1] += 1
                return wrapper

            for attr in ("on_post", "on_flush", "on_round_complete"):
                setattr(coord, attr, timed(getattr(coord, attr)))
            sim.run()
            coordinator.append({"P": p, "mode": mode, "seconds_per_message": spent[0] / max(1, spent[1]),
                                "messages": spent[1]})
    pickling = []
    for p in sizes:
        msg = Start(0, 7, 1, lag=tuple([1] * p))
        reps = max(200, 20000 // p)
        t = time.perf_counter()
        for _ in range(reps):
            blob = pickle.dumps(msg)
        dumps = (time.perf_counter() - t) / reps
        t = time.perf_counter()
        for _ in range(reps):
            pickle.loads(blob)
        loads = (time.perf_counter() - t) / reps
        pickling.append({"P": p, "dumps_s": dumps, "loads_s": loads, "bytes": len(blob)})
    return {"coordinator": coordinator, "pickling": pickling}


def measure_view(sizes=(64, 256, 1024, 2048), posts: int = 4) -> dict:
    """Time the decentralized control plane's work per round on one rank
    (``DecentralStream.read_facts`` and ``on_reduced``: the round's results and
    the next round's view from the ``(4, P)`` facts) against P, in this process, and fit its
    per-rank slope (the intercept is priced as the handling of one event)."""
    from hvd_partial.core.decentral import DecentralStream
    from hvd_partial.sim.decentral_world import DecentralWorld

    samples = []
    for p in sizes:
        for balanced in (True, False):
            compute = random_delays(p, 0.02, 0.0 if balanced else 0.1, 0)
            world = DecentralWorld(p, "solo", 8, [posts] * p, seed=0, compute=compute, delay_s=1e-4,
                                   keep_results=False)
            spent = [0.0, 0]  # seconds in both, rounds completed (on_reduced calls)
            plain = {name: getattr(DecentralStream, name) for name in ("read_facts", "on_reduced")}

            def timed(name):
                def wrapper(self, *a, **k):
                    t = time.perf_counter()
                    try:
                        return plain[name](self, *a, **k)
                    finally:
                        spent[0] += time.perf_counter() - t
                        spent[1] += name == "on_reduced"
                return wrapper

            for name in plain:
                setattr(DecentralStream, name, timed(name))
            try:
                world.run()
            finally:
                for name, method in plain.items():
                    setattr(DecentralStream, name, method)
            samples.append({"P": p, "balanced": balanced, "seconds_per_round": spent[0] / max(1, spent[1]),
                            "calls": spent[1]})
    c0, c1 = fit_linear([x["P"] for x in samples], [x["seconds_per_round"] for x in samples])
    return {"samples": samples, "intercept_s": c0, "view_per_rank_s": c1}


def with_view_cost(calibration: dict, again: bool = False) -> NetworkModel:
    """The fitted model, with ``view_per_rank_s`` measured now if the calibration lacks it (or ``again``)."""
    if again or "view_per_rank_s" not in calibration["network"]:
        print("timing the decentralized plane's per-round view in-process ...", flush=True)
        calibration.setdefault("local", {})["view"] = view = measure_view()
        calibration["network"]["view_per_rank_s"] = view["view_per_rank_s"]
        print(f"  view_per_rank_s = {view['view_per_rank_s']:.3g} s (intercept {view['intercept_s'] * 1e6:.1f} us, "
              f"priced as one event's handling)", flush=True)
    return NetworkModel.from_dict(calibration["network"])


def fit_network(mpi: dict, local: dict) -> tuple[NetworkModel, dict]:
    """Fit the model's constants; returns the model and the fit's residuals."""
    reduce_samples = [(r["P"], r["nbytes"], r["seconds"]) for r in mpi["reduce"]]
    base, alpha, beta = fit_reduce(reduce_samples)
    c0, c1 = fit_linear([c["P"] for c in local["coordinator"]], [c["seconds_per_message"] for c in local["coordinator"]])
    _, send_per_rank = fit_linear([x["P"] for x in local["pickling"]], [x["dumps_s"] for x in local["pickling"]])
    _, recv_per_rank = fit_linear([x["P"] for x in local["pickling"]], [x["loads_s"] for x in local["pickling"]])
    measured_reduce = {(r["P"], r["nbytes"]): r["seconds"] for r in mpi["reduce"]}
    # per-destination send cost: measured at small P; its growth with P is the pickling's
    send = max(0.0, statistics.fmean(x["seconds"] - send_per_rank * x["P"] for x in mpi["send"])) if mpi["send"] else 0.0
    rows, rhs = [], []
    for a in mpi["activation"]:
        p, hops = a["P"], (2 if a["poster"] != 0 else 1)
        rest = (a["seconds"] - measured_reduce[(p, a["nbytes"])] - (c0 + c1 * p)
                - hops * recv_per_rank * p - (p - 1) * (send + send_per_rank * p))
        rows.append([hops])
        rhs.append(rest)
    (latency,) = nonnegative_least_squares(rows, rhs)
    net = NetworkModel(reduce_base_s=base, reduce_alpha_s=alpha, reduce_beta_s_per_byte=beta,
                       message_latency_s=float(latency), message_per_rank_s=recv_per_rank,
                       send_overhead_s=float(send), send_per_rank_s=send_per_rank,
                       coordinator_s=c0, coordinator_per_rank_s=c1,
                       step_overhead_s=cluster_host_overhead(mpi),
                       view_per_rank_s=local["view"]["view_per_rank_s"] if "view" in local else 0.0,
                       source="fitted by benchmarks/paper_scale.py on this machine")
    residuals = {
        "reduce": [{"P": p, "nbytes": n, "measured": s, "model": net.reduce_seconds(p, n)} for p, n, s in reduce_samples],
        "activation": [{"P": a["P"], "nbytes": a["nbytes"], "poster": a["poster"], "measured": a["seconds"],
                        "model": activation_model(net, a["P"], a["nbytes"], a["poster"])} for a in mpi["activation"]],
    }
    return net, residuals


def cluster_host_overhead(mpi: dict) -> float:
    """The host overhead per step for projections: the one measured with a
    core per rank (the smallest calibrated world, P <= cores), as on a cluster."""
    cores = os.cpu_count() or 1
    fits = [h for h in mpi["host"] if h["P"] <= cores] or mpi["host"]
    return max(0.0, min(fits, key=lambda h: h["P"])["seconds"])


def network_at(calibration: dict, world_size: int) -> NetworkModel:
    """The model for validating at ``world_size`` ranks on this machine: the
    host overhead measured at that size (P ranks on this machine's cores)."""
    net = NetworkModel.from_dict(calibration["network"])
    host = {h["P"]: h["seconds"] for h in calibration["mpi"].get("host", [])}
    if world_size in host:
        net = net.replace(step_overhead_s=max(0.0, host[world_size]))
    return net


def activation_model(net: NetworkModel, p: int, nbytes: int, poster: int) -> float:
    """The model's time from a lone solo post to its result (see the simulator)."""
    hops_up = net.message_seconds(p) if poster != 0 else 0.0
    return (hops_up + net.coordinator_seconds(p) + (p - 1) * net.send_seconds(p) + net.message_seconds(p)
            + net.reduce_seconds(p, nbytes))


def calibrate(sizes: list[int], iters: int, gap_s: float, timeout: float, host_bytes: int) -> dict:
    from hvd_partial.launch import mpiexec_command

    mpi = {"reduce": [], "activation": [], "host": [], "send": []}
    for p in sizes:
        with tempfile.TemporaryDirectory(prefix="paper-scale-") as tmp:
            out = os.path.join(tmp, "cal.json")
            cmd = mpiexec_command(p, [sys.executable, os.path.abspath(__file__), "--calibrate-worker", out,
                                      str(iters), str(gap_s), str(host_bytes)])
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            print(f"calibrating at P={p} ...", flush=True)
            subprocess.run(cmd, check=True, timeout=timeout, env=env)
            with open(out) as fh:
                got = json.load(fh)
        for key in mpi:
            mpi[key] += got[key]
    print("timing the coordinator and pickling in-process ...", flush=True)
    local = measure_in_process()
    print("timing the decentralized plane's per-round view in-process ...", flush=True)
    local["view"] = measure_view()
    net, residuals = fit_network(mpi, local)
    return {"mpi": mpi, "local": local, "network": net.to_dict(), "residuals": residuals}


# ===== 2. validation ==============================================================================

def delay_for(plane: str, delay_us: float) -> float:
    """The activation delay (seconds) the simulator runs under ``plane``: only the decentralized plane holds floods."""
    return delay_us / 1e6 if plane == "decentral" else 0.0


def simulate_row(row: dict, net: NetworkModel, plane: str = "decentral", delay_us: float = 0.0):
    p = row["P"]
    return simulate(p, mode_for(row["mode"], p, row["seed"]), row["tau"], row["steps"], compute_for(row["schedule"], p),
                    net, nbytes=row["nbytes"], deadline_s=row.get("deadline_s"), control_plane=plane,
                    activation_delay_s=delay_for(plane, delay_us))


def validate(rows: list[dict], calibration: dict, plane: str = "decentral", delay_us: float = 0.0) -> list[dict]:
    """Simulate every measured case of experiment 1 under control plane ``plane`` (the one the real runs used)."""
    out = []
    for row in rows:
        sim = simulate_row(row, network_at(calibration, row["P"]), plane, delay_us)
        measured_posts, measured_rounds = row["posts"] / row["seconds"], row["rounds"] / row["seconds"]
        out.append({
            "sweep": row["sweep"], "P": row["P"], "mode": row["mode"], "tau": row["tau"], "schedule": row["schedule"],
            "measured_posts_per_s": measured_posts, "sim_posts_per_s": sim.posts_per_second,
            "replay_posts_per_s": row["replay"]["posts"] / row["replay"]["seconds"],
            "measured_rounds_per_s": measured_rounds, "sim_rounds_per_s": sim.rounds_per_second,
            "replay_rounds_per_s": row["replay"]["rounds"] / row["replay"]["seconds"],
            "measured_staleness_mean": row["staleness_mean"], "sim_staleness_mean": sim.staleness_mean,
        })
    return out


def error(pred: float, meas: float) -> float:
    return pred / meas - 1.0


def validation_table(val: list[dict]) -> str:
    lines = ["| sweep | P | pattern | mode | tau | measured posts/s | sim | err | replay err | "
             "measured rounds/s | sim | err | replay err |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v in val:
        s = v["schedule"]
        pattern = (f"{s.get('delayed_per_step', 1)}x{s['delay_s'] * 1000:g}ms" if s["kind"] == "random"
                   else f"straggler {s['slowdown']:g}x")
        lines.append(
            f"| {v['sweep']} | {v['P']} | {pattern} | {MODE_LABELS[v['mode']]} | {v['tau']} | "
            f"{v['measured_posts_per_s']:.1f} | {v['sim_posts_per_s']:.1f} | "
            f"{error(v['sim_posts_per_s'], v['measured_posts_per_s']):+.0%} | "
            f"{error(v['replay_posts_per_s'], v['measured_posts_per_s']):+.0%} | "
            f"{v['measured_rounds_per_s']:.1f} | {v['sim_rounds_per_s']:.1f} | "
            f"{error(v['sim_rounds_per_s'], v['measured_rounds_per_s']):+.0%} | "
            f"{error(v['replay_rounds_per_s'], v['measured_rounds_per_s']):+.0%} |")
    return "\n".join(lines)


def validation_summary(val: list[dict]) -> dict:
    def stats(pred_key, meas_key):
        errs = [abs(error(v[pred_key], v[meas_key])) for v in val]
        return {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                "within_tolerance": sum(e <= TOLERANCE for e in errs), "cases": len(errs)}

    return {"posts_per_s": stats("sim_posts_per_s", "measured_posts_per_s"),
            "rounds_per_s": stats("sim_rounds_per_s", "measured_rounds_per_s"),
            "replay_posts_per_s": stats("replay_posts_per_s", "measured_posts_per_s"),
            "replay_rounds_per_s": stats("replay_rounds_per_s", "measured_rounds_per_s")}


# ===== 3. projection ==============================================================================

def projection_cases(args) -> list[dict]:
    cases = []
    for p in [int(x) for x in args.proj_sizes.split(",")]:
        patterns = [("balanced", 0), ("1 rank/step", 1)]
        if p >= 64:  # the paper's ~2 of 64 (below 64 ranks that is one rank per step)
            patterns.append(("P/32 ranks/step", p // 32))
        for label, k in patterns:
            for mode in MODES:
                cases.append({"P": p, "pattern": label, "delayed_per_step": k, "mode": mode})
    return cases


def project(args, net: NetworkModel, plane: str = "decentral") -> list[dict]:
    out = []
    step_s, delay_s = args.step_ms / 1000, args.delay_ms / 1000
    for case in projection_cases(args):
        case = {**case, "control_plane": plane}
        p, k = case["P"], case["delayed_per_step"]
        compute = random_delays(p, step_s, delay_s if k else 0.0, args.seed, max(1, k))
        tau = 0 if case["mode"] == "sync" else args.max_staleness
        t = time.time()
        sim = simulate(p, mode_for(case["mode"], p, args.seed), tau, args.proj_steps, compute, net, nbytes=args.nbytes,
                       control_plane=plane, activation_delay_s=delay_for(plane, args.activation_delay_us))
        row = {**case, "tau": tau, "rounds": sim.rounds, "seconds": sim.seconds, "posts": sim.posts,
               "posts_per_s": sim.posts_per_second, "rounds_per_s": sim.rounds_per_second,
               "staleness_mean": sim.staleness_mean, "staleness_max": sim.staleness_max,
               "contributors_mean": sim.contributors_mean, "coordinator_busy": sim.coordinator_busy_s / sim.seconds,
               "sim_wall_s": time.time() - t}
        if case["mode"] in ("sync", "solo"):  # the same with free communication (replay)
            free = simulate(p, mode_for(case["mode"], p), tau, args.proj_steps, compute, NetworkModel.free(),
                            control_plane=plane, activation_delay_s=delay_for(plane, args.activation_delay_us))
            row["free_posts_per_s"] = free.posts_per_second
        out.append(row)
        print(f"  {plane:>9} P={p:5d} {case['pattern']:>16} {case['mode']:>10}: {row['posts_per_s']:9.1f} posts/s, "
              f"{row['rounds_per_s']:6.1f} rounds/s, coordinator busy {row['coordinator_busy']:.0%} "
              f"({row['sim_wall_s']:.1f} s)", flush=True)
    return out


def projection_table(proj: list[dict], args) -> str:
    lines = ["| P | pattern | sync posts/s | solo | majority | majority q=P/2 | solo, free communication | "
             "solo staleness mean/max | coordinator busy (solo) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["P"], r["pattern"]) for r in proj}, key=lambda k: (k[0], k[1]))
    for p, pattern in keys:
        by = {r["mode"]: r for r in proj if r["P"] == p and r["pattern"] == pattern}
        sync = by["sync"]["posts_per_s"]
        cells = [f"{by[m]['posts_per_s'] / sync:.2f}x" for m in MODES[1:]]
        solo = by["solo"]
        busy = "saturated" if solo["coordinator_busy"] >= 0.99 else f"{solo['coordinator_busy']:.0%}"
        lines.append(f"| {p} | {pattern} | {sync:.0f} | " + " | ".join(cells) +
                     f" | {solo['free_posts_per_s'] / by['sync']['free_posts_per_s']:.2f}x | "
                     f"{solo['staleness_mean']:.2f} / {solo['staleness_max']} | {busy} |")
    return "\n".join(lines)


# ===== 4. the control planes side by side ========================================================

PLANES = ("central", "decentral")
# the targets for the decentralized plane (tau = 8, 20 ms steps, 100 ms delays)
TARGETS = {("1 rank/step", 1024): 3.0, ("1 rank/step", 4096): 2.5}


def planes_cases(args) -> list[dict]:
    """One slow rank per step at every size; balanced and P/32 slow ranks per step at ``--planes-detail``."""
    steps = {int(k): int(v) for k, v in (x.split(":") for x in args.planes_steps.split(","))}
    cases = []
    for p in [int(x) for x in args.planes_sizes.split(",")]:
        patterns = [("1 rank/step", 1)]
        if p == args.planes_detail:
            patterns += [("balanced", 0), ("P/32 ranks/step", p // 32)]
        for label, k in patterns:
            cases.append({"P": p, "pattern": label, "delayed_per_step": k, "steps": steps.get(p, args.proj_steps)})
    return cases


def compare_planes(args, net: NetworkModel) -> list[dict]:
    """Sync and solo under both control planes, each also with free communication."""
    out = []
    step_s, delay_s = args.step_ms / 1000, args.delay_ms / 1000
    for case in planes_cases(args):
        p, k, steps = case["P"], case["delayed_per_step"], case["steps"]
        for plane in args.planes_compared.split(","):
            held = delay_for(plane, args.activation_delay_us)
            for mode in ("sync", "solo"):
                compute = random_delays(p, step_s, delay_s if k else 0.0, args.seed, max(1, k))
                tau = 0 if mode == "sync" else args.max_staleness
                t = time.time()
                sim = simulate(p, mode_for(mode, p, args.seed), tau, steps, compute, net, nbytes=args.nbytes,
                               control_plane=plane, activation_delay_s=held)
                wall = time.time() - t
                free = None if args.planes_free == "none" else simulate(
                    p, mode_for(mode, p, args.seed), tau, steps, compute, NetworkModel.free(), control_plane=plane,
                    activation_delay_s=held)
                row = {**case, "control_plane": plane, "mode": mode, "tau": tau, "rounds": sim.rounds,
                       "seconds": sim.seconds, "posts": sim.posts, "posts_per_s": sim.posts_per_second,
                       "rounds_per_s": sim.rounds_per_second, "staleness_mean": sim.staleness_mean,
                       "staleness_max": sim.staleness_max, "busy_max": sim.busy_max_s / sim.seconds,
                       "coordinator_busy": sim.coordinator_busy_s / sim.seconds,
                       "messages_per_round_max": sim.messages_per_round_max,
                       "messages_per_round_mean": sim.messages_per_round_mean,
                       "registered_s": sim.registered_s, "steady_posts_per_s": sim.steady_posts_per_second,
                       "free_posts_per_s": free.posts_per_second if free else None,
                       "free_rounds": free.rounds if free else None,
                       "sim_wall_s": wall, "free_wall_s": time.time() - t - wall}
                out.append(row)
                print(f"  P={p:5d} {case['pattern']:>16} {plane:>9} {mode:>5} ({steps} steps): "
                      f"{row['posts_per_s']:9.1f} posts/s (free {row['free_posts_per_s'] or 0:9.1f}), "
                      f"{row['rounds']} rounds, busiest engine {row['busy_max']:.0%}, "
                      f"{row['messages_per_round_max']:.1f} messages/round at the busiest rank "
                      f"({wall:.0f} s + {row['free_wall_s']:.0f} s free)", flush=True)
    return out


def _planes_by(rows):
    by = {}
    for r in rows:
        by[(r["P"], r["pattern"], r["control_plane"], r["mode"])] = r
    return by


def planes_table(rows: list[dict]) -> str:
    """Solo over sync per plane; a plane the run left out (``--planes-compared``) shows 'not run'."""
    by = _planes_by(rows)
    lines = ["| P | pattern | steps | sync posts/s | solo/sync, central | solo/sync, decentral | "
             "free-communication ceiling | decentral / ceiling | after round 0: solo/sync, central / decentral | "
             "busiest engine, central / decentral | target (decentral) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    keys = sorted({(r["P"], r["pattern"]) for r in rows}, key=lambda k: (k[1] != "1 rank/step", k[0], k[1]))
    for p, pattern in keys:
        ratio, busy, steady, ceilings, steps, sync_rate = {}, {}, {}, {}, None, None
        for plane in PLANES:
            sync, solo = by.get((p, pattern, plane, "sync")), by.get((p, pattern, plane, "solo"))
            if sync is None or solo is None:
                continue
            ratio[plane] = solo["posts_per_s"] / sync["posts_per_s"]
            busy[plane] = solo["busy_max"]
            steady[plane] = solo["steady_posts_per_s"] / sync["steady_posts_per_s"]
            if solo["free_posts_per_s"] is not None:
                ceilings[plane] = solo["free_posts_per_s"] / sync["free_posts_per_s"]
            if steps is None or plane == "decentral":
                steps, sync_rate = solo["steps"], sync["posts_per_s"]
        ceiling = ceilings.get("decentral", ceilings.get("central"))
        if ceiling is None:
            ceiling_cell = "not run"
        elif "central" in ceilings and "decentral" in ceilings and abs(ceilings["central"] - ceiling) >= 0.005:
            ceiling_cell = f"{ceiling:.2f}x ({ceilings['central']:.2f}x central)"
        else:
            ceiling_cell = f"{ceiling:.2f}x"
        mine = ratio.get("decentral")
        target = TARGETS.get((pattern, p))
        if mine is None:
            goal = "-"
        elif pattern == "balanced":
            goal = f">= 0.9x: {'met' if mine >= 0.9 else 'missed'}"
        elif pattern.startswith("P/32") and ceiling is not None:
            goal = f">= 0.9 of ceiling: {'met' if mine / ceiling >= 0.9 else 'missed'}"
        elif target is not None:
            goal = f">= {target:g}x: {'met' if mine >= target else 'missed'}"
        else:
            goal = "-"
        fmt = lambda b: "not run" if b is None else ("saturated" if b >= 0.99 else f"{b:.0%}")  # noqa: E731
        cell = lambda d, plane: "not run" if plane not in d else f"{d[plane]:.2f}x"  # noqa: E731
        of_ceiling = "-" if ceiling is None or mine is None else f"{mine / ceiling:.2f}"
        lines.append(f"| {p} | {pattern} | {steps} | {sync_rate:.0f} | {cell(ratio, 'central')} | "
                     f"{cell(ratio, 'decentral')} | {ceiling_cell} | {of_ceiling} | "
                     f"{cell(steady, 'central')} / {cell(steady, 'decentral')} | "
                     f"{fmt(busy.get('central'))} / {fmt(busy.get('decentral'))} | {goal} |")
    return "\n".join(lines)


def planes_messages_table(rows: list[dict]) -> str:
    by = _planes_by(rows)
    lines = ["| P | log2 P | central: busiest rank (rank 0) | central: mean | decentral: busiest rank | "
             "decentral: mean | decentral busiest / log2 P |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in sorted({r["P"] for r in rows}):
        cells = []
        for plane in PLANES:
            r = by.get((p, "1 rank/step", plane, "solo"))
            cells += (["not run"] * 2 if r is None
                      else [f"{r['messages_per_round_max']:.1f}", f"{r['messages_per_round_mean']:.1f}"])
        d = by.get((p, "1 rank/step", "decentral", "solo"))
        per_log = "-" if d is None else f"{d['messages_per_round_max'] / math.log2(p):.2f}"
        lines.append(f"| {p} | {math.log2(p):.0f} | " + " | ".join(cells) + f" | {per_log} |")
    return "\n".join(lines)


# ===== plots ======================================================================================

def plots(val: list[dict], proj: list[dict], args) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    made = []
    colors = {"sync": "tab:gray", "solo": "tab:blue", "majority": "tab:orange", "majority_q": "tab:green"}
    if val:
        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        for ax, (key, label) in zip(axes, (("posts_per_s", "posts/s"), ("rounds_per_s", "rounds/s"))):
            for mode in MODES:
                sel = [v for v in val if v["mode"] == mode]
                ax.scatter([v["measured_" + key] for v in sel], [v["sim_" + key] for v in sel], s=18,
                           color=colors[mode], label=MODE_LABELS[mode])
            lo = min(min(v["measured_" + key], v["sim_" + key]) for v in val) * 0.8
            hi = max(max(v["measured_" + key], v["sim_" + key]) for v in val) * 1.2
            xs = [lo, hi]
            ax.plot(xs, xs, "k-", lw=0.8)
            ax.fill_between(xs, [x * (1 - TOLERANCE) for x in xs], [x * (1 + TOLERANCE) for x in xs], color="k",
                            alpha=0.08, label="±15%")
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
                axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel(f"measured {label} (experiment 1)")
            ax.set_ylabel(f"simulated {label}")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle("Simulator against the real runs, 2-8 ranks")
        fig.tight_layout()
        made.append(save_figure(fig, args.out + "_validation.png"))
    if proj:
        patterns = sorted({r["pattern"] for r in proj})
        fig, axes = plt.subplots(1, len(patterns), figsize=(4.3 * len(patterns), 3.8), squeeze=False, sharey=True)
        for ax, pattern in zip(axes[0], patterns):
            sizes = sorted({r["P"] for r in proj if r["pattern"] == pattern})
            sync = {p: next(r for r in proj if r["P"] == p and r["pattern"] == pattern and r["mode"] == "sync")
                    for p in sizes}
            for mode in MODES:
                sel = [next(r for r in proj if r["P"] == p and r["pattern"] == pattern and r["mode"] == mode)
                       for p in sizes]
                ax.plot(sizes, [r["posts_per_s"] / sync[r["P"]]["posts_per_s"] for r in sel], "o-",
                        color=colors[mode], label=MODE_LABELS[mode])
            solo = [next(r for r in proj if r["P"] == p and r["pattern"] == pattern and r["mode"] == "solo")
                    for p in sizes]
            ax.plot(sizes, [r["free_posts_per_s"] / sync[r["P"]]["free_posts_per_s"] for r in solo], ":",
                    color=colors["solo"], label="solo, free communication")
            ax.axhline(1.29, color="tab:red", lw=0.8, ls="--", label="paper: 1.29x (64 GPUs)")
            ax.set_xscale("log", base=2)
            ax.set_title(pattern)
            ax.set_xlabel("ranks")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("throughput / sync (posts/s)")
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"Projected speedup over sync ({args.step_ms:g} ms steps, {args.delay_ms:g} ms delays, "
                     f"{args.nbytes >> 10} KiB gradient, model fitted on this machine)")
        fig.tight_layout()
        made.append(save_figure(fig, args.out + "_projection.png"))
    return made


# ===== main =======================================================================================

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrate-worker", nargs=4, metavar=("OUT", "ITERS", "GAP", "BYTES"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="2,4,8", help="world sizes of the calibration")
    parser.add_argument("--iters", type=int, default=20, help="calibration samples per point")
    parser.add_argument("--gap-ms", type=float, default=15.0, help="spacing of the activation samples")
    parser.add_argument("--skip-calibration", action="store_true", help="reuse the fitted model (--network)")
    parser.add_argument("--network", default=os.path.join(RESULTS, "paper_scale_network.json"),
                        help="where the calibration and fitted model are written / read")
    parser.add_argument("--throughput", default=os.path.join(RESULTS, "paper_throughput.json"),
                        help="experiment 1's results to validate against")
    parser.add_argument("--proj-sizes", default="8,16,64,256,1024")
    parser.add_argument("--proj-steps", type=int, default=30)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--delay-ms", type=float, default=100.0)
    parser.add_argument("--nbytes", type=int, default=1 << 20)
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="paper_scale")
    parser.add_argument("--replot", action="store_true", help="only redraw the plots from results/<out>.json")
    parser.add_argument("--control-plane", choices=("central", "decentral", "both"), default="decentral",
                        help="the control plane of the projection (3)")
    parser.add_argument("--planes", action="store_true", help="also compare the control planes side by side (4)")
    parser.add_argument("--planes-only", action="store_true",
                        help="only the side-by-side comparison (4): no validation, no projection")
    parser.add_argument("--planes-sizes", default="256,1024,4096")
    parser.add_argument("--planes-detail", type=int, default=1024,
                        help="the size at which balanced and P/32 slow ranks per step are compared too")
    parser.add_argument("--planes-steps", default="256:30,1024:30,4096:10",
                        help="steps per rank of the comparison, per size (others: --proj-steps)")
    parser.add_argument("--calibrate-view", action="store_true",
                        help="only time the decentralized plane's per-round view in-process and write the network "
                             "file with it (to results/new/ when --network is a published file)")
    parser.add_argument("--planes-free", choices=("all", "none"), default="all",
                        help="none: skip the free-communication runs of the comparison (slow at 4,096 ranks)")
    parser.add_argument("--planes-compared", default=",".join(PLANES),
                        help="the control planes the comparison runs (comma-separated; a plane left out shows "
                             "'not run')")
    parser.add_argument("--activation-delay-us", type=float, default=Config().activation_delay_us,
                        help="the decentralized plane's activation delay in the simulation (the engine's default; "
                             "0: every flood at once)")
    args = parser.parse_args(argv)
    if args.calibrate_worker:
        out, iters, gap, host_bytes = args.calibrate_worker
        calibrate_worker(out, int(iters), float(gap), int(host_bytes))
        return
    if args.replot:
        with open(os.path.join(RESULTS, args.out + ".json")) as fh:
            saved = json.load(fh)
        shown = [r for r in saved["projection"] if r.get("control_plane", "central") == "central"] or saved["projection"]
        for path in plots(saved["validation"], shown, argparse.Namespace(**{**saved["args"], "out": args.out})):
            print("wrote", os.path.relpath(path, ROOT))
        return
    if args.quick:
        args.iters, args.proj_sizes, args.proj_steps = 5, "8,64", 10
        args.planes_sizes, args.planes_detail, args.planes_steps = "64,128", 128, "64:10,128:10"
        if args.out == "paper_scale":
            args.out = "paper_scale_quick"
    if args.planes_only:
        args.planes = True
        if args.out in ("paper_scale", "paper_scale_quick"):
            args.out += "_planes"
        if not args.skip_calibration:
            args.network = os.path.join(RESULTS, "paper_scale_quick_network.json")
    if args.calibrate_view:
        path = args.network
        with open(path) as fh:
            calibration = json.load(fh)
        with_view_cost(calibration, again=True)
        if os.path.dirname(os.path.abspath(path)) == RESULTS:
            path = new_result_path(os.path.basename(path))  # never over a published file
        with open(path, "w") as fh:
            json.dump(calibration, fh, indent=1)
        print("wrote", os.path.relpath(path, ROOT))
        return
    os.makedirs(RESULTS, exist_ok=True)
    info = machine()
    started = time.time()
    net_path = args.network
    if args.skip_calibration:
        with open(net_path) as fh:
            calibration = json.load(fh)
    else:
        calibration = calibrate([int(x) for x in args.sizes.split(",")], args.iters, args.gap_ms / 1000, args.timeout,
                                args.nbytes)
        calibration["machine"] = info
        if os.path.dirname(os.path.abspath(net_path)) == RESULTS:
            net_path = new_result_path(os.path.basename(net_path))  # never over a published file
        with open(net_path, "w") as fh:
            json.dump(calibration, fh, indent=1)
    planes = list(PLANES) if args.control_plane == "both" else [args.control_plane]
    if "decentral" in planes or args.planes:
        net = with_view_cost(calibration)
    else:
        net = NetworkModel.from_dict(calibration["network"])
    print("network model:", json.dumps(net.to_dict(), indent=1))

    val, summary, proj, comparison = [], None, [], []
    if args.planes_only:
        pass
    elif os.path.exists(args.throughput):
        with open(args.throughput) as fh:
            exp1 = json.load(fh)
        rows = [r for r in exp1["rows"] if 2 <= r["P"] <= 8]
        print(f"validating against {len(rows)} cases of {os.path.relpath(args.throughput, ROOT)} ...", flush=True)
        # Experiment 1's runs say which control plane their engine ran (files from before it existed: central).
        val = validate(rows, calibration, exp1.get("machine", {}).get("control_plane", "central"),
                       args.activation_delay_us)
        summary = validation_summary(val)
    else:
        print(f"no {args.throughput}: run benchmarks/paper_throughput.py first; skipping the validation")
    if not args.planes_only:
        for plane in planes:
            print(f"projecting ({plane} control plane) ...", flush=True)
            proj += project(args, net, plane)
    if args.planes:
        print("comparing the control planes ...", flush=True)
        comparison = compare_planes(args, net)
    info["loadavg_at_end"] = os.getloadavg()
    info["wall_seconds"] = time.time() - started

    command = "python benchmarks/paper_scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"Command: `{command.strip()}`  ",
             f"Machine: {info['cores']} cores, {info['mpi']}; load average {info['loadavg_at_start'][0]:.2f} at start, "
             f"{info['loadavg_at_end'][0]:.2f} at end; wall time {info['wall_seconds']:.0f} s.", "",
             "### Network model fitted on this machine", "",
             "| constant | value |", "|---|---:|"]
    for key, value in net.to_dict().items():
        if key != "source":
            lines.append(f"| {key} | {value:.3g} |")
    if "view" in calibration.get("local", {}):
        view = calibration["local"]["view"]
        lines += ["", "view_per_rank_s: the decentralized plane's work per round and rank "
                  "(`DecentralStream.read_facts` and `on_reduced`: the round's results and the next round's view "
                  "from the (4, P) facts), timed in-process; ms per round: "
                  + ", ".join(f"P={x['P']} {'balanced' if x['balanced'] else '1 slow'} {x['seconds_per_round'] * 1e3:.3f}"
                              for x in view["samples"])
                  + f"; fit {view['intercept_s'] * 1e6:.1f} us + {view['view_per_rank_s'] * 1e9:.1f} ns x P "
                  "(the intercept is priced as one event's handling, coordinator_s)."]
    lines += ["", "Calibration points (measured / model, ms):", "",
              "| what | P | bytes | poster | measured | model |", "|---|---:|---:|---:|---:|---:|"]
    for kind in ("reduce", "activation") if "residuals" in calibration else ():
        for r in calibration["residuals"][kind]:
            lines.append(f"| {kind} | {r['P']} | {r['nbytes']} | {r.get('poster', '-')} | {r['measured'] * 1e3:.2f} | "
                         f"{r['model'] * 1e3:.2f} |")
    if val:
        s = summary
        lines += ["", "### Validation against experiment 1 (2-8 ranks)", "",
                  f"posts/s: median |error| {s['posts_per_s']['median_abs_error']:.1%}, max {s['posts_per_s']['max_abs_error']:.1%}, "
                  f"{s['posts_per_s']['within_tolerance']}/{s['posts_per_s']['cases']} cases within 15% "
                  f"(free-communication replay: median {s['replay_posts_per_s']['median_abs_error']:.1%}, "
                  f"{s['replay_posts_per_s']['within_tolerance']}/{s['replay_posts_per_s']['cases']} within 15%).  ",
                  f"rounds/s: median |error| {s['rounds_per_s']['median_abs_error']:.1%}, max {s['rounds_per_s']['max_abs_error']:.1%}, "
                  f"{s['rounds_per_s']['within_tolerance']}/{s['rounds_per_s']['cases']} within 15% "
                  f"(replay: median {s['replay_rounds_per_s']['median_abs_error']:.1%}, "
                  f"{s['replay_rounds_per_s']['within_tolerance']}/{s['replay_rounds_per_s']['cases']} within 15%).", "",
                  validation_table(val)]
    for plane in planes if proj else ():
        lines += ["", f"### Projection ({args.proj_steps} steps per rank of {args.step_ms:g} ms, delays {args.delay_ms:g} ms, "
                  f"gradient {args.nbytes >> 10} KiB, max_staleness={args.max_staleness}, {plane} control plane"
                  + (f", activation delay {args.activation_delay_us:g} us" if plane == "decentral" else "") + ")", "",
                  "Throughput ratio to sync (posts/s, same work per rank). 'free communication' = solo over sync, both "
                  "replayed with free communication (the protocol's ceiling); 'coordinator busy' = fraction of the run "
                  "rank 0's engine spends serving its control policy (saturated: the coordinator is the bottleneck).", "",
                  projection_table([r for r in proj if r["control_plane"] == plane], args)]
    if comparison:
        lines += ["", f"### The control planes side by side ({args.step_ms:g} ms steps, delays {args.delay_ms:g} ms, "
                  f"gradient {args.nbytes >> 10} KiB, max_staleness={args.max_staleness}, decentral activation delay "
                  f"{args.activation_delay_us:g} us)", "",
                  "Solo over sync (posts/s, same work per rank) with rank 0's coordinator (central) and without it "
                  "(decentral). 'free-communication ceiling' = solo over sync, both with free communication "
                  "(decentral plane; the central one's in brackets where it differs); 'busiest engine' = the largest "
                  "fraction of the run one rank's engine spends serving its control policy for rounds (rank 0 for "
                  "central); 'after round 0' = the same ratio over the posts after every rank's first and the time "
                  "after the last rank completed round 0 (leaves out the stream's registration and every rank's first "
                  "step).", "",
                  planes_table(comparison), "",
                  "Control messages per rank per round (solo, one slow rank per step, sent plus received, between "
                  "ranks, over the run divided by the rounds started; the flush included, registration and shutdown (once per "
                  "stream) and liveness apart), counted by the simulator:", "",
                  planes_messages_table(comparison)]
    text = "\n".join(lines)
    print(text)
    with open(new_result_path(args.out + ".md"), "w") as fh:
        fh.write(text + "\n")
    with open(new_result_path(args.out + ".json"), "w") as fh:
        json.dump({"command": command.strip(), "args": vars(args), "machine": info, "network": net.to_dict(),
                   "validation": val, "validation_summary": summary, "projection": proj,
                   "planes": comparison}, fh, indent=1)
    shown = [r for r in proj if r["control_plane"] == planes[0]]
    for path in plots(val, shown, args) if (val or shown) else ():
        print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
