"""How many posts each round of the CNN task sums, and how far each applied
round steps, per mode and seed, with ``cap_round_step`` on and off.

Runs the CNN task of ``paper_accuracy.py`` (same data, model, injected
delays and hyperparameters) and records, on rank 0, every applied round's
number of posts (from its carried count) and the norm of the gradient it
applies, and rank 0's test accuracy after every step (copies of its replica,
evaluated at each epoch's end, off the clock). Prints per run: the rounds,
how many summed more posts than the world has ranks, the 95th percentile and
maximum update norm, the final accuracy, the first epoch at the target and
the largest fall of accuracy after the run first passed 85%.

    python benchmarks/piled_rounds.py                         # majority and solo, seeds 0-9, capped and not
    python benchmarks/piled_rounds.py --modes majority --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def worker(out: str, modes: list[str], seeds: list[int], argv: list[str]) -> None:
    import torch

    import hvd_partial.torch as hvd
    import paper_accuracy as pa
    from hvd_partial.core.carried_values import posts_in
    from paper_throughput import mode_for

    args = pa.parse_args(["--tasks", "cnn", *argv])
    rank, size = pa.start_ranks()
    runs = []
    for seed in seeds:
        task = pa.Task("cnn", seed, args, size)
        for mode in modes:
            model = task.model()
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=task.lr, momentum=args.momentum),
                                           named_parameters=model.named_parameters(),
                                           mode=mode_for(mode, size, seed), max_staleness=args.max_staleness,
                                           name=f"piled-{mode}-{seed}")
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            rounds: list[dict] = []
            load = opt._grads.load

            def recording_load(result, ctxs, scale=1.0, load=load, rounds=rounds):
                rounds.append({"posts": posts_in(result.arrays[-1], result.world_size)})
                load(result, ctxs, scale)

            opt._grads.load = recording_load

            def norm(optimizer, a, k, rounds=rounds, model=model):
                rounds[-1]["norm"] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))

            opt.register_step_pre_hook(norm)
            evals, step, scratch = [], 0, task.model()
            for epoch in range(args.epochs):
                hvd.barrier()
                copies = []
                for i, batch in enumerate(task.batches(epoch, rank), 1):
                    time.sleep(task.device_seconds(rank, step, batch))
                    step += 1
                    opt.zero_grad()
                    task.loss(model, batch).backward()
                    opt.step()
                    if rank == 0:
                        copies.append((epoch + i / task.steps_per_epoch,
                                       {k: v.detach().clone() for k, v in model.state_dict().items()}))
                opt.flush()
                for at, params in copies:
                    scratch.load_state_dict(params)
                    evals.append((at, task.accuracy(scratch)))
            opt.close()
            applied = [r for r in rounds if "norm" in r]
            runs.append({"mode": mode, "seed": seed, "rounds": applied, "evals": evals})
    if rank == 0:
        Path(out).write_text(json.dumps(runs))
    hvd.shutdown()


def summary(runs: list[dict], world: int, target: float) -> list[str]:
    lines = []
    for r in runs:
        norms = sorted(x["norm"] for x in r["rounds"])
        piled = sum(1 for x in r["rounds"] if x["posts"] > world)
        reach = next((at for at, acc in r["evals"] if acc >= target), None)
        best, fall = 0.0, 0.0
        for _, acc in r["evals"]:
            if best > 0.85:
                fall = max(fall, best - acc)
            best = max(best, acc)
        lines.append(f"| {r['cap']} | {r['mode']} | {r['seed']} | {len(norms)} | {piled} | "
                     f"{max(x['posts'] for x in r['rounds'])} | {norms[int(0.95 * len(norms))]:.2f} | {norms[-1]:.2f} | "
                     f"{100 * r['evals'][-1][1]:.1f} | {'-' if reach is None else f'{reach:.2f}'} | {100 * fall:.0f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--modes", default="majority,solo")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        out, modes, seeds = args.worker
        worker(out, modes.split(","), [int(s) for s in seeds.split(",")], rest)
        return
    from paper_accuracy import parse_args

    target = parse_args([]).cnn_target
    header = ["| cap_round_step | mode | seed | rounds applied | rounds > P posts | most posts | update norm p95 | "
              "max | final accuracy | epoch at target | largest fall after 85% (points) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for cap in ("1", "0"):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "runs.json")
            cmd = ["mpiexec", "-n", str(args.np), sys.executable, __file__, "--worker", out, args.modes,
                   ",".join(map(str, range(args.seeds))), *rest]
            env = dict(os.environ, HVD_PARTIAL_CAP_ROUND_STEP=cap, PYTHONPATH=f"{HERE.parent}:{HERE}")
            subprocess.run(cmd, env=env, check=True, timeout=args.timeout)
            runs = json.loads(Path(out).read_text())
        for r in runs:
            r["cap"] = "on" if cap == "1" else "off"
        rows += summary(runs, args.np, target)
        for mode in args.modes.split(","):
            sel = [r for r in runs if r["mode"] == mode]
            reached = sum(1 for r in sel if any(acc >= target for _, acc in r["evals"]))
            finals = [100 * r["evals"][-1][1] for r in sel]
            rows.append(f"| {'on' if cap == '1' else 'off'} | **{mode}: all** | | | | | | | mean {sum(finals) / len(finals):.1f}, "
                        f"min {min(finals):.1f} | reached {reached}/{len(sel)} | |")
    print("\n".join(header + rows))


if __name__ == "__main__":
    main()
