"""Why the partial modes lose accuracy on the CNN task: a deterministic replay.

``paper_accuracy.py`` runs the CNN task under MPI, where the machine's timing
decides which posts each round sums, so no two runs are alike and a cause
cannot be isolated. This replays the same task in one process, in two passes:

1. **The rounds.** Every rank runs the protocol driver the engine runs, in the
   loopback world (``hvd_partial.sim.loopback``), on a simulated clock where
   communication is free and each step takes the task's device time (the
   same seeded delay schedule) plus ``--compute-ms`` and up to ``--jitter-ms``
   more, drawn per step (the machine's noise; ``--draws`` runs per seed, each
   with its own draw: sync's rounds do not depend on it); an epoch ends with a
   flush on every rank, as in the benchmark. Each post carries a one-hot
   vector of its own number, so each round's sum says exactly which posts it
   holds; each post also records the version of the replica (the rounds its
   rank had applied) its gradient was computed on.
2. **The training.** The rounds are applied in order by SGD with momentum, as
   the optimizer does (a round's gradients summed and divided by the world
   size, ``cap_round_step`` applied; a round without posts is not a step),
   the gradients computed on the CNN from the rounds' posts under a rule:

   - ``as-run``: each gradient on the replica its rank had (the staleness the
     protocol gave it): what the real runs do;
   - ``fresh``: each gradient on the replica just before its round is
     applied: the same rounds without staleness;
   - ``fresh-late``: fresh where the post is 2 or more rounds late, as run
     elsewhere; ``fresh-next``: fresh where it is 1 round late (which of the
     stale posts do the harm);
   - ``damped``: as run, each gradient divided by 1 plus its staleness (the
     staleness-aware rate of Zhang et al., 2016);
   - ``compensated``: as run, each late gradient g corrected to
     g + lambda g*g*(w_now - w_then) for the rounds it missed (the delay
     compensation of Zheng et al., 2017, DC-ASGD; ``--dc-lambda``);
   - ``sync``: the protocol in Sync mode (every round holds every rank's post
     of one step): DDP's arithmetic.

The accuracy is rank 0's replica's, evaluated every ``--eval-every`` of its
steps and at every epoch's end, as in ``paper_accuracy.py``; the time is the
simulated clock's. Prints, per run, the final accuracy, the largest fall after
first passing 85% and the staleness of the posts, then a table per mode and
rule with the spread of each seed's final accuracy over the draws and the time
to ``--cnn-target`` over sync's.

    python benchmarks/stale_replay.py                       # solo and majority, seeds 0-4, 4 timing draws each (~3 min)
    python benchmarks/stale_replay.py --max-staleness 2 --rules as-run --out stale_replay_tau2
    python benchmarks/stale_replay.py --modes solo --rules damped --decay-at 6 --momentum 0.7

Options it does not know go to ``paper_accuracy.py``'s parser (``--momentum``,
``--cnn-lr``, ``--max-staleness``, ``--epochs``, ``--delay-ms``...).
Writes results/new/<out>.md and .json.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
from result_files import new_result_path  # noqa: E402

RULES = ("as-run", "fresh", "damped", "compensated", "fresh-late", "fresh-next")


@dataclass
class Post:
    rank: int
    epoch: int
    batch: int  # its index among the rank's batches of the epoch
    version: int  # the rounds its rank had applied when it computed the gradient


@dataclass
class Schedule:
    """What pass 1 gives: the rounds (each a list of post numbers, in the order
    applied), the posts, and rank 0's evaluation points (version, epoch)."""
    rounds: list[list[int]] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    evals: list[tuple[int, float, float]] = field(default_factory=list)  # (version, epoch, seconds)


