"""Horovod's tensor collectives on torch tensors, over the negotiated helper
collectives of :mod:`hvd_partial.collectives`.

Every call is matched across ranks by name (unnamed calls are numbered in
call order) and checked for shape, dtype, op and root before data moves: a
mismatch raises the same ``MismatchError`` on every rank instead of hanging.
Results are new tensors on the input's device and dtype (the ``*_`` forms
write into the input). ``allreduce``, ``allgather`` and ``broadcast`` are
differentiable, as in Horovod.

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    mean_loss = hvd.allreduce(loss.detach(), name="loss")
    rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())))
    handle = hvd.allreduce_async(t, op=hvd.Max)
    biggest = hvd.synchronize(handle)
"""

from __future__ import annotations

import numpy as np
import torch

import hvd_partial as _core
from .. import collectives as _c
from ..collectives.process_sets import global_process_set, members_size, resolve
from ..engine.handle import Handle
from ..errors import UnsupportedInputError
from ..modes import ReduceOp
from .compression import Compression

Average, Sum, Min, Max, Product, Adasum = (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX,
                                          ReduceOp.PRODUCT, ReduceOp.ADASUM)

# torch dtypes numpy lacks travel as same-width integers (data movement) or
# float32 (reductions).
_BITS = {torch.bfloat16: torch.int16}
_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64, torch.int8: np.int8,
          torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
          torch.bool: np.bool_}


class TorchHandle:
    """A tensor collective in flight; pass it to :func:`synchronize` or :func:`poll`."""

    __slots__ = ("inner", "convert", "_result", "_done")

    def __init__(self, inner: Handle, convert):
        self.inner = inner
        self.convert = convert  # the core result -> what synchronize returns
        self._result = None
        self._done = False

    def wait(self):
        return synchronize(self)

    def __call__(self):
        """Wait and return the result (Horovod's ``sparse_allreduce_async`` hands back a callable)."""
        return synchronize(self)

    def __repr__(self) -> str:
        return f"<hvd_partial.torch handle {self.inner.name!r} {'done' if self.inner.done() else 'pending'}>"


def poll(handle) -> bool:
    """True when ``synchronize(handle)`` would not wait."""
    inner = handle.inner if isinstance(handle, TorchHandle) else handle
    return _core.poll(inner)


def synchronize(handle):
    """Wait for an asynchronous collective and return its result (a tensor,
    a list of tensors, or ``(tensor, received_splits)`` for alltoall with
    splits). Numpy-level handles return what ``hvd_partial.synchronize`` does.

    Example::

        out = hvd.synchronize(hvd.allreduce_async(t))
    """
    if not isinstance(handle, TorchHandle):
        return _core.synchronize(handle)
    if not handle._done:
        handle._result = handle.convert(_core.synchronize(handle.inner))
        handle._done = True
    return handle._result


# ===== tensors <-> arrays =====================================================================

