"""Bad input and edge cases of the torch adapter on 2 ranks: each case reports
the exception it got (type and message), and the job must still shut down
cleanly afterwards.
"""

from __future__ import annotations

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, make_model

import hvd_partial.torch as hvd


def caught(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test asserts on the type and message
        return {"type": type(err).__name__, "message": str(err)}
    return None


class Heads(torch.nn.Module):
    """A trunk and three heads: ``a`` always used, ``b`` used on rank 0 only, ``c`` never."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.trunk = torch.nn.Linear(12, 6).double()
        self.a = torch.nn.Linear(6, 5).double()
        self.b = torch.nn.Linear(6, 5).double()
        self.c = torch.nn.Linear(6, 5).double()

    def forward(self, x, use_b):
        h = torch.tanh(self.trunk(x))
        out = self.a(h)
        return out + self.b(h) if use_b else out


def main():
    hvd.init()
    rank = hvd.rank()
    out = {}
    x, y = make_data(1, 8)

    phase("shape mismatch")
    model = make_model(1, hidden=16 if rank == 0 else 17)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), mode=hvd.Solo(), name="mismatch")

    def mismatched_step():
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()

    out["mismatch"] = caught(mismatched_step)
    out["broadcast_mismatch"] = caught(lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0))

    phase("sparse")
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    torch.manual_seed(0)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(10, 3))
    sparse_opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), mode=hvd.Solo(), name="sparse")

    def sparse_step(o):
        o.zero_grad()
        emb(torch.tensor([rank, 3])).sum().backward()
        o.step()

    out["sparse"] = caught(lambda: sparse_step(sparse_opt))
    # Sync mode reduces sparse gradients as Horovod does, by allgather.
    sync_opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), mode=hvd.Sync(),
                                        name="sparse-sync")
    sparse_step(sync_opt)
    out["sparse_sync_is_sparse"] = emb.weight.grad.is_sparse
    out["sparse_sync_grad"] = emb.weight.grad.to_dense()[:4, 0].tolist()
    out["sparse_sync_fp"] = fingerprint(emb)
    dense_opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), mode=hvd.Sync(),
                                         sparse_as_dense=True, name="sparse-as-dense")
    sparse_step(dense_opt)
    out["sparse_as_dense_fp"] = fingerprint(emb)
    # rows 0 and 1 were each looked up on one of the 2 ranks: average gradient 1/2; row 3 on both: 1
    # and, as in Horovod, the optimizer gets it back sparse, as the parameter's own gradient was
    out["sparse_as_dense_is_sparse"] = emb.weight.grad.is_sparse
    out["sparse_as_dense_grad"] = emb.weight.grad.to_dense()[:4, 0].tolist()

    phase("misuse")
    model = make_model(2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), mode=hvd.Sync(), name="misuse")

    def skip_without_sync():
        opt.zero_grad()
        loss_of(model, x, y).backward()
        with opt.skip_synchronize():
            opt.step()

    out["skip_without_sync"] = caught(skip_without_sync)

    def two_passes(o):
        o.zero_grad()
        loss_of(model, x, y).backward()
        loss_of(model, x, y).backward()
        o.step()
        o.close()

    def backward_twice():
        opt.zero_grad()
        loss_of(model, x, y).backward()
        loss_of(model, x, y).backward()
        opt.step()

    out["backward_twice"] = caught(backward_twice)
    out["passes2_twice"] = caught(lambda: two_passes(hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), mode=hvd.Sync(), backward_passes_per_step=2, name="passes2")))
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()  # the counters reset: a normal step works after the error
    out["add_group_after_step"] = caught(lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}))

    frozen = make_model(3)
    frozen[0].weight.requires_grad_(False)
    fopt = hvd.DistributedOptimizer(torch.optim.SGD(frozen.parameters(), lr=0.1), mode=hvd.Sync(),
                                    named_parameters=frozen.named_parameters(), name="frozen")
    frozen[0].weight.requires_grad_(True)

    def unfrozen_step():
        fopt.zero_grad()
        loss_of(frozen, x, y).backward()
        fopt.step()

    out["unfrozen"] = caught(unfrozen_step)
    out["not_an_optimizer"] = caught(lambda: hvd.DistributedOptimizer(model))
    out["lbfgs"] = caught(lambda: hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters())))
    out["bad_passes"] = caught(lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                                backward_passes_per_step=0))
    out["scheduler_on_wrapper"] = caught(lambda: torch.optim.lr_scheduler.StepLR(opt, 1))

    phase("unused heads")
    heads = Heads()
    hopt = hvd.DistributedOptimizer(torch.optim.SGD(heads.parameters(), lr=0.1), mode=hvd.Sync(),
                                    named_parameters=heads.named_parameters(), name="heads")
    hopt.zero_grad()
    loss_of(lambda v: heads(v, use_b=rank == 0), x, y).backward()
    local_b = heads.b.weight.grad.clone() if rank == 0 else None
    out["c_grad_before"] = heads.c.weight.grad is None
    hopt.step()
    local_b = hvd.broadcast_object(local_b, root_rank=0)
    out["b_grad_is_rank0_over_size"] = bool(torch.equal(heads.b.weight.grad, local_b / hvd.size()))
    out["c_grad_zero"] = bool(torch.count_nonzero(heads.c.weight.grad) == 0)
    out["heads_fp"] = fingerprint(heads)

    phase("shutdown")
    hvd.shutdown()
    out["after_shutdown"] = caught(lambda: hvd.allreduce(torch.ones(1)))
    report(out)


if __name__ == "__main__":
    main()