def protocol_rounds(mode, world_size: int, epochs: int, steps_per_epoch: int, seconds, max_staleness: int,
                    eval_every: int) -> Schedule:
    """Pass 1: the rounds the protocol forms for this schedule of step times."""
    from hvd_partial.core.fusion import Layout
    from hvd_partial.modes import Sum
    from hvd_partial.sim.loopback import STREAM, LoopbackWorld

    total = world_size * epochs * steps_per_epoch
    world = LoopbackWorld(world_size, mode, Sum, max_staleness, Layout.of([np.zeros(total)]))
    out = Schedule()
    versions = [0] * world_size  # rounds with posts each rank has applied
    seen = [0] * world_size  # rounds (with or without posts) each rank has taken
    global_step = [0] * world_size

    def take(j: int) -> None:
        taken = world.ranks[j].taken.get(STREAM, [])
        for result in taken[seen[j]:]:
            if not result.has_data:
                continue
            ids = np.flatnonzero(result.array if result.arrays is None else result.arrays[0]).tolist()
            if not ids:
                continue
            if versions[j] == len(out.rounds):
                out.rounds.append(ids)
            elif out.rounds[versions[j]] != ids:  # pragma: no cover - the protocol's consistency
                raise RuntimeError(f"rank {j} took another round {versions[j]} than rank 0")
            versions[j] += 1
        seen[j] = len(taken)

    now = 0.0
    for epoch in range(epochs):
        done = [0] * world_size
        events: list[tuple[float, int]] = []
        started_on = [0] * world_size
        for j in range(world_size):
            started_on[j] = versions[j]
            heapq.heappush(events, (now + seconds(j, global_step[j]), j))
        waiting, flushing = set(), set()
        while events or waiting:
            if events:
                now, j = heapq.heappop(events)
                vector = np.zeros(total)
                vector[len(out.posts)] = 1.0
                out.posts.append(Post(j, epoch, done[j], started_on[j]))
                done[j] += 1
                global_step[j] += 1
                world.post(j, [vector])
                waiting.add(j)
            world.run_communication()
            for k in sorted(waiting):
                if not world.idle(k):
                    continue
                waiting.discard(k)
                take(k)
                if k == 0 and eval_every and done[0] % eval_every == 0 and done[0] < steps_per_epoch:
                    out.evals.append((versions[0], epoch + done[0] / steps_per_epoch, now))
                if done[k] < steps_per_epoch:
                    started_on[k] = versions[k]
                    heapq.heappush(events, (now + seconds(k, global_step[k]), k))
                elif k not in flushing:  # its epoch's flush, as each rank of the benchmark does
                    flushing.add(k)
                    world.flush(k)
                    waiting.add(k)
            if not events and waiting:
                world.run_communication()
                if all(not world.idle(k) for k in waiting):  # pragma: no cover - a protocol bug
                    raise RuntimeError("the replay stalled: posts or flushes that never return")
        if len(set(versions)) != 1:  # pragma: no cover
            raise RuntimeError(f"replicas differ after the flush: {versions}")
        out.evals.append((versions[0], epoch + 1.0, now))
    summed = sorted(i for ids in out.rounds for i in ids)
    if summed != list(range(len(out.posts))):  # pragma: no cover - the protocol's conservation
        raise RuntimeError("a post is in no round or in several")
    return out


def train(task, schedule: Schedule, rule: str, args, world_size: int) -> dict:
    """Pass 2: apply the rounds to the CNN under ``rule``; rank 0's accuracy at its evaluation points."""
    import torch
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    model, scratch = task.model(), task.model()
    opt = torch.optim.SGD(model.parameters(), lr=task.lr, momentum=args.momentum)
    batches = {}

    def batch_of(post: Post):
        key = (post.rank, post.epoch)
        if key not in batches:
            batches[key] = list(task.batches(post.epoch, post.rank))
        return batches[key][post.batch]

    def gradient(vector, post: Post):
        vector_to_parameters(vector, scratch.parameters())
        scratch.zero_grad()
        task.loss(scratch, batch_of(post)).backward()
        return torch.cat([p.grad.reshape(-1) for p in scratch.parameters()])

    versions = [parameters_to_vector(model.parameters()).detach().clone()]
    staleness, norms = [], []
    for k, ids in enumerate(schedule.rounds):
        if args.decay_at is not None:  # a step decay: the rate of the epoch of the round's latest post
            epoch = max(schedule.posts[i].epoch for i in ids)
            for group in opt.param_groups:
                group["lr"] = task.lr * (0.1 if epoch >= args.decay_at else 1.0)
        total = None
        for i in ids:
            post = schedule.posts[i]
            lateness = k - post.version
            at = k if rule == "fresh" or (rule == "fresh-late" and lateness >= 2) or \
                (rule == "fresh-next" and lateness == 1) else post.version
            staleness.append(lateness)
            g = gradient(versions[at], post)
            if rule == "damped":  # a stale gradient weighted down by its staleness (1 / (1 + staleness))
                g = g / (1 + lateness)
            elif rule == "compensated" and at != k:  # delay compensation (DC-ASGD): g + l g*g*(w_k - w_at)
                g = g + args.dc_lambda * g * g * (versions[k] - versions[at])
            total = g if total is None else total + g
        scale = 1.0 / world_size
        if args.cap_round_step and len(ids) > world_size:
            scale = 1.0 / len(ids)
        step = total * scale
        norms.append(float(step.norm()))
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.grad = step[offset:offset + n].reshape(p.shape).clone()
            offset += n
        opt.step()
        versions.append(parameters_to_vector(model.parameters()).detach().clone())
    curve = []
    for version, epoch, seconds in schedule.evals:
        vector_to_parameters(versions[version], scratch.parameters())
        curve.append((epoch, task.accuracy(scratch), seconds))
    return {"curve": curve, "rounds": len(schedule.rounds), "staleness_mean": statistics.fmean(staleness),
            "staleness_max": max(staleness), "stale_share": sum(s > 0 for s in staleness) / len(staleness),
            "norm_max": max(norms), "posts_per_round": len(schedule.posts) / len(schedule.rounds)}


