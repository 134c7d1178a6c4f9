"""``DistributedOptimizer(..., process_set=s)`` for a set other than the global
one: Horovod's synchronous optimizer among the set's ranks.

Partial rounds (solo, majority) run on streams of every rank, so a process
set's optimizer is synchronous: ``mode`` left out (or ``Sync()``) reduces the
gradients among the set's members with one negotiated grouped allreduce per
``step()`` (sparse gradients are allgathered as Horovod does, unless
``sparse_as_dense``); ``mode=Solo()`` or ``Majority(...)`` raises
``NotSupportedError`` naming the mode. As in Horovod, a rank outside the set
steps with its own gradients, without communicating.

Example::

    evens = hvd.add_process_set(range(0, hvd.size(), 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), process_set=evens)
    loss.backward()
    opt.step()   # evens: the evens' average gradient; odds: their own
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from ..collectives.process_sets import ProcessSet, check_added, global_process_set, require_sync
from ..errors import ConfigError, UnsupportedInputError
from ..modes import Average, ReduceOp, Sync
from .compression import Compression
from .mpi_ops import grouped_allreduce_async, sparse_allreduce_async, synchronize


def new_optimizer(cls, *args, **kwargs):
    """``DistributedOptimizer.__new__``: a :class:`SetOptimizer` where ``process_set``
    is a set other than the global one, else a new ``cls``."""
    bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    process_set = bound.arguments.get("process_set", global_process_set)
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id == 0:
        return torch.optim.Optimizer.__new__(cls)
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    return SetOptimizer(**arguments)


class SetOptimizer(torch.optim.Optimizer):
    """Horovod's synchronous ``DistributedOptimizer`` among a process set's ranks
    (see the module docstring). It shares the wrapped optimizer's
    ``param_groups`` and ``state``."""

    def __init__(self, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step: int = 1, op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, groups=None, sparse_as_dense: bool = False, process_set=global_process_set,
                 *, mode=None, max_staleness: int | None = None, name: str | None = None):
        require_sync(mode, process_set, "DistributedOptimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise UnsupportedInputError(f"DistributedOptimizer(op={op!r}, process_set=...): op must be Average or Sum")
        if not isinstance(gradient_predivide_factor, (int, float)) or gradient_predivide_factor <= 0:
            raise ConfigError(f"gradient_predivide_factor must be a number > 0, got {gradient_predivide_factor!r}")
        check_added(process_set, "DistributedOptimizer")
        self._inner = optimizer
        self.process_set = process_set
        self._op = op
        self._compression = compression
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = bool(sparse_as_dense)
        self._synchronized = False
        self._should_sync = True
        self._mode = Sync()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._inner

    @property
    def param_groups(self):
        return self._inner.param_groups

    @property
    def state(self):
        return self._inner.state

    @property
    def defaults(self):
        return self._inner.defaults

    @property
    def mode(self):
        return self._mode

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._inner.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Reduce every gradient among the set's ranks (in place in ``p.grad``);
        nothing on a rank outside the set."""
        self._synchronized = True
        if not self.process_set.included():
            return
        params = [p for g in self._inner.param_groups for p in g["params"] if p.requires_grad]
        for p in params:
            if p.grad is None:  # zeros, as the global optimizer contributes: every member reduces the same list
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse and self._sparse_as_dense:
                p.grad = p.grad.to_dense()
        dense = [p for p in params if not p.grad.is_sparse]
        sparse = [p for p in params if p.grad.is_sparse]
        average = self._op is ReduceOp.AVERAGE
        pre, post = (1.0 / self._predivide, self._predivide) if average else (1.0, 1.0)
        handles = [sparse_allreduce_async(p.grad, None, self._op, self.process_set) for p in sparse]
        if dense:
            wires = [self._compression.compress(p.grad) for p in dense]
            reduced = synchronize(grouped_allreduce_async([w for w, _ in wires], op=self._op, prescale_factor=pre,
                                                          postscale_factor=post, process_set=self.process_set))
            with torch.no_grad():
                for p, r, (_, ctx) in zip(dense, reduced, wires):
                    p.grad.copy_(self._compression.decompress(r, ctx))
        for p, handle in zip(sparse, handles):
            p.grad = synchronize(handle)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context applies the gradients of an earlier ``synchronize()``."""
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_sync and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        self._inner.step()
        return loss

    def state_dict(self) -> dict:
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self._inner.add_param_group(param_group)

    def register_step_pre_hook(self, hook):
        return self._inner.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        return self._inner.register_step_post_hook(hook)

    def __getattr__(self, attr):
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(attr)
        return getattr(inner, attr)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner.__class__.__name__}, mode=Sync(), process_set={self.process_set})"
