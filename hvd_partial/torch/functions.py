"""Horovod-style collectives on torch tensors: allreduce, broadcast, and the
helpers that start every rank from the same model and optimizer state.

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    mean_loss = hvd.allreduce(loss.detach(), name="loss")
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import numpy as np
import torch

import hvd_partial as _core
from ..errors import MismatchError, UnsupportedInputError
from ..modes import ReduceOp, Sync
from .compression import Compression
from .tensors import HostStaging, to_cpu_tree

log = logging.getLogger("hvd_partial.torch")

_slots_lock = threading.Lock()
_busy_slots: dict[tuple, set[int]] = {}  # stream key -> slots with a post in flight


class TorchHandle:
    """A tensor allreduce in flight; pass it to :func:`synchronize` or :func:`poll`."""

    __slots__ = ("inner", "key", "slot", "like", "ctx", "compression", "postscale", "output", "_result")

    def __init__(self, inner, key, slot, like, ctx, compression, postscale, output):
        self.inner = inner
        self.key = key
        self.slot = slot
        self.like = like  # (device, dtype, shape) of the input
        self.ctx = ctx
        self.compression = compression
        self.postscale = postscale
        self.output = output  # the tensor to write in place, or None
        self._result = None

    def __repr__(self) -> str:
        return f"<hvd_partial.torch handle {self.key[0]!r} {'done' if self.inner.done() else 'pending'}>"


def _resolve_op(average, op) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError("pass either op= or the deprecated average=, not both")
    if op is None:
        return ReduceOp.AVERAGE if average in (None, True) else ReduceOp.SUM
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be hvd_partial.torch.Average or Sum, got {op!r}")
    return op


def allreduce_async(tensor: torch.Tensor, average=None, name: str | None = None, op=None,
                    compression=Compression.none, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0) -> TorchHandle:
    """Start a synchronous (Horovod-semantics) allreduce of ``tensor``; returns a
    handle. The result is a new tensor on ``tensor``'s device and dtype.

    Calls with the same ``name`` (or, unnamed, the same shape and dtype) reuse one
    stream; every rank must make the same calls in the same order.

    Example::

        handle = hvd.allreduce_async(t, name="metric")
        ...
        mean = hvd.synchronize(handle)
    """
    return _allreduce_async(tensor, average, name, op, compression, prescale_factor, postscale_factor, None)


def allreduce_async_(tensor: torch.Tensor, average=None, name: str | None = None, op=None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> TorchHandle:
    """In-place :func:`allreduce_async`: ``synchronize`` writes the result into ``tensor``.

    Example::

        hvd.synchronize(hvd.allreduce_async_(t))
    """
    return _allreduce_async(tensor, average, name, op, Compression.none, prescale_factor, postscale_factor, tensor)


def allreduce(tensor: torch.Tensor, average=None, name: str | None = None, op=None,
              compression=Compression.none, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> torch.Tensor:
    """Average (``op=Average``, the default) or sum ``tensor`` over all ranks.

    Example::

        mean_loss = hvd.allreduce(loss.detach(), name="loss")
    """
    return synchronize(allreduce_async(tensor, average, name, op, compression, prescale_factor, postscale_factor))


def allreduce_(tensor: torch.Tensor, average=None, name: str | None = None, op=None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``.

    Example::

        hvd.allreduce_(counts, op=hvd.Sum)
    """
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def _allreduce_async(tensor, average, name, op, compression, prescale, postscale, output) -> TorchHandle:
    if not isinstance(tensor, torch.Tensor):
        raise UnsupportedInputError(f"allreduce expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise UnsupportedInputError(f"allreduce({name or ''}): sparse tensors are not supported; "
                                    "pass tensor.to_dense()")
    op = _resolve_op(average, op)
    wire, ctx = compression.compress(tensor.detach())
    if prescale != 1.0:
        wire = wire * prescale
    (array,) = HostStaging().to_host([wire], [f"allreduce({name or ''})"])
    # One stream per (name, shape, dtype, op): a name may be reused with other
    # shapes, and concurrent unnamed calls of the same kind get their own slot,
    # numbered in call order (identical on every rank).
    key = (name or "", tuple(array.shape), array.dtype.str, op.value)
    with _slots_lock:
        busy = _busy_slots.setdefault(key, set())
        slot = 0
        while slot in busy:
            slot += 1
        busy.add(slot)
    stream = f"torch.allreduce/{key[0] or '-'}/{'x'.join(map(str, key[1])) or 'scalar'}/{key[2]}/{key[3]}/{slot}"
    try:
        inner = _core.partial_allreduce_async(array, stream, mode=Sync(), op=op)
    except BaseException:
        _release(key, slot)
        raise
    return TorchHandle(inner, key, slot, (tensor.device, tensor.dtype, tensor.shape), ctx, compression, postscale,
                       output)


def _release(key, slot) -> None:
    with _slots_lock:
        _busy_slots.get(key, set()).discard(slot)


def poll(handle) -> bool:
    """True when ``synchronize(handle)`` would not wait."""
    inner = handle.inner if isinstance(handle, TorchHandle) else handle
    return _core.poll(inner)


