"""Sync mode's overlap of reductions with the backward pass (``overlap_backward``).

With ``fusion_threshold_bytes=1024`` the model below (float64) is cut into four
buckets, posted in reverse registration order during backward. Every case
trains with overlap on, then (after ``shutdown`` and ``init``) the same steps
with overlap off, and every rank also trains the single-process reference on
the concatenated batches. A layer used twice in forward (its hook fires once,
after both accumulations) and a parameter no forward uses are part of it.

``deferred`` is ``plain`` with every bucket's copies reported done only at
the third query, as CUDA copies on a side stream may be: a bucket is then
posted by a later hook call or by ``step()``, never before.

Argument: none. Report per case: fingerprints on and off, differences to the
reference, buckets staged and posted during backward, rounds.
"""

from __future__ import annotations

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, max_diff

import hvd_partial.torch as hvd
from hvd_partial.torch.optimizer import SynchronizationError
from hvd_partial.torch.tensors import HostStaging

B = 6  # samples per rank per step
STEPS = 6
THRESHOLD = 1024


class Net(torch.nn.Module):
    """inp -> mid -> mid -> out; ``spare`` (registered between inp and mid) is never used.
    Buckets of at most 1024 bytes, in posting order: [mid.b, out.w, out.b], [mid.w] (2048 bytes, alone),
    [inp.b, spare.w, spare.b], [inp.w]: backward posts the first two; the third waits for
    spare's gradient, which never comes, so step() posts it and the last."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = torch.nn.Linear(12, 16)
        self.spare = torch.nn.Linear(16, 5)
        self.mid = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 5)
        self.to(torch.float64)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))  # the same parameters a second time
        return self.out(h)


class LateCopy:
    """Stands in for a bucket's device copies still running when the hook asks: done at the third
    query, or when waited for (on CPU the arrays are ready at once; only the posting is late)."""

    def __init__(self):
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.queries >= 3

    def synchronize(self) -> None:
        self.queries = 3


def late_copies(to_host_async):
    def staged_late(self, tensors, names=None):
        arrays, _ = to_host_async(self, tensors, names)
        return arrays, LateCopy()
    return staged_late


def train(variant: str) -> dict:
    if variant == "deferred":
        real = HostStaging.to_host_async
        HostStaging.to_host_async = late_copies(real)
        try:
            return train("plain")
        finally:
            HostStaging.to_host_async = real
    rank, size = hvd.rank(), hvd.size()
    model, ref = Net(3), Net(3)
    passes = 2 if variant == "passes2" else 1
    make = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3)  # noqa: E731
    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   mode=hvd.Sync(), backward_passes_per_step=passes)
    ref_opt = make(ref.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 0.8 ** n)  # travels with each round
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda n: 0.8 ** n)
    posted_in_backward, sent_in_backward, posted_after_first_pass, fingerprints = [], [], [], []
    errors = {}
    for step in range(STEPS):
        x, y = make_data(500 + step, size * B)
        mine = slice(rank * B, (rank + 1) * B)
        opt.zero_grad()
        if passes == 2:
            half = B // 2
            xs, ys = x[mine], y[mine]
            (loss_of(model, xs[:half], ys[:half]) / 2).backward()
            posted_after_first_pass.append(overlap_posted(opt))
            (loss_of(model, xs[half:], ys[half:]) / 2).backward()
        else:
            loss_of(model, x[mine], y[mine]).backward()
        posted_in_backward.append(overlap_posted(opt))
        sent_in_backward.append(0 if opt._overlap is None else sum(h is not None for h in opt._overlap.handles))
        if variant == "misuse" and step == 2:
            try:
                opt.zero_grad()
            except SynchronizationError as err:
                errors["zero_grad"] = str(err)
        if variant == "clip":
            opt.synchronize()  # Horovod's pattern: edit the reduced gradient
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        sched.step()
        fingerprints.append(fingerprint(model, opt))
        ref_opt.zero_grad()
        loss_of(ref, x, y).backward()
        if variant == "clip":
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
        ref_sched.step()
    if variant == "misuse":  # a gradient edited after backward posted it, before step(): refused on every rank
        opt.zero_grad()
        x, y = make_data(999, size * B)
        loss_of(model, x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]).backward()
        model.out.weight.grad.mul_(0.5)  # its bucket went out during backward
        try:
            opt.step()
        except SynchronizationError as err:
            errors["changed"] = str(err)
    flushed = opt.flush()
    # spare: zeros here (as in Horovod: another rank may have a gradient), None in the reference,
    # so weight decay moves it here only; compared with overlap off instead
    used = lambda m: torch.nn.ModuleList([m.inp, m.mid, m.out])  # noqa: E731
    out = {"fingerprint": fingerprint(model, opt), "per_step": fingerprints, "diff": max_diff(used(model), used(ref)),
           "posted_in_backward": posted_in_backward, "sent_in_backward": sent_in_backward,
           "posted_after_first_pass": posted_after_first_pass,
           "rounds": opt.rounds, "updates": opt.updates, "flush_rounds": len(flushed), "errors": errors,
           "spare": model.spare.weight.flatten().tolist(),
           "buckets": None if opt._overlap is None else len(opt._overlap.buckets)}
    opt.close()
    return out


def overlap_posted(opt) -> int:
    """Buckets staged (and so posted, or waiting for their copies) so far in this step (0 without overlap)."""
    return 0 if opt._overlap is None else opt._overlap.next


def main():
    out = {}
    for overlap in (True, False):
        hvd.init(fusion_threshold_bytes=THRESHOLD, overlap_backward=overlap)
        for variant in ("plain", "passes2", "clip", "misuse", "deferred"):
            phase(f"{variant} overlap={overlap}")
            out[f"{variant}/{'on' if overlap else 'off'}"] = train(variant)
        hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
