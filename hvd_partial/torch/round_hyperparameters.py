"""The optimizer's hyperparameters, carried with every round.

Each post of a torch ``DistributedOptimizer`` carries, beside its gradients,
one float64 array describing the numeric scalars of its ``param_groups`` (lr,
momentum, weight decay, betas, eps, ...) as this rank holds them when it
posts. The array is summed with the gradients, so every rank reads the same
sums for every round and derives the same values from them: where every post
summed in the round holds the same value (bit for bit), that value exactly;
otherwise the mean of the posts' values (in float64). The encoding is the
framework-neutral one of :mod:`hvd_partial.core.carried_values` (shared with
the Keras ``DistributedOptimizer``'s learning rate); this module chooses
which ``param_groups`` scalars travel and writes the values back.

Example::

    carried = RoundHyperparameters(optimizer)
    extra = carried.encode()              # posted with the gradients, last
    values = carried.decode(result.arrays[-1], scale=result.world_size)
    carried.write(values)                 # before the wrapped optimizer's step
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..core import carried_values
from ..errors import UnsupportedInputError


@dataclass(frozen=True, slots=True)
class Entry:
    """One carried ``param_groups[group][key]``: ``kind`` is ``number`` (an int
    or float), ``sequence`` (a tuple or list of numbers, such as Adam's betas)
    or ``tensor`` (a one-element floating-point tensor), with ``size`` values."""

    group: int
    key: str
    kind: str
    size: int


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entry(group: int, key: str, value) -> Entry | None:
    if _is_number(value):
        return Entry(group, key, "number", 1)
    if isinstance(value, (tuple, list)) and value and all(_is_number(v) for v in value):
        return Entry(group, key, "sequence", len(value))
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return Entry(group, key, "tensor", 1)
    return None  # flags (bool), None, strings: each rank keeps its own


class RoundHyperparameters:
    """Which ``param_groups`` scalars travel with the rounds (fixed at the first
    :meth:`encode`: the stream's layout), and their way to and from the array.

    Raises ``UnsupportedInputError`` when a carried value stops being a number
    or a param group goes away after the first post.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.entries: list[Entry] | None = None

    @property
    def size(self) -> int:
        """Length of the carried array (count first)."""
        return carried_values.carried_size(sum(e.size for e in self.entries or ()))

    def settle(self) -> None:
        """Fix which scalars travel (keys added to a group later stay local)."""
        if self.entries is not None:
            return
        self.entries = [e for gi, group in enumerate(self.optimizer.param_groups)
                        for key, value in group.items() if key != "params"
                        for e in [_entry(gi, key, value)] if e is not None]

    def read(self) -> list[float]:
        """This rank's current values, flattened in entry order."""
        self.settle()
        out: list[float] = []
        groups = self.optimizer.param_groups
        for e in self.entries:
            value = groups[e.group].get(e.key) if e.group < len(groups) else None
            if e.kind == "number" and _is_number(value):
                out.append(float(value))
            elif e.kind == "sequence" and isinstance(value, (tuple, list)) and len(value) == e.size and all(
                    _is_number(v) for v in value):
                out.extend(float(v) for v in value)
            elif e.kind == "tensor" and isinstance(value, torch.Tensor) and value.numel() == 1:
                out.append(float(value.item()))
            else:
                raise UnsupportedInputError(
                    f"param_groups[{e.group}][{e.key!r}] was a {e.kind} at the first step and is {value!r} now; "
                    "the hyperparameters carried with each round are fixed at the first step")
        return out

    def encode(self) -> np.ndarray:
        """The array this post carries (see :func:`hvd_partial.core.carried_values.encode`)."""
        return carried_values.encode(self.read())

    def decode(self, summed: np.ndarray, scale: float) -> list[float] | None:
        """The values of a round from its reduced array (``scale``: what the sums
        were divided by, the world size for ``Average``, else 1); ``None`` when no
        post was summed."""
        return carried_values.decode(summed, scale)

    def of_round(self, result, average: bool) -> list[float]:
        """The values of ``result``'s round (a round with data: at least one post carried them);
        ``average``: the stream divides sums by the world size."""
        return carried_values.values_of_round(result, average)

    def write(self, values: list[float]) -> None:
        """Set the param groups to ``values`` (as :meth:`read` flattens them)."""
        groups = self.optimizer.param_groups
        i = 0
        for e in self.entries:
            group = groups[e.group]
            if e.kind == "number":
                group[e.key] = _as_type(group[e.key], values[i])
            elif e.kind == "sequence":
                old = group[e.key]
                group[e.key] = type(old)(_as_type(o, v) for o, v in zip(old, values[i:i + e.size]))
            else:
                group[e.key].fill_(values[i])
            i += e.size


def _as_type(old, value: float):
    """``value`` as an int where the local value was an int and it is integral."""
    if isinstance(old, int) and not isinstance(old, bool) and math.isfinite(value) and value == int(value):
        return int(value)
    return value
