"""The parameters a torch ``DistributedOptimizer`` reduces, and the moves of
their gradients between ``p.grad`` and the stream's arrays.

:class:`ParameterGradients` fixes the layout when the optimizer is wrapped
(which parameters, their names, wire dtypes), packs this rank's gradients for
a post (zeros for a parameter without one, sparse ones densified or, in sync
mode, reduced Horovod's way by allgather beside the stream) and loads a
round's result back into every ``p.grad``.

Example::

    grads = ParameterGradients(optimizer, model.named_parameters(), Compression.none, False, "stream")
    arrays, ctxs = grads.pack(mode)                 # what the post sends
    grads.load(result, ctxs)                        # p.grad = the round's reduced gradient
"""

from __future__ import annotations

import numpy as np
import torch

import hvd_partial as _core
from .. import session as _session
from ..core.round_result import RoundResult
from ..errors import HvdPartialError, UnsupportedInputError
from ..modes import Mode, ReduceOp
from .tensors import CopyDone, HostStaging, wire_dtype


def rank_label() -> int | str:
    """This process's rank for error messages (also after the engine failed; ``?`` before init)."""
    try:
        return _core.rank()
    except HvdPartialError:
        # The engine failed (another rank raised first): the rank is still known.
        current = _session.current()
        return current.transport.rank if current is not None else "?"


