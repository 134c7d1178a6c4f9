"""Data-parallel training with stragglers: sync vs solo vs majority allreduce.

Trains a small MLP on scikit-learn's handwritten digits (shipped with
scikit-learn, no download) on every rank, with injected delays:

- ``--straggler random``: at each local step every rank sleeps ``--delay``
  seconds with probability 1/P (about one straggler per step, the paper's pattern);
- ``--straggler persistent``: the last rank sleeps ``--delay`` at every step;
- ``--straggler none``.

An epoch is either every rank's share of the training set (``--epoch-by
samples``, the default: all modes see the same data per epoch, so accuracy per
epoch compares directly) or as many rounds as a synchronous run needs for it
(``--epoch-by rounds``: the fast ranks are not held back by a persistent
straggler within the staleness bound, and the slow one contributes less).
Each epoch ends with ``optimizer.flush()`` (collective), after which all ranks
hold identical parameters and evaluate.

    mpiexec -n 4 python examples/pytorch_straggler.py --mode solo
    mpiexec -n 4 python examples/pytorch_straggler.py --mode sync
    mpiexec -n 4 python examples/pytorch_straggler.py --mode solo --straggler persistent --epoch-by rounds

With ``--kill-rank R`` rank R dies abruptly (``os._exit``) in the middle of epoch
``--kill-epoch``, and the others finish the training without it: launch that one
with Open MPI's fault tolerance (docs/elastic.md)::

    hvd-partial-run --elastic -np 4 python examples/pytorch_straggler.py --kill-rank 1
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_partial
import hvd_partial.torch as hvd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["sync", "solo", "majority"], default="solo")
    p.add_argument("--straggler", choices=["none", "random", "persistent"], default="random")
    p.add_argument("--delay", type=float, default=0.05, help="seconds a straggler sleeps (default 0.05)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--epoch-by", choices=["samples", "rounds"], default="samples",
                   help="an epoch is each rank's share of the data (samples) or a sync epoch's rounds (rounds)")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-staleness", type=int, default=None, help="rounds (default: HVD_PARTIAL_MAX_STALENESS or 8)")
    p.add_argument("--quorum", type=int, default=None, help="majority: ranks with fresh data a round waits for")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-rank", type=int, default=None,
                   help="this rank dies mid-run (launch with hvd-partial-run --elastic; docs/elastic.md)")
    p.add_argument("--kill-epoch", type=int, default=3, help="the epoch in whose middle --kill-rank dies")
    return p.parse_args(argv)


def on_every_survivor(call):
    """Run a helper collective; after a rank died every survivor fails the same call with
    HorovodInternalError: acknowledge the new world and run it again there."""
    try:
        return call()
    except hvd_partial.HorovodInternalError:
        hvd_partial.acknowledge_world_change()
        return call()


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.25, random_state=seed, stratify=digits.target)
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


class Shard:
    """This rank's slice of the training set, reshuffled every pass."""

    def __init__(self, x, y, rank, size, batch, seed):
        self.x, self.y = x[rank::size], y[rank::size]
        self.batch = batch
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)
        self.order, self.pos = torch.randperm(len(self.y), generator=self.gen), 0

    def next(self):
        if self.pos + self.batch > len(self.order):
            self.order, self.pos = torch.randperm(len(self.y), generator=self.gen), 0
        idx = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return self.x[idx], self.y[idx]


