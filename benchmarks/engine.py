"""Engine benchmark: run with ``mpiexec -n 4 python benchmarks/engine.py``.

(a) Balanced load: time per call of Sync, Solo and Majority (op=Sum) against a
    bare mpi4py ``Allreduce`` on the same buffers (4 B, 64 KiB, 1 MiB, 16 MiB). The
    bare calls run with no engine (before ``init``); the engine modes are
    interleaved in rotating order, and each figure is the median of many
    samples gathered over several alternating blocks.
(c) Balanced training steps (the design's "step time", docs/design.md §8): every rank computes
    the same CPU work (matrix products, about 10 ms with every rank computing
    at once), then reduces a gradient: one array, or 16 arrays as one grouped
    post (what the framework adapters send; bare: packed into one buffer and
    reduced in place, as Horovod's fusion buffer is). Median step time of bare ``Allreduce`` (no engine),
    sync, solo and majority, interleaved like (a). Here the engine's cost is
    what it takes from a step: its hand-over, and the CPU it uses while the
    training thread computes. Each stream first runs --warmup-steps unmeasured
    steps (the bare loop too): a training run posts a stream thousands of
    times, and its first posts fill the stream's buffer pools; on this
    project's VM the call that first writes a new 16 MiB buffer took 70-140 ms
    (solo needs some only when a rank first sends zeros, at a random step),
    which would otherwise dominate a dozen measured steps.
(b) Injected imbalance: every step takes 20 ms of work (a sleep) and one
    random rank per step (the same on every rank) sleeps 100 ms more. Rounds
    per second of sync, solo and majority, beside the naive ideal (one round
    per step) and a zero-overhead replay of the same schedule through the same
    protocol code with free communication.

Prints one table (rank 0) and writes it to benchmarks/results/new/engine.json (git ignores it; copy
it over benchmarks/results/engine.json to publish).
"""

from __future__ import annotations

import os

# One BLAS thread per rank: (c) computes on ranks that already share the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import platform
import statistics
import time

import numpy as np
from mpi4py import MPI

import hvd_partial as hvd
from hvd_partial.sim import replay, sleeper_schedule

# (c): label, float32 elements in all, arrays they are split into (several: one grouped post)
STEP_SIZES = [("64 KiB", 16 * 1024, 1), ("1 MiB", 256 * 1024, 1), ("16 MiB", 4 * 1024 * 1024, 1),
              ("16x1 MiB", 4 * 1024 * 1024, 16)]
SIZES = [("4 B", 1), ("64 KiB", 16 * 1024), ("1 MiB", 256 * 1024), ("16 MiB", 4 * 1024 * 1024)]
MODES = {"sync": hvd.Sync(), "solo": hvd.Solo(), "majority": hvd.Majority(seed=0)}


def iterations_for(n: int) -> int:
    return 200 if n <= 16 * 1024 else (40 if n <= 256 * 1024 else 8)


def bare_block(comm, buffers, samples, warmup):
    for label, n in SIZES:
        x, y = buffers[n]
        comm.Barrier()
        for i in range(iterations_for(n) + warmup):
            t = time.perf_counter()
            comm.Allreduce(x, y, op=MPI.SUM)
            if i >= warmup:
                samples[("bare", label)].append(time.perf_counter() - t)


def engine_block(block, buffers, samples, warmup):
    order = list(MODES)
    for label, n in SIZES:
        x, _ = buffers[n]
        hvd.barrier()
        rotation = order[block % 3:] + order[:block % 3]
        for mode_name in rotation:
            name = f"{mode_name}-{n}"
            for i in range(iterations_for(n) + warmup):
                t = time.perf_counter()
                # op=Sum: the same arithmetic as the bare Allreduce (Average adds a division)
                hvd.partial_allreduce(x, name, mode=MODES[mode_name], op=hvd.Sum)
                if i >= warmup:  # round 0 registers the stream; the next ones fill its buffer pools
                    samples[(mode_name, label)].append(time.perf_counter() - t)
            hvd.flush(name)
            hvd.barrier()


def balanced(blocks: int, warmup: int):
    comm = MPI.COMM_WORLD
    buffers = {n: (np.random.default_rng(n).random(n, dtype=np.float32), np.empty(n, np.float32))
               for _, n in SIZES}
    samples = {(m, label): [] for m in ["bare", *MODES] for label, _ in SIZES}
    for block in range(blocks):
        bare_block(comm, buffers, samples, warmup)  # no engine running
        hvd.init()
        engine_block(block, buffers, samples, warmup)
        hvd.shutdown()
    # the median over every rank's samples
    gathered = comm.gather({k: v for k, v in samples.items()}, root=0)
    if comm.Get_rank() != 0:
        return None
    table = {}
    for key in samples:
        values = [v for rank_samples in gathered for v in rank_samples[key]]
        table[f"{key[0]}|{key[1]}"] = statistics.median(values)
    return table


