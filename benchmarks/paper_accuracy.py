"""Experiment 2 of the eager-SGD reproduction: time to accuracy on real tasks.

Two tasks, each trained by every mode of ``hvd_partial.torch`` (sync, solo,
majority) and by PyTorch DDP (gloo) in the same ``mpiexec`` job, for several
seeds, modes interleaved in a rotating order:

- **cnn**: a small CNN on scikit-learn's handwritten digits (offline, 1437
  train / 360 test images), SGD with momentum. Injected imbalance, the
  paper's pattern: every step takes ``--step-ms`` of (simulated) device time
  and one random rank per step (the same on every rank) sleeps ``--delay-ms``
  more.
- **lstm**: an LSTM classifying synthetic token sequences (the label is the
  class token that occurs most often) whose lengths are heavy-tailed
  (log-normal, median 10, clipped to 3..64), as video lengths are. The
  imbalance is inherent: a batch costs its real forward/backward plus
  simulated device time proportional to its padded length
  (``--ms-per-token``), so ranks that draw long sequences are slow. With
  ``--lstm-delay-ms`` (default 0) one random rank per step also sleeps that
  much more, the CNN's injected pattern on top of the inherent imbalance.

Device time is a sleep so that P ranks behave like P accelerators on this
2-core machine (a real computation would make the ranks fight over the
cores, which accelerators do not). Every epoch ends with a flush (DDP: a
barrier) after which rank 0 evaluates; within an epoch rank 0 also copies its
replica every ``--eval-every`` steps (no flush: the training goes on as it
would) and evaluates the copies at the epoch's end. Neither the evaluation nor
the copy is counted as training time.

    python benchmarks/paper_accuracy.py                 # 4 ranks, 5 seeds, both tasks (~10 minutes)
    python benchmarks/paper_accuracy.py --np 2 --out paper_accuracy_np2   # 2 ranks (~20 minutes)
    python benchmarks/paper_accuracy.py --quick         # a smoke run

Writes benchmarks/results/new/paper_accuracy.{json,md} and paper_accuracy_*.png (git ignores new/;
copy them over the published files in benchmarks/results/ to publish).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
from result_files import new_result_path  # noqa: E402
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

MODES = ["ddp", "sync", "solo", "majority"]
LABELS = {"ddp": "DDP (gloo)", "sync": "hvd sync", "solo": "hvd solo", "majority": "hvd majority",
          "majority_q": "hvd majority q=P/2"}
PAPER = {"cnn": "1.29x (ResNet-50/ImageNet, 64 GPUs, injected delays)",
         "lstm": "1.27x (LSTM/UCF101, inherent imbalance)"}


# ===== tasks ==================================================================================

def digits_data(seed: int):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, d.target, test_size=0.2, random_state=seed, stratify=d.target)


def cnn_model():
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))


def sequence_data(n: int, seed: int, vocab: int = 10, classes: int = 6, p_signal: float = 0.25,
                  median: float = 10, sigma: float = 0.8, lo: int = 3, hi: int = 64):
    """Token sequences of heavy-tailed length; the label is the class token
    (0..classes-1) that occurs most often (ties are redrawn); the other tokens are noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(np.int64)
    x = np.full((n, hi), classes, np.int64)
    y = np.zeros(n, np.int64)
    for i, length in enumerate(lengths):
        while True:
            label = rng.integers(classes)
            tokens = rng.integers(classes, vocab, length)
            signal = rng.random(length) < p_signal
            drawn = np.where(rng.random(length) < 0.4, label, rng.integers(0, classes, length))
            tokens = np.where(signal, drawn, tokens)
            counts = np.bincount(tokens[tokens < classes], minlength=classes)
            if counts.max() > 0 and (counts == counts.max()).sum() == 1:
                y[i] = counts.argmax()
                x[i, :length] = tokens
                break
    return x, lengths, y


def lstm_model(vocab: int = 10, classes: int = 6, hidden: int = 32):
    import torch.nn as nn

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, 16)
            self.lstm = nn.LSTM(16, hidden, batch_first=True)
            self.out = nn.Linear(hidden, classes)

        def forward(self, x, lengths):
            width = int(lengths.max())
            packed = nn.utils.rnn.pack_padded_sequence(self.embed(x[:, :width]), lengths, batch_first=True,
                                                       enforce_sorted=False)
            _, (h, _) = self.lstm(packed)
            return self.out(h[-1])

    return LSTMClassifier()


