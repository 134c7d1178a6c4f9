"""Horovod's ``num_groups`` and ``groups`` in every mode.

Two models, each trained with no groups, ``num_groups=2``, ``groups=3`` and
``groups=[[...], [...]]``:

- ``exact``: five float64 parameters whose gradients are integers that do not
  depend on the parameters (a linear loss), op=Sum, plain SGD with lr 0.5:
  every sum is exact, so the result after ``flush()`` is bitwise the same
  however the rounds (solo, majority) or the buffers (groups) fall, and equal
  to the single-process sum.
- ``mlp`` (sync mode): a small network with SGD momentum and op=Average,
  with ``overlap_backward`` on (groups are the buckets) and off.

Argument: none. Report per case: per-step fingerprints, the final parameters,
the stream's reductions per round (from ``hvd.stats()``), the buckets.
"""

from __future__ import annotations

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, make_model

import hvd_partial.torch as hvd

STEPS = 5
SHAPES = [(3, 4), (4,), (2, 2, 2), (5,), (7,)]
GROUPINGS = ("none", "num2", "groups3", "list")


def grouping(name: str, params: list) -> dict:
    if name == "num2":
        return {"num_groups": 2}
    if name == "groups3":
        return {"groups": 3}
    if name == "list":  # the rest (params 2 and 4) become groups of their own: four groups
        return {"groups": [[params[3], params[0]], [params[1]]]}
    return {}


def mode_of(name: str):
    return {"sync": hvd.Sync(), "solo": hvd.Solo(), "majority": hvd.Majority(seed=5)}[name]


def exact_case(mode: str, group: str) -> dict:
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randint(-50, 50, s).to(torch.float64)) for s in SHAPES]
    start = [p.detach().clone() for p in params]
    name = f"exact.{mode}.{group}"
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.5), mode=mode_of(mode), op=hvd.Sum, name=name,
                                   **grouping(group, params))
    total = [torch.zeros_like(p) for p in params]
    per_step = []
    for step in range(STEPS):
        opt.zero_grad()
        for r in range(size):  # every rank's integer gradients, known to all for the reference
            g = torch.Generator().manual_seed(1000 * step + r)
            coefs = [torch.randint(-9, 10, s, generator=g).to(torch.float64) for s in SHAPES]
            for t, c in zip(total, coefs):
                t += c
            if r == rank:
                sum((p * c).sum() for p, c in zip(params, coefs)).backward()
        opt.step()
        if mode == "sync":  # solo and majority replicas agree after each applied round, not each step
            per_step.append(fingerprint(torch.nn.ParameterList(params), opt))
    stats = opt.stats()
    opt.flush()
    expected = [s - 0.5 * t for s, t in zip(start, total)]
    out = {"final": [p.detach().flatten().tolist() for p in params],
           "exact": all(torch.equal(p.detach(), e) for p, e in zip(params, expected)),
           "reductions_per_round": stats["reductions_per_round"], "reductions": stats["reductions"],
           "rounds": opt.rounds,
           "per_step": per_step if mode == "sync" else None}
    opt.close()
    return out


def mlp_case(group: str, overlap: bool) -> dict:
    rank, size = hvd.rank(), hvd.size()
    model = make_model(7)
    params = list(model.parameters())  # w0 b0 w2 b2
    name = f"mlp.{group}.{overlap}"
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), mode=hvd.Sync(), name=name,
                                   **grouping(group, params))  # "list": [[b2, w0], [b0]] and w2 alone
    per_step = []
    for step in range(STEPS):
        x, y = make_data(40 + step, size * 4)
        opt.zero_grad()
        loss_of(model, x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]).backward()
        opt.step()
        per_step.append(fingerprint(model, opt))
    stats = hvd.stats()
    streams = [name] if opt._overlap is None else opt._overlap.streams
    out = {"per_step": per_step, "final": [p.detach().flatten().tolist() for p in params],
           "buckets": None if opt._overlap is None else [names for _, names in opt._overlap.describe()],
           "reductions_per_round": [stats[s]["reductions_per_round"] for s in streams], "rounds": opt.rounds}
    opt.flush()
    opt.close()
    return out


def main():
    out = {}
    for overlap in (False, True):
        hvd.init(overlap_backward=overlap)
        for group in GROUPINGS:
            phase(f"mlp {group} overlap={overlap}")
            out[f"mlp/{group}/{'on' if overlap else 'off'}"] = mlp_case(group, overlap)
            if not overlap:
                for mode in ("sync", "solo", "majority"):
                    phase(f"exact {mode} {group}")
                    out[f"exact/{mode}/{group}"] = exact_case(mode, group)
        hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