class Work:
    """The compute of one training step: ``reps`` products of a 128x128 matrix,
    the same count on every rank, calibrated to take ``seconds`` while every
    rank computes at once (the median rank's estimate)."""

    def __init__(self, comm, seconds: float):
        self.a = np.random.default_rng(1).random((128, 128))
        t = time.perf_counter()
        for _ in range(50):
            self.a @ self.a
        per = (time.perf_counter() - t) / 50
        self.reps = max(1, int(statistics.median(comm.allgather(seconds / per))))

    def __call__(self):
        for _ in range(self.reps):
            self.a @ self.a


def step_samples(step_ms: float, blocks: int, steps: int, warmup: int):
    comm = MPI.COMM_WORLD
    work = Work(comm, step_ms / 1000)
    grads = {label: np.split(np.random.default_rng(n).random(n, dtype=np.float32), parts)
             for label, n, parts in STEP_SIZES}
    out = {label: np.empty(n, np.float32) for label, n, _ in STEP_SIZES}

    def bare(label):
        if len(grads[label]) == 1:
            comm.Allreduce(grads[label][0], out[label], op=MPI.SUM)
        else:
            np.concatenate(grads[label], out=out[label])
            comm.Allreduce(MPI.IN_PLACE, out[label], op=MPI.SUM)

    def post(label, name, mode):
        if len(grads[label]) == 1:
            hvd.partial_allreduce(grads[label][0], name, mode=mode, op=hvd.Sum)
        else:
            hvd.synchronize(hvd.grouped_partial_allreduce_async(grads[label], name, mode=mode, op=hvd.Sum))

    samples = {(m, label): [] for m in ["bare", *MODES] for label, _, _ in STEP_SIZES}
    for block in range(blocks):
        for label, _, _ in STEP_SIZES:  # no engine running
            comm.Barrier()
            for i in range(warmup + steps):
                t = time.perf_counter()
                work()
                bare(label)
                if i >= warmup:
                    samples[("bare", label)].append(time.perf_counter() - t)
        hvd.init()
        order = list(MODES)
        for label, _, _ in STEP_SIZES:
            for mode_name in order[block % 3:] + order[:block % 3]:
                name = f"step-{mode_name}-{label}"
                hvd.barrier()
                for i in range(warmup + steps):
                    t = time.perf_counter()
                    work()
                    post(label, name, MODES[mode_name])
                    if i >= warmup:
                        samples[(mode_name, label)].append(time.perf_counter() - t)
                hvd.flush(name)
        hvd.shutdown()
    gathered = comm.gather(samples, root=0)
    if comm.Get_rank() != 0:
        return None
    table = {f"{k[0]}|{k[1]}": statistics.median(v for r in gathered for v in r[k]) for k in samples}
    table["reps"] = work.reps
    return table


