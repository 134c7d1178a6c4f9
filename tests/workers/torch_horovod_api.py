"""Worker: Horovod's documented torch API on hvd_partial.torch (mpiexec, 2 or 3 ranks).

Usage: torch_horovod_api.py CASE  (api, mismatch, optimizer, schedule, reinit)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings

import torch

import hvd_partial.torch as hvd
from workers.support import phase, report
from workers.torch_common import loss_of, make_data, make_model

warnings.filterwarnings("ignore", message="Sparse invariant checks")


def api() -> dict:
    r, n = hvd.rank(), hvd.size()
    out = {}
    phase("flags")
    out["flags"] = {name: getattr(hvd, name)() for name in (
        "mpi_enabled", "mpi_built", "mpi_threads_supported", "gloo_enabled", "gloo_built", "nccl_built",
        "ddl_built", "ccl_built", "cuda_built", "rocm_built", "is_initialized")}
    out["cross"] = [hvd.cross_rank(), hvd.cross_size(), hvd.local_rank(), hvd.local_size()]
    phase("integer average")
    for dtype in (torch.int32, torch.int64):
        t = torch.tensor([3 * r + 1, -(3 * r + 1)], dtype=dtype)
        avg = hvd.allreduce(t)  # average by default
        out[f"int_average_{dtype}"] = [avg.tolist(), str(avg.dtype)]
    out["average_false"] = hvd.allreduce(torch.tensor([1.0, r]), average=False).tolist()
    out["min_max_product"] = [hvd.allreduce(torch.tensor([float(r)]), op=op).item()
                              for op in (hvd.Min, hvd.Max, hvd.Product)]
    out["bf16"] = [hvd.allreduce(torch.ones(2, dtype=torch.bfloat16), op=hvd.Sum).tolist(),
                   str(hvd.broadcast(torch.full((2,), r + 0.5, dtype=torch.bfloat16), root_rank=0).dtype)]
    t = torch.ones(3)
    hvd.allreduce_(t, op=hvd.Sum)
    out["inplace"] = t.tolist()
    out["grouped"] = [x.tolist() for x in hvd.grouped_allreduce([torch.ones(1) * r, torch.ones(2)], op=hvd.Sum)]
    out["fp16_compression"] = hvd.allreduce(torch.tensor([1.0 / 3]), compression=hvd.Compression.fp16).item()
    phase("allgather, broadcast, alltoall, reducescatter")
    out["allgather"] = hvd.allgather(torch.full((r + 1, 2), r)).tolist()
    out["grouped_allgather"] = [x.tolist() for x in hvd.grouped_allgather([torch.tensor([r]), torch.tensor([[r]])])]
    b = torch.tensor([r, r])
    hvd.broadcast_(b, root_rank=n - 1)
    out["broadcast_"] = b.tolist()
    received, splits = hvd.alltoall(torch.arange(n) + 10 * r, splits=torch.ones(n, dtype=torch.int32))
    out["alltoall"] = [received.tolist(), splits.tolist()]
    out["alltoall_nosplits"] = hvd.alltoall(torch.arange(n) + 10 * r).tolist()
    out["reducescatter"] = hvd.reducescatter(torch.ones(n + 1, 2), op=hvd.Sum).tolist()
    phase("async and duplicates")
    # A second call under a name in flight, checked in turns: the other ranks
    # hold back their call of that name until told, so the first cannot finish.
    from mpi4py import MPI

    for turn in range(n):
        if r == turn:
            h = hvd.allreduce_async(torch.ones(2), name=f"dup{turn}")
            try:
                hvd.allreduce_async(torch.ones(2), name=f"dup{turn}")
                out["duplicate"] = None
            except ValueError as err:
                out["duplicate"] = type(err).__name__
            for peer in range(n):
                if peer != turn:
                    MPI.COMM_WORLD.send(None, dest=peer, tag=79)
            out["dup_result"] = hvd.synchronize(h).tolist()
        else:
            MPI.COMM_WORLD.recv(source=turn, tag=79)
            hvd.synchronize(hvd.allreduce_async(torch.ones(2), name=f"dup{turn}"))
    out["poll"] = hvd.poll(hvd.allreduce_async(torch.ones(1))) in (True, False)
    phase("autograd")
    x = torch.ones(2, requires_grad=True)
    y = hvd.allreduce(x * (r + 1), op=hvd.Sum)
    y.sum().backward()
    out["autograd_allreduce"] = x.grad.tolist()
    phase("sparse")
    sp = torch.sparse_coo_tensor(torch.tensor([[r]]), torch.tensor([1.0]), (n,))
    dense = hvd.synchronize(hvd.sparse_allreduce_async(sp, "sparse", hvd.Sum)).to_dense()
    out["sparse"] = dense.tolist()
    phase("objects")
    out["objects"] = [hvd.broadcast_object({"r": r}, root_rank=n - 1), hvd.allgather_object(r)]
    phase("join")
    steps = []
    for i in range(r + 1):
        steps.append(hvd.allreduce(torch.ones(1), name=f"j{i}", op=hvd.Sum).item())
    out["join"] = [steps, hvd.join()]
    phase("process sets")
    out["global_set"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=hvd.global_process_set).item()
    out["refused"] = {}
    for what, call in {"other_set": lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0])),
                       "adasum": lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum)}.items():
        try:
            call()
            out["refused"][what] = None
        except hvd.HorovodInternalError as err:
            out["refused"][what] = [type(err).__name__, str(err)]
    phase("timeline")
    path = os.path.join(tempfile.mkdtemp(prefix="hvdp-tl-"), "timeline.json")
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(1))
    hvd.stop_timeline()
    from hvd_partial.observe import load_events, rank_path

    out["timeline_events"] = len(load_events(rank_path(path, r)))
    phase("sync batch norm")
    out["sync_batch_norm"] = _sync_batch_norm(r, n)
    hvd.barrier()
    return out


def _sync_batch_norm(r: int, n: int) -> dict:
    """SyncBatchNorm on each rank's batch equals BatchNorm on the concatenated batch."""
    g = torch.Generator().manual_seed(5)
    full = torch.randn(4 * n, 3, 2, generator=g, dtype=torch.float64)
    dy_full = torch.randn(4 * n, 3, 2, generator=g, dtype=torch.float64)
    ref = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    x_ref = full.clone().requires_grad_(True)
    (ref(x_ref) * dy_full).sum().backward()
    sbn = hvd.SyncBatchNorm(3).double()
    with torch.no_grad():
        sbn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    mine = slice(4 * r, 4 * r + 4)
    x = full[mine].clone().requires_grad_(True)
    y = sbn(x)
    (y * dy_full[mine]).sum().backward()
    y_ref = ref(full)  # running stats updated twice on ref: compare the first update below
    del y_ref
    y = y.detach()
    return {"output": float((y - torch.nn.functional.batch_norm(
                full, None, None, ref.weight, ref.bias, True, 0.0, ref.eps)[mine]).abs().max()),
            "grad_input": float((x.grad - x_ref.grad[mine]).abs().max()),
            "grad_weight_sum": float(hvd.allreduce(sbn.weight.grad.detach(), op=hvd.Sum).sub(
                ref.weight.grad).abs().max()),
            "running_mean": float((sbn.running_mean - 0.1 * full.mean(dim=(0, 2))).abs().max())}


