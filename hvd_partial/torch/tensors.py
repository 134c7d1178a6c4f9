"""Moving torch tensors to the host numpy arrays the engine reduces, and results back.

CPU tensors travel as numpy views of their own memory (no copy here; the
engine's fusion makes the single copy). CUDA tensors are copied once into
pinned host buffers that are kept and reused between steps, and each result
goes back to the device with one host-to-device copy per fused buffer.
``to_host`` returns once the copies are done; ``to_host_async`` (a bucket
staged during the backward pass) queues them on a side stream of the device,
after the work queued so far, and returns what tells when they are done, so
the backward pass goes on while they run.

Example::

    staging = HostStaging()
    arrays = staging.to_host([p.grad for p in params], names)
    arrays, copied = staging.to_host_async([p.grad for p in bucket], names)   # copied.query(), .synchronize()
    grads = staging.from_host(result.arrays, [(p.device, p.dtype, p.shape) for p in params])
"""

from __future__ import annotations

import logging
from typing import Protocol

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


class CopyDone(Protocol):
    """Tells when a staging's copies to the host are done (``torch.cuda.Event``'s two calls)."""

    def query(self) -> bool:
        """True when the copies are done (never waits)."""

    def synchronize(self) -> None:
        """Wait until the copies are done."""


class Copied:
    """The copies were done when the staging returned (CPU tensors, other devices)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class DeviceCopies:
    """Copies queued on side streams: one event recorded after them on each stream."""

    def __init__(self, events: list):
        self.events = events

    def query(self) -> bool:
        return all(event.query() for event in self.events)

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()  # waits without the GIL


class HostStaging:
    """Staging of a fixed list of tensors (slot ``i`` is always the same tensor's
    role, e.g. one parameter's gradient) between their devices and the host.

    Pinned buffers for CUDA tensors are allocated on first use and reused; the
    caller must not stage again until the engine is done with the previous
    arrays (``synchronize`` returned), which the optimizer guarantees.
    """

    def __init__(self, side_streams: dict | None = None):
        self._pinned: dict[int, torch.Tensor] = {}
        #: device -> the stream ``to_host_async`` copies on (shared by one optimizer's buckets: one order of copies)
        self._side_streams: dict = {} if side_streams is None else side_streams

    def to_host(self, tensors, names=None) -> list[np.ndarray]:
        """C-contiguous numpy arrays holding ``tensors`` (views for CPU tensors)."""
        out, devices = self._stage(tensors, names, side=False)
        for device in devices:
            # The copies were asynchronous: the engine may read the pinned
            # buffers as soon as they are posted.
            torch.cuda.current_stream(device).synchronize()
        return out

    def to_host_async(self, tensors, names=None) -> tuple[list[np.ndarray], CopyDone]:
        """As ``to_host``, but CUDA tensors are copied on a side stream of their
        device after the work queued so far, without waiting: the arrays may be
        read once the returned ``CopyDone`` says so."""
        out, devices = self._stage(tensors, names, side=True)
        if not devices:
            return out, Copied()
        events = []
        for device in devices:
            event = torch.cuda.Event()
            event.record(self._side_streams[device])
            events.append(event)
        return out, DeviceCopies(events)

    def _stage(self, tensors, names, side: bool) -> tuple[list[np.ndarray], set]:
        """The host arrays, and the CUDA devices whose copies were queued (on side
        streams where ``side``, else on their current streams)."""
        out = []
        devices: set = set()
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
                if side:
                    stream = self._side_stream(t.device)
                    with torch.cuda.stream(stream):
                        buf.copy_(t, non_blocking=True)
                    t.record_stream(stream)  # t (maybe a temporary cast) outlives the queued copy
                else:
                    buf.copy_(t, non_blocking=True)
                devices.add(t.device)
                out.append(buf.numpy())
            else:
                # Other accelerators (mps, xpu): a plain blocking copy.
                out.append(t.to("cpu").contiguous().numpy())
        return out, devices

    def _side_stream(self, device):
        """``device``'s side stream, made to wait for the work queued so far on the
        device's current stream (the gradient as computed, and its cast if any)."""
        stream = self._side_streams.get(device)
        if stream is None:
            stream = self._side_streams[device] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        return stream

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
