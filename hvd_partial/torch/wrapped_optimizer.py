"""What every ``DistributedOptimizer`` shares: a ``torch.optim.Optimizer`` that
holds the user's optimizer (``self._inner``) and shows its ``param_groups``,
``state`` and ``defaults`` as its own, so that schedulers, ``swa_utils`` and
``GradScaler`` see one optimizer.

Subclasses set ``_inner`` and ``_mode`` in ``__init__`` (without calling
``torch.optim.Optimizer.__init__``: the wrapped optimizer owns the groups).
"""

from __future__ import annotations

import torch


class WrappedOptimizer(torch.optim.Optimizer):
    """The shared view of the wrapped optimizer (see the module docstring)."""

    _inner: torch.optim.Optimizer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer (it shares ``param_groups`` and ``state`` with this wrapper)."""
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
        """The mode of this optimizer's rounds (``Sync()``, ``Solo()`` or ``Majority(...)``)."""
        return self._mode

    def __getattr__(self, attr):
        # Only reached for names the wrapper does not define: let custom
        # optimizer attributes through.
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(attr)
        return getattr(inner, attr)