def fingerprint(model, optimizer) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    state = optimizer.optimizer.state_dict()["state"]
    for key in sorted(state):
        for name in sorted(state[key]):
            h.update(torch.as_tensor(state[key][name]).numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share each core
    hvd.init(**({"elastic": True} if args.kill_rank is not None else {}))
    rank, size = hvd.rank(), hvd.size()
    say = lambda *a, **k: print(*a, **k) if hvd.rank() == 0 else None  # noqa: E731 - rank 0 of the world now

    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = make_model(args.seed)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    mode = {"sync": hvd.Sync(), "solo": hvd.Solo(),
            "majority": hvd.Majority(seed=args.seed, quorum=args.quorum)}[args.mode]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), mode=mode,
                                   max_staleness=args.max_staleness)
    rounds_per_epoch = math.ceil(len(y_train) / (args.batch_size * size))
    # Built on the wrapper, as with Horovod, and stepped once per epoch. (Stepped
    # per local step it would work too in every mode: each round carries the
    # hyperparameters of the posts summed in it, see docs/pytorch.md.)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1.0 + epoch / 4.0))
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    shard = Shard(x_train, y_train, rank, size, args.batch_size, args.seed)
    rng = random.Random(args.seed * 7919 + rank)
    say(f"{size} ranks, mode={args.mode}, straggler={args.straggler} (delay {args.delay:g} s), "
        f"{len(y_train)} training / {len(y_test)} test digits, epoch = "
        + (f"{rounds_per_epoch} local steps per rank" if args.epoch_by == "samples"
           else f"{rounds_per_epoch} rounds"))

    train_seconds = 0.0
    reached = None
    reported_version = 0  # the world changes reported so far
    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        first_round = opt.rounds
        target = first_round + rounds_per_epoch
        steps, loss_sum = 0, 0.0
        # Both loop conditions are the same on every rank after a flush, and
        # the round counter only grows: every rank leaves the loop.
        while (steps < rounds_per_epoch) if args.epoch_by == "samples" else (opt.rounds < target):
            if args.straggler == "random" and rng.random() < 1.0 / size:
                time.sleep(args.delay)
            elif args.straggler == "persistent" and rank == size - 1:
                time.sleep(args.delay)
            if epoch == args.kill_epoch and rank == args.kill_rank and steps == rounds_per_epoch // 2:
                print(f"rank {rank}: dying now (os._exit), in epoch {epoch}", flush=True)
                os._exit(1)
            xb, yb = shard.next()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            steps += 1
            loss_sum += loss.item()
        opt.flush()  # every rank now holds the same parameters: evaluate
        decay.step()
        elapsed = time.perf_counter() - started
        train_seconds += elapsed
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        all_steps = on_every_survivor(lambda: hvd.allgather_object(steps))
        mean_loss = on_every_survivor(
            lambda: hvd.allreduce(torch.tensor([loss_sum / max(steps, 1)], dtype=torch.float64))).item()
        world = hvd_partial.world()
        if world.version != reported_version:
            reported_version = world.version
            say(f"ranks {list(world.lost)} (numbered as at start) died; training on with {hvd.size()} ranks")
        if reached is None and accuracy >= 0.95:
            reached = train_seconds
        rounds = opt.rounds - first_round
        say(f"epoch {epoch:2d}  loss {mean_loss:.3f}  test acc {100 * accuracy:5.1f}%  "
            f"{rounds} rounds in {elapsed:5.2f} s ({rounds / elapsed:5.1f} rounds/s, "
            f"{sum(all_steps) * args.batch_size / elapsed:6.0f} samples/s)  local steps per rank {all_steps}")

    report = opt.stats()
    say(f"\ntraining time {train_seconds:.2f} s; test accuracy {100 * accuracy:.1f}%; "
        f"95% reached after {'%.2f s' % reached if reached is not None else 'never'}")
    say(f"participation over {report['rounds']} rounds (stream {opt.name!r}"
        + (", since the last rank died" if hvd_partial.world().lost else "") + "):")
    say("  rank  fresh  stale  initiated")
    for j in range(hvd.size()):
        say(f"  {j:4d}  {report['fresh'][j]:5d}  {report['stale'][j]:5d}  {report['initiated'][j]:9d}")
    say(f"  max staleness seen {report['max_staleness_seen']} rounds; post wait mean "
        f"{1e3 * report['wait_mean_s']:.1f} ms, p95 {1e3 * report['wait_p95_s']:.1f} ms (rank 0)")
    prints = on_every_survivor(lambda: hvd.allgather_object(fingerprint(model, opt)))
    identical = len(set(prints)) == 1
    say(f"replicas identical on all {hvd.size()} ranks (parameters and optimizer state): "
        f"{'yes' if identical else 'NO'} (sha256 {prints[0][:16]})")
    hvd.shutdown()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