def largest_fall(curve, after: float = 0.85) -> float:
    top, fall, seen = 0.0, 0.0, False
    for _, acc, _ in curve:
        seen = seen or acc >= after
        if seen:
            top = max(top, acc)
            fall = max(fall, top - acc)
    return fall


def time_to(curve, target: float) -> float | None:
    """The simulated seconds at which rank 0's replica first reached ``target``, or None."""
    return next((seconds for _, acc, seconds in curve if acc >= target), None)


def speedup(rows, sync_time) -> str:
    """Sync's time to the target over each run's (runs where both reached it): mean [min, max]."""
    ratios = [sync_time[r["seed"]] / r["to_target"] for r in rows
              if r["to_target"] and sync_time.get(r["seed"])]
    return f"{statistics.fmean(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]" if ratios else "-"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="solo,majority")
    parser.add_argument("--rules", default="as-run,fresh", help=f"of {', '.join(RULES)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--compute-ms", type=float, default=5.0,
                        help="a step's forward and backward, on top of its device time")
    parser.add_argument("--jitter-ms", type=float, default=5.0,
                        help="each step takes up to this much more, drawn per (seed, draw, rank, step)")
    parser.add_argument("--draws", type=int, default=4, help="runs per seed, each with its own jitter")
    parser.add_argument("--dc-lambda", type=float, default=0.5, help="the compensated rule's lambda")
    parser.add_argument("--decay-at", type=int, default=None, metavar="EPOCH",
                        help="the rate times 0.1 for the rounds of epochs EPOCH (from 0) on, every mode")
    parser.add_argument("--no-cap", dest="cap_round_step", action="store_false")
    parser.add_argument("--out", default="stale_replay",
                        help="results/new/<OUT>.md and .json (an absolute path: <OUT>.md and .json)")
    args, rest = parser.parse_known_args(argv)
    import paper_accuracy as pa
    from hvd_partial.modes import Sync
    from hvd_partial.sim import sleeper_schedule
    from paper_throughput import mode_for

    task_args = pa.parse_args(["--tasks", "cnn", *rest])
    args.momentum, args.max_staleness, args.eval_every = task_args.momentum, task_args.max_staleness, \
        task_args.eval_every
    import torch

    torch.set_num_threads(1)
    modes = args.modes.split(",")
    rules = args.rules.split(",")
    rows = []
    began = time.perf_counter()
    for seed in range(args.seed, args.seed + args.seeds):
        task = pa.Task("cnn", seed, task_args, args.np)
        delays = sleeper_schedule(args.np, task_args.step_ms / 1000, task_args.delay_ms / 1000, seed)
        for draw in range(args.draws):
            def seconds(rank, step, delays=delays, draw=draw):
                jitter = 0.0
                if args.jitter_ms:  # the machine's noise: a seeded draw per (seed, draw, rank, step)
                    jitter = np.random.default_rng([seed, draw, rank, step]).random() * args.jitter_ms / 1000
                return delays(rank, step) + args.compute_ms / 1000 + jitter

            # (sync's rounds do not depend on timing: once per seed)
            cases = ([("sync", "sync")] if draw == 0 else []) + [(m, r) for m in modes for r in rules]
            schedules = {}
            for mode, rule in cases:
                if mode not in schedules:
                    schedules[mode] = protocol_rounds(Sync() if mode == "sync" else mode_for(mode, args.np, seed),
                                                      args.np, task_args.epochs, task.steps_per_epoch, seconds,
                                                      args.max_staleness, args.eval_every)
                got = train(task, schedules[mode], "as-run" if mode == "sync" else rule, args, args.np)
                got.update(mode=mode, rule=rule, seed=seed, draw=draw, final=got["curve"][-1][1],
                           fall=largest_fall(got["curve"]), to_target=time_to(got["curve"], task_args.cnn_target))
                rows.append(got)
                print(f"seed {seed} draw {draw} {mode:8s} {rule:6s}: final {got['final'] * 100:5.1f}  largest fall "
                      f"{got['fall'] * 100:4.1f}  rounds {got['rounds']}  posts/round {got['posts_per_round']:.2f}  "
                      f"stale {got['stale_share'] * 100:3.0f}% (mean {got['staleness_mean']:.2f}, max "
                      f"{got['staleness_max']})  max step norm {got['norm_max']:.2f}", flush=True)
    command = " ".join(["python benchmarks/stale_replay.py", *(sys.argv[1:] if argv is None else argv)])
    lines = [f"Command: `{command}`",
             f"({args.np} ranks, {args.seeds} seeds from {args.seed}, momentum {args.momentum}, lr {task_args.cnn_lr}, "
             f"compute {args.compute_ms} ms per step, rate decay at epoch {args.decay_at}, {args.draws} draw(s) of up to {args.jitter_ms} ms more per "
             f"step, cap_round_step {args.cap_round_step}; {time.perf_counter() - began:.0f} s)", "",
             "| mode | rule | final accuracy mean [min, max] | final's spread over draws, per seed (points) | "
             "largest fall after 85% (points) [min, max] | stale posts | mean staleness | rounds | "
             f"reached {task_args.cnn_target:.0%} | time to it over sync's, mean [min, max] |",
             "|---|---|---|---|---|---:|---:|---:|---:|---|"]
    sync_time = {r["seed"]: r["to_target"] for r in rows if r["mode"] == "sync"}
    for mode, rule in [("sync", "sync")] + [(m, r) for m in modes for r in rules]:
        sel = [r for r in rows if r["mode"] == mode and r["rule"] == rule]
        finals = [r["final"] * 100 for r in sel]
        falls = [r["fall"] * 100 for r in sel]
        spreads = []
        for seed in range(args.seed, args.seed + args.seeds):
            mine = [r["final"] * 100 for r in sel if r["seed"] == seed]
            spreads.append(max(mine) - min(mine))
        lines.append(f"| {mode} | {rule} | {statistics.fmean(finals):.1f} [{min(finals):.1f}, {max(finals):.1f}] | "
                     f"{', '.join(format(x, '.1f') for x in spreads) if mode != 'sync' else 'none (timing-free)'} | "
                     f"{statistics.fmean(falls):.0f} [{min(falls):.0f}, {max(falls):.0f}] | "
                     f"{statistics.fmean(r['stale_share'] for r in sel) * 100:.0f}% | "
                     f"{statistics.fmean(r['staleness_mean'] for r in sel):.2f} | "
                     f"{statistics.fmean(r['rounds'] for r in sel):.0f} | "
                     f"{sum(r['to_target'] is not None for r in sel)}/{len(sel)} | {speedup(sel, sync_time)} |")
    table = "\n".join(lines)
    print(table)
    # (an absolute --out is a path without its suffix, for tests)
    base = args.out if Path(args.out).is_absolute() else new_result_path(args.out)
    md = f"{base}.md"
    Path(md).write_text(table + "\n")
    Path(f"{base}.json").write_text(json.dumps(rows))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
