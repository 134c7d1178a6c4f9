"""hvd.elastic with PyTorch under mpiexec.

``elastic_torch.py sync``: every rank starts from its own model, optimizer
state, sampler progress and values; ``TorchState.sync()`` must leave them
rank 0's (sampler: the union of every rank's processed indices).

``elastic_torch.py train [--mode solo|sync] [--kill-rank R --kill-at-commit C]``:
Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py on small
synthetic data: ``@hvd.elastic.run``, a ``TorchState`` holding the model,
a ``DistributedOptimizer``, an ``ElasticSampler`` and epoch/batch, a reset
callback rescaling the learning rate by ``hvd.size()``, a commit every few
batches and a metric ``hvd.allreduce`` per epoch. With ``--kill-rank``, that
rank (numbered as at init) kills itself with SIGKILL right after its
``C``-th commit (launch with ``hvd-partial-run --elastic`` or Open MPI's
``--with-ft ulfm --mca btl tcp,self`` and ``HVD_PARTIAL_ELASTIC=1``). Every
surviving rank reports its final fingerprint, the world it ended in, the
resets it saw and, per epoch, the dataset indices it trained on.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import time

import torch
from support import phase, report
from torch_common import fingerprint, state_fingerprint

import hvd_partial
import hvd_partial.torch as hvd
from hvd_partial import faults

SAMPLES = 96
BATCH = 4
EPOCHS = 2
COMMIT_EVERY = 3
BASE_LR = 0.01


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _dataset():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = torch.randint(0, 3, (SAMPLES,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def case_sync() -> dict:
    rank = hvd.rank()
    model = _model(seed=100 + rank)  # different on every rank
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    optimizer.zero_grad()
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    sampler = hvd.elastic.ElasticSampler(range(40), shuffle=True, seed=3)
    sampler.record_batch(rank, 2)  # ranks processed different batches of their shares
    mine = sorted(sampler.processed_indices)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=rank + 5, batch=rank)
    state.sync()
    state.commit()  # the check's helper collective runs on every rank
    return {"fingerprint": fingerprint(model, optimizer), "optimizer": state_fingerprint(optimizer),
            "lr": optimizer.param_groups[0]["lr"], "epoch": state.epoch, "batch": state.batch,
            "mine": mine, "processed": sorted(sampler.processed_indices), "shard": list(sampler)}


class _LoggedState(hvd.elastic.TorchState):
    """A TorchState that also keeps this rank's log of trained samples (not
    synced: every rank's own) with the commits: a restore drops the samples
    trained since the last save, as it drops the model's progress since."""

    def __init__(self, *args, log: dict, **kwargs):
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_log_saved", {})
        super().__init__(*args, **kwargs)

    def save(self) -> None:
        super().save()
        object.__setattr__(self, "_log_saved", copy.deepcopy(self._log))

    def restore(self) -> None:
        super().restore()
        self._log.clear()
        self._log.update(copy.deepcopy(self._log_saved))


def case_train(mode: str, kill_rank: int | None, kill_at_commit: int | None, kill_point: str | None,
               kill_count: int | None) -> dict:
    original_rank = hvd.rank()
    if kill_rank == original_rank and kill_point:  # dies inside hvd_partial's code, at the count-th time there
        faults.at(kill_point, lambda n: n >= kill_count and os._exit(1))
    dataset = _dataset()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = _model(seed=7)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(),
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         mode=hvd.Sync() if mode == "sync" else hvd.Solo())
    resets = []

    def on_reset():
        resets.append({"size": hvd.size(), "version": hvd_partial.world().version, "lr_before":
                       optimizer.param_groups[0]["lr"]})
        for group in optimizer.param_groups:
            group["lr"] = BASE_LR * hvd.size()

    trained = {}  # epoch -> indices trained here and kept (a restore drops the ones since the last commit)
    attempted = {}  # epoch -> every index trained here, rolled back or not
    state = _LoggedState(model, optimizer, sampler=sampler, epoch=0, batch=0, commits=0, log=trained)
    state.register_reset_callbacks([on_reset])
    started = time.monotonic()

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            phase(f"epoch {state.epoch} batch {state.batch}")
            model.train()
            for batch_idx, (x, y) in enumerate(loader):
                indices = sampler.get_indices(batch_idx, BATCH)
                trained.setdefault(state.epoch, []).extend(indices)
                attempted.setdefault(state.epoch, []).extend(indices)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                sampler.record_batch(batch_idx, BATCH)
                state.batch += 1
                if state.batch % COMMIT_EVERY == 0:
                    state.commits += 1
                    state.commit()
                    if kill_rank == original_rank and state.commits == kill_at_commit:
                        os.kill(os.getpid(), signal.SIGKILL)
            loss = hvd.allreduce(torch.tensor(float(state.batch)), name=f"epoch{state.epoch}.batches")
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()
        return float(loss)

    train(state)
    optimizer.flush()
    elapsed = time.monotonic() - started
    world = hvd_partial.world()
    return {"fingerprint": fingerprint(model, optimizer), "world": {"version": world.version, "size": world.size,
            "lost": list(world.lost), "original_rank": world.original_rank}, "size": hvd.size(),
            "resets": resets, "trained": {str(e): v for e, v in trained.items()},
            "attempted": {str(e): v for e, v in attempted.items()}, "commits": state.commits,
            "lr": optimizer.param_groups[0]["lr"], "seconds": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["sync", "train"])
    parser.add_argument("--mode", default="solo", choices=["solo", "sync"])
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--kill-at-commit", type=int)
    parser.add_argument("--kill-point", help="a point of hvd_partial.faults: the kill rank dies there (os._exit)")
    parser.add_argument("--kill-count", type=int, default=1, help="... the count-th time it reaches it")
    parser.add_argument("--token", help="ignored: a word on the command line that finds processes left behind")
    args = parser.parse_args()
    hvd.init()
    out = case_sync() if args.case == "sync" else case_train(args.mode, args.kill_rank, args.kill_at_commit,
                                                                           args.kill_point, args.kill_count)
    report(out)
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
