"""The helpers that start every rank from the same model and optimizer state,
and object collectives (Horovod's ``horovod.torch.functions``).

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    mean_loss = hvd.allreduce(loss.detach(), name="loss")
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

import hvd_partial as _core
from ..collectives.process_sets import global_process_set
from ..errors import MismatchError, UnsupportedInputError
from .tensors import to_cpu_tree

log = logging.getLogger("hvd_partial.torch")


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


def broadcast_optimizer_state(optimizer, root_rank: int = 0, model=None) -> None:
    """Make every rank's optimizer state (slots, hyperparameters, and for a
    :class:`DistributedOptimizer` its round counter) equal to ``root_rank``'s.

    As in Horovod, an optimizer that has no state yet (nothing stepped) gets
    its state created first, with zero gradients for parameters that have
    none (they keep them, as in Horovod); unlike Horovod, the parameters and
    the gradients that existed are put back as they were, so that
    initialization moves no weight (weight decay would). ``model``
    is accepted for Horovod's signature (it marks sparse embeddings there).

    Example::

        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """
    if not hasattr(optimizer, "state_dict") or not hasattr(optimizer, "load_state_dict"):
        raise UnsupportedInputError(f"broadcast_optimizer_state expects an optimizer, got {type(optimizer).__name__}")
    inner = getattr(optimizer, "optimizer", optimizer)
    if isinstance(inner, torch.optim.LBFGS):
        raise UnsupportedInputError("broadcast_optimizer_state: cannot broadcast torch.optim.LBFGS state")
    groups = optimizer.param_groups
    signature = [[(tuple(p.shape), str(p.dtype).replace("torch.", "")) for p in g["params"]] for g in groups]
    everyone = _core.allgather_object(signature, name="broadcast_optimizer_state.signature")
    bad = [r for r, s in enumerate(everyone) if s != everyone[root_rank]]
    if bad:
        raise MismatchError(f"broadcast_optimizer_state: the parameters of the optimizer on ranks {bad} differ "
                            f"from root rank {root_rank}'s (groups, shapes or dtypes)")
    if not inner.state:
        _initialize_state(inner)
    state = to_cpu_tree(optimizer.state_dict()) if _core.rank() == root_rank else None
    state = _core.broadcast_object(state, root_rank, name="broadcast_optimizer_state")
    if _core.rank() != root_rank:
        optimizer.load_state_dict(state)


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Step ``optimizer`` once on zero gradients so that its state exists, then
    restore the parameters and gradients it had."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p.detach().clone(), p.grad) for p in params]
    # The user's step hooks (an attached LR scheduler, say) must not see this step.
    hooks = optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks
    optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks = type(hooks[0])(), type(hooks[1])()
    try:
        _step_on_zeros(optimizer, params, saved)
    finally:
        optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks = hooks


def _step_on_zeros(optimizer, params, saved) -> None:
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
            if isinstance(optimizer, torch.optim.SparseAdam):
                p.grad = p.grad.to_sparse()
        optimizer.step()
        for p, (data, grad) in zip(params, saved):
            p.copy_(data)
            if grad is not None:
                p.grad = grad  # a parameter without one keeps the zero gradient, as in Horovod


def broadcast_object(obj, root_rank: int = 0, name: str | None = None, process_set=global_process_set):
    """Return ``root_rank``'s picklable ``obj`` on every rank (tensors included).

    Example::

        epoch = hvd.broadcast_object(epoch, root_rank=0)
    """
    return _core.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name: str | None = None, process_set=global_process_set) -> list:
    """Return every rank's picklable ``obj``, in rank order.

    Example::

        losses = hvd.allgather_object(float(loss))
    """
    return _core.allgather_object(obj, name=name, process_set=process_set)