def mismatch() -> dict:
    r = hvd.rank()
    odd = r == 1
    out = {}
    # Built before the clock starts: the first optimizer of a process imports a lot.
    mismatched = torch.optim.SGD(torch.nn.Linear(3, 2 + odd).parameters(), lr=0.1)
    cases = {"shape": lambda: hvd.allreduce(torch.ones(3 + odd)),
             "dtype": lambda: hvd.allreduce(torch.ones(3, dtype=torch.float64 if odd else torch.float32)),
             "allgather_dtype": lambda: hvd.allgather(torch.ones(2, dtype=torch.int32 if odd else torch.int64)),
             "broadcast_root": lambda: hvd.broadcast(torch.ones(2), root_rank=int(odd)),
             "optimizer_model": lambda: hvd.broadcast_optimizer_state(mismatched, root_rank=0)}
    for key, call in cases.items():
        phase(f"mismatch {key}")
        started = time.monotonic()
        try:
            call()
            out[key] = {"error": None}
        except hvd.MismatchError as err:
            out[key] = {"error": str(err)}
        out[key]["seconds"] = time.monotonic() - started
    out["after"] = hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist()
    return out


def optimizer() -> dict:
    r = hvd.rank()
    out = {}
    phase("broadcast_optimizer_state without gradients")
    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), weight_decay=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=1, model=model)
    out["state_len"] = len(opt.state)
    out["lr"] = opt.param_groups[0]["lr"]
    out["params_untouched"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    out["zero_grads"] = all(p.grad is not None and not p.grad.any() for p in model.parameters())
    out["state_steps"] = sorted({float(s["step"]) for s in opt.state.values()})
    phase("wrapped optimizer with Horovod's arguments")
    torch.manual_seed(0)
    model = make_model(0)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                    hvd.Compression.none, 1, hvd.Average, gradient_predivide_factor=2.0,
                                    num_groups=2, sparse_as_dense=True, process_set=hvd.global_process_set,
                                    mode=hvd.Sync())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(dopt, root_rank=0)
    x, y = make_data(10 + r, 8)
    dopt.zero_grad()
    loss_of(model, x, y).backward()
    dopt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dopt.step()  # after synchronize() without skip_synchronize(): Horovod's warning
    out["warning"] = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    out["fingerprint"] = [float(p.detach().abs().sum()) for p in model.parameters()]
    refused = {}
    for what, kwargs in {"adasum": {"op": hvd.Adasum}, "predivide_sum": {"op": hvd.Sum,
                                                                          "gradient_predivide_factor": 2.0},
                         "process_set": {"process_set": hvd.ProcessSet([0])},
                         "solo_on_removed_set": {"process_set": "removed", "mode": hvd.Solo()}}.items():
        if kwargs.get("process_set") == "removed":
            kwargs["process_set"] = hvd.add_process_set([0])
            hvd.remove_process_set(kwargs["process_set"])
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(make_model(0).parameters(), lr=0.1), **kwargs)
            refused[what] = None
        except hvd.HvdPartialError as err:
            refused[what] = type(err).__name__
    out["refused"] = refused
    return out


