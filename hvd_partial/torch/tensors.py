"""Moving torch tensors to the host numpy arrays the engine reduces, and results back.

CPU tensors travel as numpy views of their own memory (no copy here; the
engine's fusion makes the single copy). CUDA tensors are copied once into
pinned host buffers that are kept and reused between steps, and each result
goes back to the device with one host-to-device copy per fused buffer.

Example::

    staging = HostStaging()
    arrays = staging.to_host([p.grad for p in params], names)
    grads = staging.from_host(result.arrays, [(p.device, p.dtype, p.shape) for p in params])
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..errors import UnsupportedInputError

log = logging.getLogger("hvd_partial.torch")

# dtypes the engine reduces natively (numpy has them and MPI sums them).
_NATIVE = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int32: np.int32, torch.int64: np.int64,
}
# numpy has no bfloat16: such tensors are reduced in float32 and cast back.
_WIDENED = {torch.bfloat16: torch.float32}


def wire_dtype(dtype: torch.dtype, what: str = "tensor") -> torch.dtype:
    """The dtype a tensor of ``dtype`` is reduced in, or UnsupportedInputError."""
    if dtype in _NATIVE:
        return dtype
    if dtype in _WIDENED:
        return _WIDENED[dtype]
    supported = ", ".join(str(d).replace("torch.", "") for d in [*_NATIVE, *_WIDENED])
    raise UnsupportedInputError(f"{what} has dtype {str(dtype).replace('torch.', '')}, which hvd_partial cannot "
                                f"reduce; supported: {supported}")


class HostStaging:
    """Staging of a fixed list of tensors (slot ``i`` is always the same tensor's
    role, e.g. one parameter's gradient) between their devices and the host.

    Pinned buffers for CUDA tensors are allocated on first use and reused; the
    caller must not stage again until the engine is done with the previous
    arrays (``synchronize`` returned), which the optimizer guarantees.
    """

    def __init__(self):
        self._pinned: dict[int, torch.Tensor] = {}

    def to_host(self, tensors, names=None) -> list[np.ndarray]:
        """C-contiguous numpy arrays holding ``tensors`` (views for CPU tensors)."""
        out = []
        devices = set()
        for i, t in enumerate(tensors):
            what = names[i] if names is not None else f"tensor {i}"
            t = t.detach()
            wire = wire_dtype(t.dtype, what)
            if t.dtype != wire:
                t = t.to(wire)
            if t.is_conj() or t.is_neg():
                t = t.resolve_conj().resolve_neg()
            if t.device.type == "cpu":
                out.append(t.contiguous().numpy())
            elif t.device.type == "cuda":
                buf = self._pinned.get(i)
                if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    self._pinned[i] = buf
                buf.copy_(t, non_blocking=True)
                devices.add(t.device)
                out.append(buf.numpy())
            else:
                # Other accelerators (mps, xpu): a plain blocking copy.
                out.append(t.to("cpu").contiguous().numpy())
        for device in devices:
            # The copies above were asynchronous: the engine may read the
            # pinned buffers as soon as they are posted.
            torch.cuda.current_stream(device).synchronize()
        return out

    @staticmethod
    def from_host(arrays, targets) -> list[torch.Tensor]:
        """Tensors for ``arrays`` on each target ``(device, dtype, shape)``.

        CPU results are zero-copy views of the arrays (which the caller owns);
        device results are uploaded once per fused buffer, then sliced.
        """
        out = []
        uploads: dict[tuple, torch.Tensor] = {}
        for a, (device, dtype, shape) in zip(arrays, targets):
            device = torch.device(device)
            if device.type == "cpu":
                t = torch.from_numpy(a)
            else:
                t = upload_slice(a, device, uploads)
            if t.dtype != dtype:
                t = t.to(dtype)
            out.append(t.view(shape))
        return out


def upload_slice(a: np.ndarray, device: torch.device, uploads: dict) -> torch.Tensor:
    """``a`` on ``device``; when ``a`` is a view of a larger contiguous buffer
    (the engine's fused result), that buffer is uploaded only once."""
    base = a.base
    if isinstance(base, np.ndarray) and base.flags.c_contiguous and base.dtype == a.dtype and base.ndim == 1:
        key = (id(base), str(device))
        dev = uploads.get(key)
        if dev is None:
            dev = torch.from_numpy(base).to(device, non_blocking=False)
            uploads[key] = dev
        offset = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // a.itemsize
        return dev[offset:offset + a.size]
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def to_cpu_tree(value):
    """A copy of a nested structure (dicts, lists, tuples) with every tensor on
    the CPU, so it can be pickled and loaded on any rank's device."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {k: to_cpu_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu_tree(v) for v in value)
    return value