class Task:
    """Data, model and per-step device time of one task for one seed."""

    def __init__(self, name: str, seed: int, args, world_size: int):
        import torch

        from hvd_partial.sim import sleeper_schedule

        self.name = name
        self.seed = seed
        if name == "cnn":
            xtr, xte, ytr, yte = digits_data(seed)
            self.train = (torch.tensor(xtr), torch.tensor(ytr))
            self.test = (torch.tensor(xte), torch.tensor(yte))
            self.batch = args.cnn_batch
            self.lr = args.cnn_lr
            self.delays = sleeper_schedule(world_size, args.step_ms / 1000, args.delay_ms / 1000, seed)
        elif name == "lstm":
            x, lengths, y = sequence_data(args.lstm_train + args.lstm_test, seed)
            n = args.lstm_train
            self.train = (torch.tensor(x[:n]), torch.tensor(lengths[:n]), torch.tensor(y[:n]))
            self.test = (torch.tensor(x[n:]), torch.tensor(lengths[n:]), torch.tensor(y[n:]))
            self.batch = args.lstm_batch
            self.lr = args.lstm_lr
            self.ms_per_token = args.ms_per_token
            self.delays = sleeper_schedule(world_size, 0.0, args.lstm_delay_ms / 1000, seed)
        else:
            raise ValueError(name)
        self.world_size = world_size
        self.steps_per_epoch = len(self.train[-1]) // (world_size * self.batch)

    def model(self):
        import torch

        torch.manual_seed(self.seed)
        return cnn_model() if self.name == "cnn" else lstm_model()

    def batches(self, epoch: int, rank: int):
        """This rank's batches of an epoch (its shard of a seeded permutation)."""
        import torch

        g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        perm = torch.randperm(len(self.train[-1]), generator=g)[rank::self.world_size]
        for i in range(self.steps_per_epoch):
            idx = perm[i * self.batch:(i + 1) * self.batch]
            yield tuple(t[idx] for t in self.train)

    def device_seconds(self, rank: int, step: int, batch) -> float:
        if self.name == "cnn":
            return self.delays(rank, step)
        return self.ms_per_token / 1000 * int(batch[1].max()) + self.delays(rank, step)

    def loss(self, model, batch):
        import torch.nn.functional as F

        out = model(batch[0]) if self.name == "cnn" else model(batch[0], batch[1])
        return F.cross_entropy(out, batch[-1])

    def accuracy(self, model) -> float:
        import torch

        with torch.no_grad():
            out = model(self.test[0]) if self.name == "cnn" else model(self.test[0], self.test[1])
            return float((out.argmax(1) == self.test[-1]).float().mean())


