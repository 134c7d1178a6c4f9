"""Sync mode equals single-process training on the concatenated batches
(Horovod's averaging), for several optimizers and options; plus the tensor
collectives, the broadcast helpers and a checkpoint round trip.

Every rank also trains the single-process reference itself (all data is
generated from shared seeds) and reports the largest difference.
"""

from __future__ import annotations

import io

import torch
from support import phase, report
from torch_common import fingerprint, loss_of, make_data, make_model, max_diff, state_fingerprint

import hvd_partial.torch as hvd

B = 6  # samples per rank per step
STEPS = 5


def equivalence(factory, variant="plain", compression=hvd.Compression.none, schedule=False, clip=None,
                dtype=torch.float64):
    rank, size = hvd.rank(), hvd.size()
    model, ref = make_model(7, dtype=dtype), make_model(7, dtype=dtype)
    passes = 2 if variant == "passes2" else 1
    opt = hvd.DistributedOptimizer(factory(model.parameters()), named_parameters=model.named_parameters(),
                                   mode=hvd.Sync(), compression=compression, backward_passes_per_step=passes)
    ref_opt = factory(ref.parameters())
    if schedule:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: 0.8 ** n)  # on the wrapper, as in Horovod
        ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda n: 0.8 ** n)
    clipped = 0
    for step in range(STEPS):
        x, y = make_data(1000 + step, size * B, dtype=dtype)
        mine = slice(rank * B, (rank + 1) * B)
        opt.zero_grad()
        if variant == "passes2":
            half = B // 2
            xs, ys = x[mine], y[mine]
            (loss_of(model, xs[:half], ys[:half]) / 2).backward()
            (loss_of(model, xs[half:], ys[half:]) / 2).backward()
        else:
            loss_of(model, x[mine], y[mine]).backward()
        if clip is not None:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        ref_opt.zero_grad()
        loss_of(ref, x, y).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            clipped += int(norm > clip)
        ref_opt.step()
        if schedule:
            sched.step()
            ref_sched.step()
    out = {"diff": max_diff(model, ref), "fingerprint": fingerprint(model, opt), "rounds": opt.rounds,
           "updates": opt.updates, "clipped": clipped, "ks": len(opt.last_results)}
    if schedule:
        out["lr"] = opt.param_groups[0]["lr"]
        out["ref_lr"] = ref_opt.param_groups[0]["lr"]
    opt.close()
    return out


def tensor_collectives():
    rank, size = hvd.rank(), hvd.size()
    out = {}
    t = torch.tensor([float(rank), 2.0 * rank], dtype=torch.float32)
    out["average"] = hvd.allreduce(t, name="avg").tolist()
    out["sum"] = hvd.allreduce(t, name="avg", op=hvd.Sum).tolist()
    out["int_sum"] = hvd.allreduce(torch.tensor([rank, 1]), op=hvd.Sum).tolist()
    out["reused_name_other_shape"] = hvd.allreduce(torch.full((3,), float(rank)), name="avg").tolist()
    h1 = hvd.allreduce_async(torch.tensor([1.0 * rank]))
    h2 = hvd.allreduce_async(torch.tensor([10.0 * rank]))  # same shape, unnamed, both in flight
    out["async"] = [hvd.synchronize(h1).item(), hvd.synchronize(h2).item()]
    x = torch.tensor([float(rank + 1)], dtype=torch.float64)
    same = hvd.allreduce_(x, op=hvd.Sum)
    out["inplace"] = [x.item(), same is x]
    out["fp16"] = hvd.allreduce(torch.tensor([1.0 / 3.0 + rank], dtype=torch.float64),
                                compression=hvd.Compression.fp16).item()
    out["fp16_dtype"] = str(hvd.allreduce(torch.ones(2, dtype=torch.float64), compression=hvd.Compression.fp16).dtype)
    out["bf16"] = hvd.allreduce(torch.tensor([float(rank)], dtype=torch.bfloat16)).item()
    out["scaled"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).item()
    out["broadcast"] = hvd.broadcast(torch.tensor([rank, rank]), root_rank=size - 1).tolist()
    y = torch.tensor([float(rank)] * 3)
    hvd.broadcast_(y, root_rank=1)
    out["broadcast_"] = y.tolist()
    out["broadcast_object"] = hvd.broadcast_object({"rank": rank, "t": torch.arange(3) * rank}, root_rank=1)["rank"]
    out["allgather_object"] = hvd.allgather_object(rank * 10)
    return out


class WithBuffers(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(5, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("mask", torch.rand(4) > 0.5)
        self.register_buffer("bf16", torch.rand(3).to(torch.bfloat16))


def broadcasts():
    rank = hvd.rank()
    out = {}
    model = WithBuffers(seed=rank)
    model.bn.num_batches_tracked += rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    root = WithBuffers(seed=1)
    root.bn.num_batches_tracked += 1
    out["params_equal_root"] = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                     root.state_dict().values()))
    m2 = make_model(rank)
    hvd.broadcast_parameters(m2.named_parameters(), root_rank=0)
    out["named_params_fp"] = fingerprint(m2)
    opt = torch.optim.Adam(m2.parameters(), lr=0.001 * (rank + 1))
    if rank == 1:  # only the root has state
        loss_of(m2, *make_data(5, 8)).backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=1)
    out["opt_fp"] = state_fingerprint(opt)
    out["opt_lr"] = opt.param_groups[0]["lr"]
    out["opt_state_len"] = len(opt.state_dict()["state"])
    return out


def checkpoint_round_trip():
    rank, size = hvd.rank(), hvd.size()

    def train(model, opt, steps):
        for step in steps:
            x, y = make_data(3000 + step, size * B)
            opt.zero_grad()
            loss_of(model, x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]).backward()
            opt.step()

    model = make_model(3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), mode=hvd.Sync(),
                                   name="ckpt")
    train(model, opt, range(3))
    opt.flush()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    saved_rounds = opt.rounds
    train(model, opt, range(3, 6))
    continued = fingerprint(model, opt)

    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    model2 = make_model(99)
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9), mode=hvd.Sync(),
                                    name="ckpt-restored")
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    restored_rounds = opt2.rounds
    train(model2, opt2, range(3, 6))
    return {"saved_rounds": saved_rounds, "restored_rounds": restored_rounds, "rounds_after": [opt.rounds, opt2.rounds],
            "identical": fingerprint(model2, opt2) == continued, "saved_flushed": ck["opt"]["hvd_partial"]["flushed"]}


def main():
    hvd.init()
    out = {}
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3)  # noqa: E731
    phase("sgd")
    out["sgd"] = equivalence(sgd, schedule=True)
    phase("adamw")
    out["adamw"] = equivalence(lambda p: torch.optim.AdamW(p, lr=0.01))
    phase("adam float32")
    out["adam32"] = equivalence(lambda p: torch.optim.Adam(p, lr=0.01), dtype=torch.float32)
    phase("passes2")
    out["passes2"] = equivalence(lambda p: torch.optim.Adam(p, lr=0.01), variant="passes2")
    phase("clip")
    out["clip"] = equivalence(sgd, clip=0.05)
    phase("fp16")
    out["fp16"] = equivalence(sgd, compression=hvd.Compression.fp16)
    phase("tensor collectives")
    out["tensors"] = tensor_collectives()
    phase("broadcasts")
    out["broadcasts"] = broadcasts()
    phase("checkpoint")
    out["checkpoint"] = checkpoint_round_trip()
    hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
