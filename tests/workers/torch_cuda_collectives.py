"""CUDA tensors through the negotiated tensor collectives (run by
benchmarks/gpu_check.sh where a GPU exists): each collective on CUDA tensors
must equal the same collective on CPU tensors, and return CUDA tensors."""

from __future__ import annotations

import torch
from support import report

import hvd_partial.torch as hvd


def both(fn, *tensors):
    """(result on CUDA moved to the CPU, result on the CPU, device of the CUDA result)."""
    gpu = fn(*[t.cuda() for t in tensors])
    cpu = fn(*tensors)
    first = gpu[0] if isinstance(gpu, (list, tuple)) else gpu
    flat = lambda x: [y.cpu() for y in x] if isinstance(x, (list, tuple)) else x.cpu()  # noqa: E731
    return flat(gpu), cpu, str(first.device)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    g = torch.Generator().manual_seed(r)
    x = torch.randn(5, 3, generator=g)
    cases = {
        "allreduce_avg": lambda t: hvd.allreduce(t),
        "allreduce_max": lambda t: hvd.allreduce(t, op=hvd.Max),
        "allreduce_fp16": lambda t: hvd.allreduce(t.half(), op=hvd.Sum),
        "allreduce_int": lambda t: hvd.allreduce((t * 10).long()),
        "grouped": lambda t: hvd.grouped_allreduce([t, t * 2]),
        "allgather": lambda t: hvd.allgather(t[: r + 1]),
        "broadcast": lambda t: hvd.broadcast(t, root_rank=n - 1),
        "alltoall": lambda t: hvd.alltoall(t[:n]),
        "reducescatter": lambda t: hvd.reducescatter(t, op=hvd.Sum),
        "bfloat16": lambda t: hvd.allreduce(t.bfloat16(), op=hvd.Sum),
    }
    out = {}
    for name, fn in cases.items():
        gpu, cpu, device = both(fn, x)
        if isinstance(gpu, list):
            equal = all(torch.equal(a, b) for a, b in zip(gpu, cpu))
        else:
            equal = torch.equal(gpu, cpu)
        out[name] = {"equal": bool(equal), "device": device}
    hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