def _check_tensor(tensor, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise UnsupportedInputError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise UnsupportedInputError(f"{what}: sparse tensors are not supported here; use sparse_allreduce_async "
                                    "or tensor.to_dense()")
    return tensor


def _for_reduction(tensor: torch.Tensor, what: str) -> np.ndarray:
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    if t.dtype not in _NUMPY or t.dtype == torch.bool:
        raise UnsupportedInputError(f"{what}: cannot reduce tensors of dtype {str(t.dtype).replace('torch.', '')}")
    return t.to("cpu").contiguous().resolve_conj().resolve_neg().numpy()


def _for_bytes(tensor: torch.Tensor, what: str) -> np.ndarray:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype in _BITS:
        t = t.view(_BITS[t.dtype])
    if t.dtype not in _NUMPY:
        raise UnsupportedInputError(f"{what}: tensors of dtype {str(t.dtype).replace('torch.', '')} are not "
                                    "supported")
    return t.resolve_conj().resolve_neg().numpy()


def _back(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    out = torch.from_numpy(np.ascontiguousarray(array).reshape(np.shape(array)))  # 0-dim stays 0-dim
    if like.dtype in _BITS and out.dtype == _BITS[like.dtype]:
        out = out.view(like.dtype)
    if out.dtype != like.dtype:
        out = out.to(like.dtype)
    return out.to(like.device) if like.device.type != "cpu" else out


def _resolve_op(average, op, what: str) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError(f"{what}: the op parameter supersedes average; pass one of them")
    if op is None:
        return Average if average in (None, True) else Sum
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{what}: op must be one of hvd.Average, Sum, Min, Max, Product, got {op!r}")
    return op


# ===== allreduce ==============================================================================

def _allreduce_async(tensor, output, average, name, op, compression, prescale, postscale, process_set):
    what = f"allreduce({name or ''})"
    tensor = _check_tensor(tensor, what)
    op = _resolve_op(average, op, what)
    wire, ctx = compression.compress(tensor.detach())
    inner = _c.allreduce_async(_for_reduction(wire, what), name, op, prescale, postscale, process_set)

    def convert(array):
        out = compression.decompress(_back(array, wire), ctx)
        out = out.to(tensor.dtype) if out.dtype != tensor.dtype else out
        out = out.to(tensor.device) if out.device != tensor.device else out
        if output is not None:
            with torch.no_grad():
                output.copy_(out.view(output.shape))
            return output
        return out.view(tensor.shape)

    return TorchHandle(inner, convert)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set) -> TorchHandle:
    """Start an allreduce of ``tensor`` (``op``: Average by default, Sum, Min,
    Max, Product; Adasum is refused); ``synchronize`` returns a new tensor.

    Example::

        handle = hvd.allreduce_async(t, name="metric")
        mean = hvd.synchronize(handle)
    """
    return _allreduce_async(tensor, None, average, name, op, Compression.none, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set) -> TorchHandle:
    """In-place :func:`allreduce_async`: ``synchronize`` writes the result into ``tensor``."""
    return _allreduce_async(tensor, tensor, average, name, op, Compression.none, prescale_factor, postscale_factor,
                            process_set)


class _AllreduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, compression, prescale, postscale, process_set):
        ctx.args = (average, op, prescale, postscale, process_set)
        return synchronize(_allreduce_async(tensor, None, average, name, op, compression, prescale, postscale,
                                            process_set))

    @staticmethod
    def backward(ctx, grad_output):
        average, op, prescale, postscale, process_set = ctx.args
        grad = synchronize(_allreduce_async(grad_output, None, average, None, op, Compression.none, prescale,
                                            postscale, process_set))
        return grad, None, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks; a new tensor on its device and dtype.

    Example::

        mean_loss = hvd.allreduce(loss.detach(), name="loss")
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _AllreduceGrad.apply(tensor, average, name, op, compression, prescale_factor, postscale_factor,
                                    process_set)
    return synchronize(_allreduce_async(tensor, None, average, name, op, compression, prescale_factor,
                                        postscale_factor, process_set))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _grouped_async(tensors, outputs, average, name, op, compression, prescale, postscale, process_set):
    what = f"grouped_allreduce({name or ''})"
    tensors = [_check_tensor(t, what) for t in tensors]
    op = _resolve_op(average, op, what)
    wires = [compression.compress(t.detach()) for t in tensors]
    inner = _c.grouped_allreduce_async([_for_reduction(w, what) for w, _ in wires], name, op, prescale, postscale,
                                       process_set)

    def convert(arrays):
        out = []
        for i, (array, (wire, ctx), t) in enumerate(zip(arrays, wires, tensors)):
            r = compression.decompress(_back(array, wire), ctx).to(t.dtype).to(t.device).view(t.shape)
            if outputs is not None:
                with torch.no_grad():
                    outputs[i].copy_(r)
                r = outputs[i]
            out.append(r)
        return out

    return TorchHandle(inner, convert)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set) -> TorchHandle:
    """Start one negotiated allreduce of a list of tensors; ``synchronize`` returns a list."""
    return _grouped_async(tensors, None, average, name, op, Compression.none, prescale_factor, postscale_factor,
                          process_set)