def imbalance(steps: int, step_s: float, delay_s: float, seed: int, tau: int, nbytes: int):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    compute = sleeper_schedule(size, step_s, delay_s, seed)
    grad = np.ones(nbytes // 4, np.float32)
    out = {}
    for mode_name, mode in MODES.items():
        name = f"imbalance-{mode_name}-{nbytes}"
        hvd.barrier()
        start = time.perf_counter()
        last_round = -1
        for step in range(steps):
            time.sleep(compute(rank, step))
            last_round = hvd.partial_allreduce(grad, name, mode=mode, max_staleness=tau)[-1].round
        finish = time.perf_counter() - start
        # rounds completed while this rank was still flushing count too
        last_round = max([last_round] + [r.round for r in hvd.flush(name) if not r.flush])
        finishes = hvd.allgather_object((finish, last_round))
        seconds = max(f for f, _ in finishes)
        rounds = max(r for _, r in finishes) + 1
        out[mode_name] = {"rounds": rounds, "seconds": seconds, "rounds_per_second": rounds / seconds,
                          "stats": hvd.stats()[name]}
        sim = replay(size, mode, 0 if mode_name == "sync" else tau, steps, compute)
        out[mode_name]["replay_rounds_per_second"] = sim.rounds_per_second
    hvd.shutdown()
    return out if rank == 0 else None


def _ratio_row(table: dict, label: str, digits: int) -> str:
    """One row of (a) or (c): the medians in ms of bare and each mode, then their ratios."""
    b, s, so, m = (table[f"{k}|{label}"] * 1e3 for k in ("bare", "sync", "solo", "majority"))
    return (f"{label:>8} {b:9.{digits}f} {s:9.{digits}f} {so:9.{digits}f} {m:9.{digits}f} "
            f"{s / b:10.2f} {so / s:10.2f} {m / s:9.2f}")


def _human(nbytes: int) -> str:
    return f"{nbytes // (1024 * 1024)} MiB" if nbytes >= 1024 * 1024 else f"{nbytes // 1024} KiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=5, help="alternating bare/engine blocks for (a)")
    parser.add_argument("--steps", type=int, default=100, help="steps per rank for (b)")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--delay-ms", type=float, default=100.0)
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--imbalance-bytes", default="65536,1048576",
                        help="gradient sizes for (b), comma-separated")
    parser.add_argument("--warmup-calls", type=int, default=10,
                        help="unmeasured calls per size and block in (a), bare and modes alike")
    parser.add_argument("--skip-balanced", action="store_true")
    parser.add_argument("--work-ms", type=float, default=10.0, help="compute per step in (c), all ranks computing at once")
    parser.add_argument("--step-blocks", type=int, default=4, help="alternating bare/engine blocks for (c)")
    parser.add_argument("--step-count", type=int, default=12, help="steps per mode, size and block in (c)")
    parser.add_argument("--warmup-steps", type=int, default=30,
                        help="unmeasured steps per stream (and bare loop) in (c) before the measured ones")
    parser.add_argument("--skip-steps", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    table = None if args.skip_balanced else balanced(args.blocks, max(1, args.warmup_calls))
    steps = None if args.skip_steps else step_samples(args.work_ms, args.step_blocks, args.step_count,
                                                      max(1, args.warmup_steps))
    imbs = {int(b): imbalance(args.steps, args.step_ms / 1000, args.delay_ms / 1000, args.seed, args.max_staleness,
                              int(b)) for b in args.imbalance_bytes.split(",")}
    if comm.Get_rank() != 0:
        return
    size = comm.Get_size()
    lines = [f"hvd_partial engine benchmark: {size} ranks, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
             f"{MPI.Get_library_version().splitlines()[0].strip()}"]
    if table:
        lines.append("")
        lines.append(f"(a) balanced: median time per call (ms) and ratios, after {max(1, args.warmup_calls)} unmeasured calls per size")
        lines.append(f"{'size':>8} {'bare':>9} {'sync':>9} {'solo':>9} {'majority':>9} "
                     f"{'sync/bare':>10} {'solo/sync':>10} {'maj/sync':>9}")
        lines += [_ratio_row(table, label, 3) for label, _ in SIZES]
    if steps:
        lines.append("")
        lines.append(f"(c) balanced steps: {args.work_ms:g} ms of compute ({steps['reps']} products of 128x128 "
                     f"matrices, all ranks at once), then one reduction; median step time (ms) and ratios, "
                     f"after {max(1, args.warmup_steps)} unmeasured steps per stream")
        lines.append(f"{'gradient':>8} {'bare':>9} {'sync':>9} {'solo':>9} {'majority':>9} "
                     f"{'sync/bare':>10} {'solo/sync':>10} {'maj/sync':>9}")
        lines += [_ratio_row(steps, label, 2) for label, _, _ in STEP_SIZES]
    lines.append("")
    ideal = 1000.0 / args.step_ms
    lines.append(f"(b) imbalance: {args.steps} steps of {args.step_ms:g} ms, one random rank per step sleeps "
                 f"{args.delay_ms:g} ms more; max_staleness={args.max_staleness}")
    lines.append(f"{'gradient':>8} {'mode':>9} {'rounds':>7} {'seconds':>8} {'rounds/s':>9} {'replay':>8} "
                 f"{'/replay':>8} {'/sync':>6} {'/ideal':>7}")
    for nbytes, imb in imbs.items():
        sync_rps = imb["sync"]["rounds_per_second"]
        for mode_name, row in imb.items():
            rps = row["rounds_per_second"]
            lines.append(f"{_human(nbytes):>8} {mode_name:>9} {row['rounds']:7d} {row['seconds']:8.2f} {rps:9.1f} "
                         f"{row['replay_rounds_per_second']:8.1f} {rps / row['replay_rounds_per_second']:8.2f} "
                         f"{rps / sync_rps:6.2f} {rps / ideal:7.2f}")
    lines.append(f"naive ideal: {ideal:.1f} rounds/s (one round per step); the paper reports 1.29x over sync "
                 "for ResNet-50 on 64 GPUs")
    text = "\n".join(lines)
    print(text, flush=True)
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from result_files import new_result_path

    with open(new_result_path("engine.json"), "w") as fh:
        json.dump({"balanced_seconds": table, "step_seconds": steps, "imbalance": {str(k): v for k, v in imbs.items()}, "args": vars(args), "table": text}, fh, indent=1,
                  default=float)


if __name__ == "__main__":
    main()
