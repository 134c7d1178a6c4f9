"""CUDA tensors through the torch adapter (run only where a GPU exists): the
same training on the GPU and on the CPU must give the same parameters (within
float tolerance), also with sync mode's buckets staged on a side stream during
backward, results must land on the parameter's device, and replicas must be
bitwise identical.
"""

from __future__ import annotations

import torch
from support import report
from torch_common import fingerprint, loss_of, make_data, make_model, max_diff

import hvd_partial.torch as hvd

B = 6


def train(device: str, mode, name: str, compression=hvd.Compression.none):
    rank, size = hvd.rank(), hvd.size()
    model = make_model(7).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), mode=mode, name=name,
                                   compression=compression)
    devices = set()
    for step in range(5):
        x, y = make_data(500 + step, size * B)
        opt.zero_grad()
        loss_of(model, x[rank * B:(rank + 1) * B].to(device), y[rank * B:(rank + 1) * B].to(device)).backward()
        opt.step()
        devices |= {str(p.grad.device) for p in model.parameters()}
    opt.flush()
    return model, opt, sorted(devices)


def main():
    hvd.init()
    device = f"cuda:{hvd.local_rank() % torch.cuda.device_count()}"
    out = {}
    gpu, gpu_opt, devices = train(device, hvd.Sync(), "cuda-sync")
    cpu, _, _ = train("cpu", hvd.Sync(), "cpu-sync")
    out["sync_diff"] = max_diff(gpu.cpu(), cpu)
    out["grad_devices"] = devices
    solo, solo_opt, _ = train(device, hvd.Solo(), "cuda-solo", compression=hvd.Compression.fp16)
    out["solo_fp"] = fingerprint(solo.cpu(), solo_opt)
    t = torch.full((3,), float(hvd.rank()), device=device)
    r = hvd.allreduce(t)
    out["allreduce"] = [str(r.device), r.cpu().tolist()]
    hvd.broadcast_parameters(solo.to(device).state_dict(), root_rank=0)
    hvd.shutdown()
    # Sync mode cut into buckets posted during backward: each bucket's CUDA gradients are copied
    # to the host on a side stream while the backward pass goes on.
    hvd.init(fusion_threshold_bytes=256)
    gpu, gpu_opt, _ = train(device, hvd.Sync(), "cuda-sync-buckets")
    cpu, _, _ = train("cpu", hvd.Sync(), "cpu-sync-buckets")
    out["buckets_diff"] = max_diff(gpu.cpu(), cpu)
    out["buckets"] = len(gpu_opt._overlap.buckets) if gpu_opt._overlap is not None else 1
    hvd.shutdown()
    report(out)


if __name__ == "__main__":
    main()