class _GroupedAllreduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, compression, prescale, postscale, process_set, *tensors):
        ctx.args = (average, op, prescale, postscale, process_set)
        return tuple(synchronize(_grouped_async(list(tensors), None, average, name, op, compression, prescale,
                                                postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        average, op, prescale, postscale, process_set = ctx.args
        reduced = synchronize(_grouped_async(list(grads), None, average, None, op, Compression.none, prescale,
                                             postscale, process_set))
        return (None,) * 7 + tuple(reduced)


def _wants_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set) -> list:
    """Reduce a list of tensors as one collective; returns new tensors
    (differentiable: the gradient is reduced the same way).

    Example::

        w, b = hvd.grouped_allreduce([w_grad, b_grad])
    """
    tensors = list(tensors)
    if _wants_grad(tensors):
        return list(_GroupedAllreduceGrad.apply(average, name, op, compression, prescale_factor, postscale_factor,
                                                process_set, *tensors))
    return synchronize(_grouped_async(tensors, None, average, name, op, compression, prescale_factor,
                                      postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> TorchHandle:
    """In-place :func:`grouped_allreduce_async`."""
    return _grouped_async(tensors, list(tensors), average, name, op, Compression.none, prescale_factor,
                          postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set) -> list:
    """In-place :func:`grouped_allreduce`; returns the input tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> TorchHandle:
    """Reduce a sparse COO tensor the way Horovod does: allgather the indices
    and values of every rank, then build the (uncoalesced) sum, divided by
    the number of ranks for ``op=Average``.

    Example::

        grad = hvd.synchronize(hvd.sparse_allreduce_async(emb.weight.grad, "emb", hvd.Average))
    """
    what = f"sparse_allreduce({name or ''})"
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise UnsupportedInputError(f"{what} expects a sparse COO tensor")
    op = _resolve_op(None, op, what)
    if op not in (Average, Sum):
        raise UnsupportedInputError(f"{what}: sparse allreduce supports op=Average and op=Sum, got {op!r}")
    _, ranks = resolve(process_set, what)
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()  # rows of indices, so the allgather concatenates them
    values = t.values()
    index_handle = allgather_async(indices, None if name is None else f"{name}.indices", process_set)
    value_handle = allgather_async(values, None if name is None else f"{name}.values", process_set)

    def convert(_):
        all_indices = synchronize(index_handle).t()
        all_values = synchronize(value_handle)
        if op is Average:
            all_values = all_values / members_size(ranks)
        return torch.sparse_coo_tensor(all_indices, all_values, t.shape, device=tensor.device)

    return TorchHandle(value_handle.inner, convert)


# ===== allgather =================================================================================

def _allgather_async(tensor, name, process_set):
    what = f"allgather({name or ''})"
    tensor = _check_tensor(tensor, what)
    if tensor.dim() == 0:
        raise UnsupportedInputError(f"{what}: needs a tensor of at least one dimension, got a scalar")
    array = _for_bytes(tensor, what)
    return TorchHandle(_c.allgather_async(array, name, process_set), lambda out: _back(out, tensor))


def allgather_async(tensor, name=None, process_set=global_process_set) -> TorchHandle:
    """Start concatenating every rank's ``tensor`` along dimension 0 (which may differ)."""
    return _allgather_async(tensor, name, process_set)


def _row_offset(rows: int, name: str, process_set) -> int:
    """Where this rank's ``rows`` start in an allgather's result (on ``process_set``)."""
    everyone = _core.allgather(np.array([rows], dtype=np.int64), name=name, process_set=process_set)
    return int(everyone[:(process_set or global_process_set).rank()].sum())


class _AllgatherGrad(torch.autograd.Function):
    """Horovod's gradient: the average over ranks of the result's gradient,
    this rank's rows of it."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(_allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(_allreduce_async(grad_output, None, None, None, Average, Compression.none, 1.0, 1.0,
                                            ctx.process_set))
        start = _row_offset(ctx.rows, None, ctx.process_set)
        return grad[start:start + ctx.rows], None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0, in rank order.

    Example::

        everyone = hvd.allgather(torch.tensor([hvd.rank()]))
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherGrad.apply(tensor, name, process_set)
    return synchronize(_allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> TorchHandle:
    """Start allgathers of a list of tensors; ``synchronize`` returns the list."""
    handles = [_allgather_async(t, None if name is None else f"{name}.{i}", process_set)
               for i, t in enumerate(tensors)]
    if not handles:
        raise UnsupportedInputError("grouped_allgather needs at least one tensor")
    return TorchHandle(handles[-1].inner, lambda _: [synchronize(h) for h in handles])


class _GroupedAllgatherGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = synchronize(_grouped_async(list(grads), None, None, None, Average, Compression.none, 1.0, 1.0,
                                             ctx.process_set))
        everyone = _core.allgather(np.array([ctx.rows], dtype=np.int64), process_set=ctx.process_set)
        starts = everyone[:(ctx.process_set or global_process_set).rank()].sum(axis=0)  # (set size, tensors)
        return (None, None) + tuple(g[int(s):int(s) + n] for g, s, n in zip(reduced, starts, ctx.rows))


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """Allgather each tensor of a list; returns the list of results
    (differentiable, as :func:`allgather`)."""
    tensors = list(tensors)
    if _wants_grad(tensors):
        return list(_GroupedAllgatherGrad.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ===== broadcast ===================================================================================

def _broadcast_async(tensor, output, root_rank, name, process_set):
    what = f"broadcast({name or ''})"
    tensor = _check_tensor(tensor, what)
    array = _for_bytes(tensor, what)

    def convert(out):
        result = _back(out, tensor)
        if output is not None:
            with torch.no_grad():
                output.copy_(result)
            return output
        return result

    return TorchHandle(_c.broadcast_async(array, root_rank, name, process_set), convert)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> TorchHandle:
    """Start a broadcast of ``root_rank``'s ``tensor``; ``synchronize`` returns a new tensor."""
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> TorchHandle:
    """In-place :func:`broadcast_async`."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class _BroadcastGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(_broadcast_async(tensor, None, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(_allreduce_async(grad_output, None, None, None, Average, Compression.none, 1.0, 1.0,
                                            ctx.process_set))
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every rank (a new tensor).

    Example::

        seed = hvd.broadcast(torch.tensor([seed]), root_rank=0)
    """
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastGrad.apply(tensor, root_rank, name, process_set)
    return synchronize(_broadcast_async(tensor, None, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """In-place :func:`broadcast`; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ===== alltoall, reducescatter ==========================================================================

def _alltoall_async(tensor, splits, name, process_set, with_splits: bool) -> TorchHandle:
    what = f"alltoall({name or ''})"
    tensor = _check_tensor(tensor, what)
    if isinstance(splits, torch.Tensor):
        splits = splits.detach().to("cpu").tolist()
    array = _for_bytes(tensor, what)

    def convert(result):
        out, received = result
        out = _back(out, tensor)
        return (out, torch.from_numpy(np.asarray(received, dtype=np.int32))) if with_splits else out

    return TorchHandle(_c.alltoall_async(array, splits, name, process_set), convert)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> TorchHandle:
    """Start an alltoall: rows ``splits[j]`` go to rank ``j`` (equal parts
    without ``splits``). ``synchronize`` returns the received tensor, or
    ``(received, received_splits)`` when ``splits`` was given."""
    return _alltoall_async(tensor, splits, name, process_set, splits is not None)


class _AlltoallGrad(torch.autograd.Function):
    """The gradient goes back where the rows came from: an alltoall of it
    with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = synchronize(_alltoall_async(tensor, splits, name, process_set, True))
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _received_grad):
        grad, _ = synchronize(_alltoall_async(grad_output.contiguous(), ctx.received, None, ctx.process_set, True))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter slices of ``tensor`` to every rank and gather theirs
    (differentiable).

    Example::

        out, received_splits = hvd.alltoall(t, splits=torch.tensor([1, 3]))
    """
    if _wants_grad([tensor]):
        out, received = _AlltoallGrad.apply(tensor, splits, name, process_set)
        return out if splits is None else (out, received)
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0) -> TorchHandle:
    """Start a reduction whose result is split along dimension 0 across ranks
    (the first ``dim0 % size`` ranks get one row more); Average or Sum."""
    what = f"reducescatter({name or ''})"
    tensor = _check_tensor(tensor, what)
    inner = _c.reducescatter_async(_for_reduction(tensor, what), name, op, process_set, prescale_factor,
                                   postscale_factor)
    return TorchHandle(inner, lambda out: _back(out, tensor))


def _scatter_grad_scale(op, prescale, postscale, process_set) -> float:
    """Horovod's factor on a reducescatter's gradient before it is allgathered
    back: the number of ranks (of the process set) for Sum, times the scale factors."""
    return (members_size(resolve(process_set, "reducescatter")[1]) if op is Sum else 1.0) * prescale * postscale


class _ReducescatterGrad(torch.autograd.Function):
    """Horovod's gradient: every rank's share of the result's gradient,
    allgathered back to the input's shape (times the ranks for Sum, and the
    scale factors)."""

    @staticmethod
    def forward(ctx, tensor, name, compression, op, process_set, prescale, postscale):
        ctx.scale = _scatter_grad_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return _reducescatter(tensor, name, compression, op, process_set, prescale, postscale)

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output * ctx.scale if ctx.scale != 1.0 else grad_output
        return synchronize(_allgather_async(grad, None, ctx.process_set)), None, None, None, None, None, None


def _reducescatter(tensor, name, compression, op, process_set, prescale, postscale) -> torch.Tensor:
    wire, ctx = compression.compress(tensor.detach()) if isinstance(tensor, torch.Tensor) else (tensor, None)
    out = synchronize(reducescatter_async(wire, name, op, process_set, prescale, postscale))
    return compression.decompress(out, ctx).to(tensor.dtype)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over ranks and keep this rank's share of dimension 0
    (differentiable, with Horovod's gradient).

    Example::

        mine = hvd.reducescatter(torch.ones(4, 3), op=hvd.Sum)
    """
    if _wants_grad([tensor]):
        return _ReducescatterGrad.apply(tensor, name, compression, op, process_set, prescale_factor,
                                        postscale_factor)
    return _reducescatter(tensor, name, compression, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> TorchHandle:
    """Start reducescatters of a list of tensors; ``synchronize`` returns the list."""
    handles = [reducescatter_async(t, None if name is None else f"{name}.{i}", op, process_set, prescale_factor,
                                   postscale_factor) for i, t in enumerate(tensors)]
    if not handles:
        raise UnsupportedInputError("grouped_reducescatter needs at least one tensor")
    return TorchHandle(handles[-1].inner, lambda _: [synchronize(h) for h in handles])


class _GroupedReducescatterGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.scale = _scatter_grad_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale,
                                                             postscale)))

    @staticmethod
    def backward(ctx, *grads):
        grads = [g * ctx.scale if ctx.scale != 1.0 else g for g in grads]
        return (None,) * 5 + tuple(synchronize(grouped_allgather_async(grads, None, ctx.process_set)))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> list:
    """Reducescatter each tensor of a list; returns the list of results
    (differentiable, as :func:`reducescatter`)."""
    tensors = list(tensors)
    if _wants_grad(tensors):
        return list(_GroupedReducescatterGrad.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                    *tensors))
    return synchronize(grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                                   postscale_factor))


# ===== join, barrier =====================================================================================

def join(device=-1) -> int:
    """This rank has no more batches: it takes part in the other ranks'
    allreduces with zeros until every rank has joined (their allgathers,
    alltoalls, broadcasts and reducescatters raise meanwhile, as in Horovod).
    Returns the last rank to join.

    Example::

        hvd.join()
    """
    return _c.join(device)


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of ``process_set`` has called ``barrier``."""
    _c.barrier(process_set)