def synchronize(handle):
    """Wait for an allreduce started with :func:`allreduce_async` and return its
    result tensor (numpy-level handles return their rounds, as in ``hvd_partial``).

    Example::

        out = hvd.synchronize(hvd.allreduce_async(t))
    """
    if not isinstance(handle, TorchHandle):
        return _core.synchronize(handle)
    if handle._result is not None:
        return handle._result
    try:
        results = _core.synchronize(handle.inner)
    finally:
        _release(handle.key, handle.slot)
    array = results[-1].array
    (out,) = HostStaging.from_host([array], [(handle.like[0], _torch_dtype(array), handle.like[2])])
    out = handle.compression.decompress(out, handle.ctx)
    if out.dtype != handle.like[1]:
        out = out.to(handle.like[1])
    if handle.postscale != 1.0:
        out = out * handle.postscale
    if handle.output is not None:
        with torch.no_grad():
            handle.output.copy_(out)
        out = handle.output
    handle._result = out
    return out


def _torch_dtype(array: np.ndarray) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype


# ===== broadcast =========================================================================

def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank (a new tensor).

    Example::

        seed = hvd.broadcast(torch.tensor([seed]), root_rank=0)
    """
    out = tensor.detach().clone()
    _broadcast_into([(name or "tensor", out)], root_rank, f"broadcast({name or ''})")
    return out


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``.

    Example::

        hvd.broadcast_(weights, root_rank=0)
    """
    _broadcast_into([(name or "tensor", tensor)], root_rank, f"broadcast_({name or ''})")
    return tensor


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Copy ``root_rank``'s parameters (and buffers) into every rank's, in place.

    ``params`` is a ``model.state_dict()``, ``model.named_parameters()``, or a
    list of tensors. All tensors travel in one fused broadcast; every rank first
    checks that names, shapes and dtypes agree (``MismatchError`` on every rank
    otherwise).

    Example::

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = []
        for i, item in enumerate(params):
            if isinstance(item, tuple) and len(item) == 2:
                items.append((str(item[0]), item[1]))
            else:
                items.append((f"params[{i}]", item))
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise UnsupportedInputError(f"broadcast_parameters: {name} is a {type(t).__name__}, not a tensor")
    _broadcast_into(items, root_rank, "broadcast_parameters")


def _broadcast_into(items, root_rank: int, what: str) -> None:
    size = _core.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise ValueError(f"{what}: root_rank must be in [0, {size}), got {root_rank!r}")
    signature = [(name, tuple(t.shape), str(t.dtype).replace("torch.", "")) for name, t in items]
    everyone = _core.allgather_object(signature)
    _check_same(everyone, root_rank, what)
    # Raw bytes, so that every dtype (bool, bfloat16, complex) travels; each
    # tensor starts on a 16-byte boundary so its bytes can be viewed in place.
    offsets, total = [], 0
    for _, t in items:
        offsets.append(total)
        total += (t.numel() * t.element_size() + 15) // 16 * 16
    buf = np.zeros(max(total, 1), dtype=np.uint8)
    if _core.rank() == root_rank:
        for (_, t), off in zip(items, offsets):
            raw = _bytes_of(t)
            buf[off:off + raw.size] = raw
    out = _core.broadcast(buf, root_rank, name=what)
    if _core.rank() == root_rank:
        return
    with torch.no_grad():
        for (_, t), off in zip(items, offsets):
            n = t.numel() * t.element_size()
            if n == 0:
                continue
            src = torch.from_numpy(out[off:off + n]).view(t.dtype).view(t.shape)
            t.copy_(src)


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return np.zeros(0, dtype=np.uint8)
    return flat.view(torch.uint8).numpy()


def _check_same(everyone, root_rank: int, what: str) -> None:
    reference = everyone[root_rank]
    problems = []
    for rank, sig in enumerate(everyone):
        if sig == reference:
            continue
        if len(sig) != len(reference):
            problems.append(f"rank {rank} has {len(sig)} tensors, root rank {root_rank} has {len(reference)}")
            continue
        for mine, theirs in zip(sig, reference):
            if mine != theirs:
                problems.append(f"rank {rank} has {mine[0]} {list(mine[1])} {mine[2]} where root rank {root_rank} "
                                f"has {theirs[0]} {list(theirs[1])} {theirs[2]}")
                break
    if problems:
        raise MismatchError(f"{what}: ranks disagree: " + "; ".join(problems))


def broadcast_optimizer_state(optimizer, root_rank: int = 0) -> None:
    """Make every rank's optimizer state (slots, hyperparameters, and for a
    :class:`DistributedOptimizer` its round counter) equal to ``root_rank``'s.

    Example::

        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """
    if not hasattr(optimizer, "state_dict") or not hasattr(optimizer, "load_state_dict"):
        raise UnsupportedInputError(f"broadcast_optimizer_state expects an optimizer, got {type(optimizer).__name__}")
    groups = optimizer.param_groups
    signature = [[(tuple(p.shape), str(p.dtype).replace("torch.", "")) for p in g["params"]] for g in groups]
    everyone = _core.allgather_object(signature)
    bad = [r for r, s in enumerate(everyone) if s != everyone[root_rank]]
    if bad:
        raise MismatchError(f"broadcast_optimizer_state: the parameters of the optimizer on ranks {bad} differ "
                            f"from root rank {root_rank}'s (groups, shapes or dtypes)")
    state = to_cpu_tree(optimizer.state_dict()) if _core.rank() == root_rank else None
    state = _core.broadcast_object(state, root_rank)
    if _core.rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank: int = 0, name: str | None = None):
    """Return ``root_rank``'s picklable ``obj`` on every rank (tensors included).

    Example::

        epoch = hvd.broadcast_object(epoch, root_rank=0)
    """
    return _core.broadcast_object(obj, root_rank)


def allgather_object(obj, name: str | None = None) -> list:
    """Return every rank's picklable ``obj``, in rank order.

    Example::

        losses = hvd.allgather_object(float(loss))
    """
    return _core.allgather_object(obj)