class ParameterGradients:
    """The wrapped optimizer's parameters with ``requires_grad`` (``params``,
    named ``names``) and their gradients' way to and from the stream.

    Raises ``ValueError`` for ``named_parameters`` that do not cover the
    optimizer's parameters and ``UnsupportedInputError`` for sparse parameters
    or a dtype the wire cannot carry.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters, compression, sparse_as_dense: bool,
                 stream: str):
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.stream = stream
        everything = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is not None:
            names: dict[int, str] = {}
            seen: set[str] = set()
            for n, p in named_parameters:
                if n in seen:
                    raise ValueError(f"named_parameters lists the name {n!r} twice")
                seen.add(n)
                names.setdefault(id(p), n)
            missing = [p for p in everything if id(p) not in names]
            if missing:
                raise ValueError(f"named_parameters was given, but {len(missing)} of the optimizer's "
                                 f"{len(everything)} parameters are not in it")
        else:
            names = {}
            for gi, group in enumerate(optimizer.param_groups):
                for pi, p in enumerate(group["params"]):
                    names[id(p)] = f"param_groups[{gi}].params[{pi}]"
        for p in everything:
            if p.is_sparse:
                raise UnsupportedInputError(f"parameter {names[id(p)]!r} is a sparse tensor; not supported")
        self.names_by_id = names
        self.params = [p for p in everything if p.requires_grad]
        self.frozen = [p for p in everything if not p.requires_grad]
        self.names = [names[id(p)] for p in self.params]
        for p in self.params:
            wire_dtype(self.compressed_dtype(p.dtype), f"parameter {names[id(p)]!r}")
        self._staging = HostStaging()
        self._zeros: dict[int, torch.Tensor] = {}
        # Sync mode: parameters whose gradients are sparse, reduced Horovod's way
        # (allgather of indices and values) beside the dense stream; fixed at the first step.
        self._sparse_idx: list[int] | None = None
        self._sparse_members: tuple | None = None  # the world's members when the layout was settled
        self._sparse_grads: dict[int, torch.Tensor] = {}

    def compressed_dtype(self, dtype: torch.dtype) -> torch.dtype:
        wire, _ = self.compression.compress(torch.zeros(0, dtype=dtype))
        return wire.dtype

    def describe(self) -> list:
        """(name, shape, wire dtype) of every parameter: what must match across ranks."""
        return [(n, list(p.shape), str(self.compressed_dtype(p.dtype)).replace("torch.", ""))
                for n, p in zip(self.names, self.params)]

    def versions(self) -> list:
        """(id, version) of every gradient: changes when ``p.grad`` is replaced or edited in place."""
        return [(id(p.grad), p.grad._version) for p in self.params if p.grad is not None]

    @property
    def sparse_indices(self) -> list[int]:
        """Parameters whose gradients sync mode reduces by allgather (settled at the first step)."""
        return list(self._sparse_idx or ())

    def dense_indices(self) -> list[int]:
        """The parameters whose gradients travel in the stream's arrays (not allgathered), in order."""
        sparse = set(self._sparse_idx or ())
        return [i for i in range(len(self.params)) if i not in sparse]

    def pack(self, mode: Mode, indices: list[int] | None = None,
             staging: HostStaging | None = None) -> tuple[list[np.ndarray], list]:
        """This rank's gradients as the post's host arrays, with the compression contexts to load results with.

        ``indices``: only these parameters (a bucket posted during backward, dense ones),
        staged through ``staging`` (a bucket's own pinned buffers); default: every dense one."""
        wires, names, ctxs = self._wires(mode, indices)
        return (staging or self._staging).to_host(wires, names), ctxs

    def pack_async(self, mode: Mode, indices: list[int], staging: HostStaging) -> tuple[list[np.ndarray], list, CopyDone]:
        """As ``pack``, with CUDA gradients copied to the host on a side stream without
        waiting (a bucket during the backward pass): the arrays may be read once the
        returned ``CopyDone`` says so."""
        wires, names, ctxs = self._wires(mode, indices)
        arrays, copied = staging.to_host_async(wires, names)
        return arrays, ctxs, copied

    def _wires(self, mode: Mode, indices: list[int] | None) -> tuple[list[torch.Tensor], list[str], list]:
        """The gradients to post as they travel (compressed; zeros where none), their names and contexts."""
        for p in self.frozen:
            if p.grad is not None:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: parameter {self.names_by_id[id(p)]!r} had requires_grad=False when the "
                    "optimizer was wrapped but now has a gradient; the stream's layout is fixed. Wrap the "
                    "optimizer again after unfreezing")
        wires, ctxs = [], []
        sparse = set(self._sparse_idx or ())
        for i in range(len(self.params)) if indices is None else indices:
            if i in sparse:
                continue
            p, name = self.params[i], self.names[i]
            g = p.grad
            if g is None:
                g = self._zeros.get(i)
                if g is None:
                    g = self._zeros[i] = torch.zeros(p.shape, dtype=p.dtype)
            elif g.is_sparse:
                if not self.sparse_as_dense:
                    if mode.kind == "sync":
                        raise UnsupportedInputError(
                            f"rank {rank_label()}: parameter {name!r} has a sparse gradient now but had a dense one "
                            "(or none on every rank) at the first step; a parameter's gradients must stay sparse or "
                            "dense, or pass sparse_as_dense=True")
                    raise UnsupportedInputError(
                        f"rank {rank_label()}: parameter {name!r} has a sparse gradient, which {mode.kind} rounds "
                        "cannot carry (a round has a fixed dense layout); pass sparse_as_dense=True, or use "
                        "mode=hvd.Sync(), where sparse gradients are allgathered as in Horovod")
                g = g.to_dense()
            wire, ctx = self.compression.compress(g)
            wires.append(wire)
            ctxs.append(ctx)
        names = [self.names[i] for i in (range(len(self.params)) if indices is None else indices) if i not in sparse]
        if not wires:  # every gradient is sparse: the stream still counts the rounds
            wires, names = [torch.zeros(1, dtype=torch.float32)], ["(rounds)"]
        return wires, names, ctxs

    def settle_sparse_layout(self, mode: Mode) -> None:
        """Sync mode, first step: which parameters have sparse gradients (on any rank).
        Again at the first step after the world grew (docs/elastic.md, "Growing back"):
        a new rank settles it at its first step, and every rank takes part. After a rank
        died the layout stands (fewer ranks cannot add a sparse gradient)."""
        if mode.kind != "sync" or self.sparse_as_dense:
            return
        world = _core.world()
        grew = self._sparse_members is not None and not set(world.members) <= set(self._sparse_members)
        if self._sparse_idx is not None and not grew:
            return
        self._sparse_members = tuple(world.members)
        mine = [i for i, p in enumerate(self.params) if p.grad is not None and p.grad.is_sparse]
        everyone = _core.allgather_object(mine, name=f"{self.stream}.sparse_layout")
        union = sorted(set().union(*map(set, everyone)))
        for i in union:
            g = self.params[i].grad
            if g is not None and not g.is_sparse:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: parameter {self.names[i]!r} has a dense gradient here but a sparse one "
                    "on another rank; pass sparse_as_dense=True")
        self._sparse_idx = union

    def reduce_sparse(self, op: ReduceOp) -> None:
        """Sync mode: reduce the sparse gradients by allgather (Horovod's way)."""
        if not self._sparse_idx:
            return
        from .mpi_ops import sparse_allreduce_async, synchronize

        handles = {}
        for i in self._sparse_idx:
            p = self.params[i]
            g = p.grad
            if g is None:
                # No gradient on this rank: an empty one, indexed by rows as an embedding's is.
                g = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64),
                                            torch.zeros((0, *p.shape[1:]), dtype=p.dtype), p.shape)
            elif not g.is_sparse:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: parameter {self.names[i]!r} had a sparse gradient at the first step and "
                    "has a dense one now; a parameter's gradients must stay sparse or dense")
            handles[i] = sparse_allreduce_async(g, f"{self.stream}.sparse.{self.names[i]}", op)
        self._sparse_grads = {i: synchronize(h).coalesce() for i, h in handles.items()}

    def load(self, result: RoundResult, ctxs: list, scale: float = 1.0) -> None:
        """Set every ``p.grad`` to round ``result``'s reduced gradient (decompressed with
        ``ctxs``), times ``scale`` (:func:`hvd_partial.core.carried_values.step_scale`)."""
        arrays = result.arrays
        sparse = set(self._sparse_idx or ())
        params = [p for i, p in enumerate(self.params) if i not in sparse]
        for i in sparse:
            grad = self._sparse_grads.get(i)
            if grad is not None:
                self.params[i].grad = grad
        targets = [(p.device, torch_dtype(a), p.shape) for p, a in zip(params, arrays)]
        grads = HostStaging.from_host(arrays, targets)
        for p, g, ctx in zip(params, grads, ctxs):
            g = self.compression.decompress(g, ctx)
            if g.dtype != p.dtype:
                g = g.to(p.dtype)
            if scale != 1.0:
                g = g * scale  # not in place: g may view the round's buffer, loaded again at step()
            if p.grad is not None and p.grad.is_sparse:
                g = g.to_sparse()  # sparse_as_dense: back to the layout the optimizer expects, as Horovod does
            p.grad = g


_TORCH_DTYPES: dict = {}


def torch_dtype(array: np.ndarray) -> torch.dtype:
    """The torch dtype of a numpy array's dtype (cached: runs per round and parameter)."""
    dtype = _TORCH_DTYPES.get(array.dtype)
    if dtype is None:
        dtype = _TORCH_DTYPES[array.dtype] = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
    return dtype
