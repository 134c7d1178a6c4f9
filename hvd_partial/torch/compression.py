"""Gradient compression applied before a tensor is reduced (Horovod's interface).

Example::

    opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
"""

from __future__ import annotations

import torch


class Compressor:
    """Turns a tensor into the tensor that is reduced, and back.

    ``compress(tensor)`` returns ``(wire_tensor, ctx)``; ``decompress(wire, ctx)``
    returns a tensor like the original. Subclass it for your own scheme; it must
    be deterministic, since every rank decompresses the same reduced value.
    """

    def compress(self, tensor: torch.Tensor):
        raise NotImplementedError

    def decompress(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: the tensor is reduced as it is."""

    def compress(self, tensor):
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor

    def __repr__(self) -> str:
        return "Compression.none"


class FP16Compressor(Compressor):
    """Floating-point tensors travel and are summed as float16 (half the bytes);
    other dtypes pass unchanged. The result is cast back to the original dtype.

    Float16 sums overflow above 65504: scale the loss if gradients are large.
    """

    def compress(self, tensor):
        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    def __repr__(self) -> str:
        return "Compression.fp16"


class Compression:
    """The built-in compressors, named as in Horovod.

    Example::

        hvd.allreduce(t, compression=hvd.Compression.fp16)
    """

    none = NoneCompressor()
    fp16 = FP16Compressor()
