"""Worker: Horovod's semantics that Horovod's own test file checks, on
hvd_partial.torch (mpiexec, 2 or 3 ranks, sync mode): gradients through every
collective, join with a refused allgather and broadcast, the sparse
allreduce handle, 0-dim tensors, sparse embeddings with SparseAdam, and
broadcast_optimizer_state for parameters without a gradient.

Usage: torch_horovod_grads.py CASE  (grads, join, sparse, state)
"""

from __future__ import annotations

import json
import sys
import warnings

import torch

import hvd_partial.torch as hvd
from workers.support import phase, report

warnings.filterwarnings("ignore", message="Sparse invariant checks")


def _grad_of(build, *tensors, weights=None):
    """Gradients of sum(weights_i * output_i) through ``build(*tensors)``."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    outs = build(*leaves)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    total = sum((o * (w if weights else 1.0)).sum() for o, w in zip(outs, weights or [1.0] * len(outs)))
    total.backward()
    return [leaf.grad.tolist() for leaf in leaves]


def grads() -> dict:
    r, n = hvd.rank(), hvd.size()
    out = {}
    phase("allgather")
    rows = torch.full((r + 1, 2), float(r))
    # The gradient of the gathered rows, weighted by the row's owner + 1 on every rank:
    # Horovod averages it over ranks and hands each rank its own rows.
    weights = torch.cat([torch.full((q + 1, 2), float(q + 1)) for q in range(n)])
    leaf = rows.clone().requires_grad_()
    (hvd.allgather(leaf) * weights).sum().backward()
    out["allgather"] = leaf.grad.tolist()
    phase("grouped allgather")
    a, b = torch.ones(r + 1, 3).requires_grad_(), torch.ones(2, 1).requires_grad_()
    ga, gb = hvd.grouped_allgather([a, b])
    (ga * (r + 1)).sum().backward(retain_graph=True)
    gb.sum().backward()
    out["grouped_allgather"] = [a.grad.tolist(), b.grad.tolist()]
    phase("alltoall")
    x = torch.arange(float(n * (r + 1))).reshape(-1, 1).requires_grad_()
    received, splits = hvd.alltoall(x, splits=torch.tensor([r + 1] * n, dtype=torch.int32))
    (received * (r + 2)).sum().backward()
    out["alltoall"] = [x.grad.reshape(-1).tolist(), splits.tolist(), received.requires_grad]
    x = torch.ones(2 * n, 1).requires_grad_()
    received = hvd.alltoall(x)
    (received * (r + 2)).sum().backward()
    out["alltoall_equal"] = x.grad.reshape(-1).tolist()
    phase("grouped allreduce")
    for op in ("Sum", "Average"):
        out[f"grouped_allreduce_{op}"] = _grad_of(
            lambda p, q, op=op: hvd.grouped_allreduce([p, q], op=getattr(hvd, op)), torch.ones(2), torch.ones(3),
            weights=[float(r + 1), 1.0])
    phase("reducescatter")
    for op in ("Sum", "Average"):
        out[f"reducescatter_{op}"] = _grad_of(lambda t, op=op: hvd.reducescatter(t, op=getattr(hvd, op)),
                                              torch.ones(n + 1, 2), weights=[float(r + 1)])[0]
    out["reducescatter_scaled"] = _grad_of(
        lambda t: hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
        torch.ones(n, 1))[0]
    out["grouped_reducescatter"] = _grad_of(lambda p, q: hvd.grouped_reducescatter([p, q], op=hvd.Sum),
                                            torch.ones(n, 1), torch.ones(2 * n, 2), weights=[float(r + 1), 1.0])
    phase("broadcast")
    out["broadcast"] = [_grad_of(lambda t, root=root: hvd.broadcast(t, root), torch.ones(3),
                                 weights=[float(r + 1)])[0] for root in range(n)]
    phase("0-dim")
    t = torch.tensor(float(r + 3))
    hvd.broadcast_(t, root_rank=0)
    out["zero_dim"] = [list(t.shape), t.item(), list(hvd.allreduce(torch.tensor(1.0), op=hvd.Sum).shape),
                       list(hvd.broadcast(torch.tensor(r), n - 1).shape)]
    return out


def join() -> dict:
    """Each rank in turn joins first; the others' allgather and broadcast fail as in Horovod."""
    r, n = hvd.rank(), hvd.size()
    out = {"returned": [], "refused": [], "everyone": []}
    for first in range(n):
        phase(f"join, rank {first} first")
        if r != first:
            refused = []
            # Named: the joined rank makes none of these calls, so unnamed ones would be numbered
            # differently on the ranks from here on.
            for call in (lambda: hvd.allgather(torch.ones(2, 2), name=f"ag{first}"),
                         lambda: hvd.broadcast(torch.ones(2), 1 if first == 0 else 0, name=f"bc{first}"),
                         lambda: hvd.alltoall(torch.ones(n), name=f"a2a{first}"),
                         lambda: hvd.reducescatter(torch.ones(n), name=f"rs{first}")):
                try:
                    call()
                    refused.append(None)
                except RuntimeError as err:  # Horovod's tests catch RuntimeError
                    refused.append(type(err).__name__)
            out["refused"].append(refused)
        ret = hvd.join()
        out["returned"].append(ret)
        out["everyone"].append(hvd.allgather_object(ret))
    out["after"] = hvd.allgather(torch.tensor([r])).tolist()
    return out


def sparse() -> dict:
    r, n = hvd.rank(), hvd.size()
    out = {}
    phase("sparse allreduce handle")
    dense = torch.zeros(4, 2)
    dense[r % 4] = float(r + 1)
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp", op=hvd.Average)
    out["handle_call"] = handle().to_dense().tolist()
    phase("sparse embeddings")
    for as_dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(6, 2, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=as_dense, mode=hvd.Sync())
        before = emb.weight.detach().clone()
        for step in range(2):
            opt.zero_grad()
            emb(torch.tensor([[r, (r + step) % 6]])).sum().backward()
            opt.step()
        changed = sorted({i for i in range(6) if not torch.equal(before[i], emb.weight.detach()[i])})
        out[f"embedding_as_dense_{as_dense}"] = {"grad_sparse": emb.weight.grad.is_sparse, "rows": changed,
                                                 "weights": emb.weight.detach().tolist()}
        opt.close()
    return out


def state() -> dict:
    out = {}
    phase("broadcast_optimizer_state")
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)
    model[0].weight.grad = torch.full_like(model[0].weight, 7.0)
    kept = model[0].weight.grad
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grads = [p.grad for p in model.parameters()]
    out["kept_grad"] = grads[0] is kept and bool((kept == 7.0).all())
    out["zero_grads"] = [g is not None and not g.any().item() for g in grads[1:3]]
    out["frozen_grad"] = grads[3] is None
    out["params_untouched"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    phase("0-dim optimizer state")
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p) * (hvd.rank() + 1)
    for _ in range(hvd.rank() + 1):
        adam.step()
    steps = [s["step"] for s in adam.state.values()]
    out["adam_step_dims"] = sorted({s.dim() for s in steps})
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    out["adam_steps"] = sorted({float(s["step"]) for s in adam.state.values()})
    return out


CASES = {"grads": grads, "join": join, "sparse": sparse, "state": state}

if __name__ == "__main__":
    hvd.init(mode="sync")
    result = CASES[sys.argv[1]]()
    report(json.loads(json.dumps(result, default=str)))
    hvd.shutdown()
