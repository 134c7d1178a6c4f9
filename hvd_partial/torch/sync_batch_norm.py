"""``SyncBatchNorm``: batch normalization whose batch statistics span every rank.

In training, the mean and variance of each channel are computed over the
batches of all ranks (one negotiated allreduce of per-channel sums, squared
sums and counts), and the backward pass reduces the two per-channel sums the
input gradient needs, so the result equals ``BatchNorm`` over the
concatenated batch. The weight and bias gradients stay local, as in Horovod
(the ``DistributedOptimizer`` reduces them). In eval mode, or without
tracked statistics in eval, it is a plain ``BatchNorm``.

Example::

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8), torch.nn.ReLU())
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import hvd_partial as _core


class SyncBatchNorm(_BatchNorm):
    """Horovod's ``hvd.SyncBatchNorm(num_features, eps=1e-5, momentum=0.1,
    affine=True, track_running_stats=True)``, for inputs of 2 or more dimensions."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects at least a 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if self.momentum is None:
            momentum = 1.0 / float(self.num_batches_tracked)
        else:
            momentum = self.momentum
        if _core.size() == 1 or not self.training:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training, momentum, self.eps)
        weight = self.weight if self.weight is not None else torch.ones(self.num_features, dtype=input.dtype,
                                                                        device=input.device)
        bias = self.bias if self.bias is not None else torch.zeros(self.num_features, dtype=input.dtype,
                                                                   device=input.device)
        return _SyncBatchNormFunction.apply(input, weight, bias, self.running_mean, self.running_var, self.eps,
                                            momentum)


def _channel_sum(x: torch.Tensor) -> torch.Tensor:
    dims = [0] + list(range(2, x.dim()))
    return x.sum(dim=dims)


def _as_channels(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


def _sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    reduced = _core.allreduce(tensor.detach().to("cpu", torch.float64).numpy(), op=_core.Sum)
    return torch.from_numpy(np.asarray(reduced)).to(tensor.device)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        x = input.contiguous()
        count = x.numel() // x.shape[1]
        local = torch.cat([_channel_sum(x).double(), _channel_sum(x.double() * x.double()),
                           torch.tensor([float(count)], dtype=torch.float64, device=x.device)])
        total = _sum_over_ranks(local)
        c = x.shape[1]
        n = float(total[-1])
        mean = total[:c] / n
        var = (total[c:2 * c] / n - mean * mean).clamp_min(0.0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            unbiased = var * (n / max(n - 1.0, 1.0))
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_t, invstd_t = mean.to(x.dtype), invstd.to(x.dtype)
        xhat = (x - _as_channels(mean_t, x)) * _as_channels(invstd_t, x)
        ctx.save_for_backward(xhat, weight, invstd_t)
        ctx.total_count = n
        return xhat * _as_channels(weight, x) + _as_channels(bias, x)

    @staticmethod
    def backward(ctx, grad_output):
        xhat, weight, invstd = ctx.saved_tensors
        dy = grad_output.contiguous()
        grad_bias = _channel_sum(dy)
        grad_weight = _channel_sum(dy * xhat)
        # The input gradient needs the sums over every rank's batch.
        c = dy.shape[1]
        total = _sum_over_ranks(torch.cat([grad_bias.double(), grad_weight.double()]))
        sum_dy = total[:c].to(dy.dtype)
        sum_dy_xhat = total[c:].to(dy.dtype)
        n = ctx.total_count
        grad_input = _as_channels(weight * invstd, dy) * (
            dy - _as_channels(sum_dy / n, dy) - xhat * _as_channels(sum_dy_xhat / n, dy))
        return grad_input, grad_weight, grad_bias, None, None, None, None