# ===== the MPI worker ============================================================================

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checksum(model) -> str:
    import hashlib

    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def train_one(task: Task, mode: str, args, rank: int, size: int) -> dict:
    import torch
    import torch.distributed as dist

    import hvd_partial.torch as hvd
    from paper_throughput import mode_for

    model = task.model()
    inner = torch.optim.SGD(model.parameters(), lr=task.lr, momentum=args.momentum)
    if mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = inner
    else:
        net = model
        opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                       mode=mode_for(mode, size, task.seed), max_staleness=args.max_staleness,
                                       name=f"{task.name}-{mode}-{task.seed}")
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    def updates() -> int:
        return step if mode == "ddp" else opt.updates

    scratch = task.model()
    history, elapsed, step = [], 0.0, 0
    for epoch in range(args.epochs):
        losses, snapshots = [], []
        hvd.barrier()
        start = time.perf_counter()
        for i, batch in enumerate(task.batches(epoch, rank), 1):
            time.sleep(task.device_seconds(rank, step, batch))
            step += 1
            opt.zero_grad()
            loss = task.loss(net, batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if rank == 0 and args.eval_every and i % args.eval_every == 0 and i < task.steps_per_epoch:
                # Rank 0's replica as it stands, without a flush (which would change the training); the
                # copy's time is taken off the clock and the evaluation waits for the epoch's end.
                paused = time.perf_counter()
                params = {k: v.detach().clone() for k, v in model.state_dict().items()}
                snapshots.append((step, elapsed + paused - start, updates(), params))
                start += time.perf_counter() - paused
        if mode == "ddp":
            dist.barrier()
        else:
            opt.flush()
        elapsed += time.perf_counter() - start
        for at_step, seconds, taken, params in snapshots:
            scratch.load_state_dict(params)
            history.append({"epoch": at_step / task.steps_per_epoch, "seconds": seconds, "updates": taken,
                            "accuracy": task.accuracy(scratch), "loss": None})
        acc = task.accuracy(model) if rank == 0 else None
        history.append({"epoch": epoch + 1, "seconds": elapsed, "updates": updates(), "accuracy": acc,
                        "loss": statistics.fmean(losses)})
    sums = hvd.allgather_object(_checksum(model))
    facts = None
    if mode != "ddp":
        stats = opt.stats()
        facts = {"fresh": stats.get("fresh"), "stale": stats.get("stale"),
                 "max_staleness_seen": stats.get("max_staleness_seen")}
        opt.close()
    return {"task": task.name, "mode": mode, "seed": task.seed, "history": history,
            "replicas_identical": len(set(sums)) == 1, "steps_per_epoch": task.steps_per_epoch, "stream": facts}


def start_ranks() -> tuple[int, int]:
    """hvd_partial and a gloo process group for DDP, one torch thread per rank: (rank, size)."""
    import warnings

    import torch
    import torch.distributed as dist

    import hvd_partial.torch as hvd

    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    port = hvd.broadcast_object(_free_port() if rank == 0 else None, root_rank=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    return rank, size


def worker(out_path: str, argv: list[str]):
    import torch.distributed as dist

    import hvd_partial.torch as hvd

    args = parse_args(argv)
    rank, size = start_ranks()
    modes = args.modes.split(",")
    runs = []
    for task_name in args.tasks.split(","):
        for i, seed in enumerate(range(args.seed, args.seed + args.seeds)):
            task = Task(task_name, seed, args, size)
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                t = time.time()
                run = train_one(task, mode, args, rank, size)
                if rank == 0:
                    last = run["history"][-1]
                    print(f"  {task_name} seed {seed} {mode:>10}: accuracy {last['accuracy']:.3f} after "
                          f"{last['seconds']:.1f} s, {last['updates']} updates (wall {time.time() - t:.0f} s)",
                          flush=True)
                runs.append(run)
    dist.destroy_process_group()
    hvd.shutdown()
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(runs, fh)


# ===== summary ====================================================================================

def to_target(history: list[dict], target: float):
    """(seconds, updates, epoch) at the first evaluation reaching ``target``, or None."""
    for h in history:
        if h["accuracy"] >= target:
            return h["seconds"], h["updates"], h["epoch"]
    return None


def summarize(runs: list[dict], args) -> dict:
    out = {}
    targets = {"cnn": args.cnn_target, "lstm": args.lstm_target}
    for task in sorted({r["task"] for r in runs}):
        target = targets[task]
        by_mode = {}
        sync_by_seed = {r["seed"]: r for r in runs if r["task"] == task and r["mode"] == "sync"}
        for mode in [m for m in MODES + ["majority_q"] if any(r["mode"] == m for r in runs)]:
            sel = [r for r in runs if r["task"] == task and r["mode"] == mode]
            finals = [r["history"][-1]["accuracy"] for r in sel]
            reach = [to_target(r["history"], target) for r in sel]
            hit = [x for x in reach if x is not None]
            ddp_by_seed = {r["seed"]: r for r in runs if r["task"] == task and r["mode"] == "ddp"}

            def ratios(reference):
                out = []
                for r, x in zip(sel, reach):
                    ref = reference.get(r["seed"])
                    rx = to_target(ref["history"], target) if ref else None
                    if x is not None and rx is not None:
                        out.append(rx[0] / x[0])
                return out

            speedups, over_ddp = ratios(sync_by_seed), ratios(ddp_by_seed)
            epoch_time = [r["history"][-1]["seconds"] / r["history"][-1]["epoch"] for r in sel]
            ddp_finals = [r["history"][-1]["accuracy"] for r in ddp_by_seed.values()]
            by_mode[mode] = {
                "seeds": len(sel),
                "final_accuracy_mean": statistics.fmean(finals),
                "final_accuracy_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                "final_accuracy_min": min(finals), "final_accuracy_max": max(finals),
                "reached": len(hit),
                "time_to_target_mean": statistics.fmean(x[0] for x in hit) if hit else None,
                "updates_to_target_mean": statistics.fmean(x[1] for x in hit) if hit else None,
                "epochs_to_target_mean": statistics.fmean(x[2] for x in hit) if hit else None,
                "time_to_target_min": min(x[0] for x in hit) if hit else None,
                "time_to_target_max": max(x[0] for x in hit) if hit else None,
                "speedup_to_target_vs_sync": statistics.fmean(speedups) if speedups else None,
                "speedup_to_target_vs_ddp": statistics.fmean(over_ddp) if over_ddp else None,
                "speedup_to_target_vs_ddp_min": min(over_ddp) if over_ddp else None,
                "speedup_to_target_vs_ddp_max": max(over_ddp) if over_ddp else None,
                # accuracy points against DDP: the means, and the worst seeds
                "final_accuracy_vs_ddp_mean": (100 * (statistics.fmean(finals) - statistics.fmean(ddp_finals))
                                               if ddp_finals else None),
                "final_accuracy_vs_ddp_worst": 100 * (min(finals) - min(ddp_finals)) if ddp_finals else None,
                "seconds_per_epoch": statistics.fmean(epoch_time),
                "replicas_identical": all(r["replicas_identical"] for r in sel),
            }
        out[task] = {"target": target, "modes": by_mode}
    return out


def tables(summary: dict, args) -> str:
    lines = []
    for task, s in summary.items():
        lines += [f"### {task}: target test accuracy {s['target']:.2f} ({args.seeds} seeds, {args.epochs} epochs, "
                  f"P = {args.np})", "",
                  "| mode | final accuracy mean ± sd [min, max] | vs DDP: mean / worst seed (points) | reached | "
                  "time to target (s) mean [min, max] | updates to target | epochs to target | s / epoch | "
                  "speedup to target over hvd sync | over DDP mean [min, max] | replicas identical |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for mode, m in s["modes"].items():
            f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
            lines.append(
                f"| {LABELS[mode]} | {m['final_accuracy_mean'] * 100:.1f} ± {m['final_accuracy_std'] * 100:.1f} "
                f"[{m['final_accuracy_min'] * 100:.1f}, {m['final_accuracy_max'] * 100:.1f}] | "
                f"{f(m.get('final_accuracy_vs_ddp_mean'), '+.1f')} / {f(m.get('final_accuracy_vs_ddp_worst'), '+.1f')} | "
                f"{m['reached']}/{m['seeds']} | {f(m['time_to_target_mean'], '.1f')} "
                f"[{f(m.get('time_to_target_min'), '.1f')}, {f(m.get('time_to_target_max'), '.1f')}] | "
                f"{f(m['updates_to_target_mean'], '.0f')} | {f(m['epochs_to_target_mean'], '.1f')} | "
                f"{m['seconds_per_epoch']:.2f} | {f(m['speedup_to_target_vs_sync'], '.2f')}x | "
                f"{f(m['speedup_to_target_vs_ddp'], '.2f')}x [{f(m.get('speedup_to_target_vs_ddp_min'), '.2f')}, "
                f"{f(m.get('speedup_to_target_vs_ddp_max'), '.2f')}] | "
                f"{'yes' if m['replicas_identical'] else 'NO'} |")
        every = getattr(args, "eval_every", 0)
        lines += ["", "Speedups are means over seeds of per-seed time-to-target ratios (seeds where both reached it); "
                  "[min, max] is the spread over seeds. Accuracy is evaluated at every epoch's end (after a flush) "
                  + (f"and every {every} steps of rank 0 within an epoch (rank 0's replica, no flush). "
                     if every else "only. ")
                  + f"The paper: {PAPER[task]}.", ""]
    return "\n".join(lines)


def plots(runs: list[dict], summary: dict, args) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ddp": "black", "sync": "tab:gray", "solo": "tab:blue", "majority": "tab:orange",
              "majority_q": "tab:green"}
    tasks = list(summary)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for mode in summary[task]["modes"]:
            sel = [r for r in runs if r["task"] == task and r["mode"] == mode]
            for i, r in enumerate(sel):
                ax.plot([h["seconds"] for h in r["history"]], [h["accuracy"] for h in r["history"]], "-",
                        color=colors[mode], alpha=0.6, lw=1, label=LABELS[mode] if i == 0 else None)
        ax.axhline(summary[task]["target"], color="tab:red", ls="--", lw=0.8, label="target")
        ax.set_ylim(max(0.0, summary[task]["target"] - 0.25), 1.0)
        ax.set_xlabel("training time (s), evaluation excluded")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{task} (one line per seed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = new_result_path(args.out + "_curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


# ===== main =======================================================================================

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--np", type=int, default=4, help="ranks")
    parser.add_argument("--tasks", default="cnn,lstm")
    parser.add_argument("--modes", default=",".join(MODES), help="of ddp, sync, solo, majority, majority_q")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4,
                        help="also evaluate rank 0's replica every N of its steps within an epoch (0: epoch ends only)")
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=20.0, help="cnn: device time per step")
    parser.add_argument("--delay-ms", type=float, default=100.0, help="cnn: extra time of the delayed rank")
    parser.add_argument("--cnn-batch", type=int, default=16, help="per rank")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, both tasks, every method")
    parser.add_argument("--cnn-lr", type=float, default=0.05)
    parser.add_argument("--cnn-target", type=float, default=0.95)
    parser.add_argument("--lstm-train", type=int, default=768)
    parser.add_argument("--lstm-test", type=int, default=512)
    parser.add_argument("--lstm-batch", type=int, default=8, help="per rank")
    parser.add_argument("--lstm-lr", type=float, default=0.1)
    parser.add_argument("--lstm-target", type=float, default=0.95)
    parser.add_argument("--ms-per-token", type=float, default=1.0, help="lstm: device time per padded time step")
    parser.add_argument("--lstm-delay-ms", type=float, default=0.0,
                        help="lstm: extra time of one random rank per step, injected on top (0: none)")
    parser.add_argument("--timeout", type=float, default=2400.0, help="seconds for the whole job")
    parser.add_argument("--replot", action="store_true",
                        help="only rebuild the tables and plots from results/<out>.json")
    parser.add_argument("--out", default="paper_accuracy")
    return parser.parse_args(argv)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, [a for a in argv if a != "--worker" and a != args.worker])
        return
    if args.replot:
        with open(os.path.join(RESULTS, args.out + ".json")) as fh:
            saved = json.load(fh)
        saved_args = argparse.Namespace(**{**saved["args"], "out": args.out})
        summary = summarize(saved["runs"], saved_args)
        write_outputs(saved["runs"], summary, saved_args, saved["machine"], saved["command"])
        return
    if args.quick:
        args.seeds, args.epochs = 1, 2
        if args.out == "paper_accuracy":
            args.out = "paper_accuracy_quick"
    from hvd_partial.launch import mpiexec_command
    from paper_throughput import machine

    os.makedirs(RESULTS, exist_ok=True)
    info = machine()
    started = time.time()
    worker_args = [a for a in argv if a != "--quick"] + ["--seeds", str(args.seeds), "--epochs", str(args.epochs)]
    with tempfile.TemporaryDirectory(prefix="paper-accuracy-") as tmp:
        out = os.path.join(tmp, "runs.json")
        cmd = mpiexec_command(args.np, [sys.executable, os.path.abspath(__file__), "--worker", out, *worker_args])
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        print(f"experiment 2: {info}", flush=True)
        subprocess.run(cmd, check=True, timeout=args.timeout, env=env)
        with open(out) as fh:
            runs = json.load(fh)
    info["loadavg_at_end"] = os.getloadavg()
    info["wall_seconds"] = time.time() - started
    summary = summarize(runs, args)
    write_outputs(runs, summary, args, info, "python benchmarks/paper_accuracy.py " + " ".join(argv))


def write_outputs(runs, summary, args, info, command):
    text = tables(summary, args)
    header = (f"Command: `{command.strip()}`  \nMachine: {info['cores']} cores, {info['mpi']}, torch "
              f"{__import__('torch').__version__}; load average {info['loadavg_at_start'][0]:.2f} at start, "
              f"{info['loadavg_at_end'][0]:.2f} at end; wall time {info['wall_seconds']:.0f} s.\n\n")
    print(text)
    with open(new_result_path(args.out + ".md"), "w") as fh:
        fh.write(header + text + "\n")
    with open(new_result_path(args.out + ".json"), "w") as fh:
        json.dump({"command": command.strip(), "args": vars(args), "machine": info, "summary": summary, "runs": runs},
                  fh, indent=1)
    for path in plots(runs, summary, args):
        print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