def schedule() -> dict:
    """A learning rate set per local step from the batch index, as Horovod's
    ImageNet example does: every rank applies each round with the same values,
    and reads back its own."""
    r = hvd.rank()
    out = {}
    for mode in (hvd.Solo(), hvd.Sync()):
        model = make_model(1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), mode=mode,
                                       name=f"schedule.{mode.kind}")
        x, y = make_data(20 + r, 8)
        error, read_back = None, []
        try:
            for step in range(3):
                for group in opt.param_groups:
                    group["lr"] = 0.1 / (step + 1 + r)  # Horovod's ImageNet example does this per batch
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.step()
                read_back.append(opt.param_groups[0]["lr"] == 0.1 / (step + 1 + r))
        except hvd.HvdPartialError as err:
            error = str(err)
        opt.flush()
        for group in opt.param_groups:
            group["lr"] = 0.01  # right after flush(): every rank is at the same round
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        opt.flush()
        out[mode.kind] = {"error": error, "read_back": read_back, "fingerprint": [float(p.detach().sum()) for p in model.parameters()]}
    return out


def reinit() -> dict:
    out = []
    for attempt in range(2):
        hvd.init()
        out.append(hvd.allreduce(torch.tensor([float(hvd.rank() + attempt)]), op=hvd.Sum).item())
        model = make_model(2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), mode=hvd.Sync())
        x, y = make_data(30 + hvd.rank(), 4)
        loss_of(model, x, y).backward()
        opt.step()
        out.append(opt.rounds)
        hvd.shutdown()
    return {"results": out}


CASES = {"api": api, "mismatch": mismatch, "optimizer": optimizer, "schedule": schedule, "reinit": reinit}

if __name__ == "__main__":
    case = sys.argv[1]
    if case != "reinit":
        hvd.init()
    result = CASES[case]()
    report(json.loads(json.dumps(result, default=str)))
    if case != "reinit":
        hvd.shutdown()
