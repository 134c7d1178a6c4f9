"""Scalars carried with every round, framework-neutral: how an optimizer's
hyperparameters (PyTorch's ``param_groups`` scalars, Keras's learning rate)
travel in a post and how every rank derives the same values from a round.

A post appends one float64 array, :func:`encode` of its values, to its
gradients. The engine sums it with them, so every rank reads the same sums
for a round and :func:`decode` gives the same values on every rank:

- where every post summed in the round holds the same value (bit for bit),
  that value exactly;
- otherwise the mean of the posts' values (in float64).

The array is ``[1, v0..., v1..., ...]``: a leading count (1 per post), then
per value ``[x, c0, c1, c2, c3, c0**2, c1**2, c2**2, c3**2]``, where
``c0..c3`` are the four 16-bit pieces of ``x``'s float64 bits. The pieces
and their squares are small integers, so their sums stay exact in float64
even after ``Average`` divides them by the world size (they are multiplied
back and rounded). By Cauchy-Schwarz, k posts agree on a piece exactly when
``k * sum(c**2) == sum(c)**2``; the agreed pieces rebuild the bits. Nothing
in the array depends on the rank or the world size, so posts summed in a
rank's pending buffer, and worlds that shrink, need no special case.

Example::

    extra = encode([0.1, 0.9])                      # posted with the gradients, last
    values = decode(result.arrays[-1], scale=4)     # Average over 4 ranks: [0.1, 0.9] if all agreed
    values = values_of_round(result, average=True)  # the same, from a RoundResult
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import EngineError

PIECES = 4  # 16-bit pieces of a float64
PER_VALUE = 1 + 2 * PIECES
# Posts summed in one round for which the pieces' sums stay exact: sum(c**2) < 2**50.
MAX_POSTS_PER_ROUND = 1 << 18


def carried_size(count: int) -> int:
    """Length of the array that carries ``count`` values (the count slot included)."""
    return 1 + PER_VALUE * count


def pieces_of(x: float) -> list[int]:
    """The four 16-bit pieces of ``x``'s float64 bits, lowest first."""
    bits = int(np.float64(x).view(np.uint64))
    return [(bits >> (16 * i)) & 0xFFFF for i in range(PIECES)]


def from_pieces(pieces) -> float:
    """The float64 whose bits are ``pieces`` (lowest first)."""
    bits = 0
    for i, c in enumerate(pieces):
        bits |= int(c) << (16 * i)
    return float(np.uint64(bits).view(np.float64))


def encode(values: Sequence[float]) -> np.ndarray:
    """The array one post carries for ``values``: the count 1, then each value's float, pieces and squares."""
    out = np.empty(carried_size(len(values)), np.float64)
    out[0] = 1.0
    for i, x in enumerate(values):
        pieces = pieces_of(x)
        base = 1 + PER_VALUE * i
        out[base] = x
        out[base + 1:base + 1 + PIECES] = pieces
        out[base + 1 + PIECES:base + PER_VALUE] = [c * c for c in pieces]
    return out


def posts_in(summed: np.ndarray, scale: float) -> int:
    """How many posts were summed into ``summed`` (``scale``: what the sums were divided by)."""
    return round(float(summed[0]) * scale)


def decode(summed: np.ndarray, scale: float) -> list[float] | None:
    """The values of a round from its reduced array (``scale``: what the sums were
    divided by, the world size for ``Average``, else 1); ``None`` when no post was summed."""
    count = posts_in(summed, scale)
    if count <= 0:
        return None
    exact = np.rint(summed * scale)  # the pieces' and squares' sums, exact integers
    out = []
    for i in range((len(summed) - 1) // PER_VALUE):
        base = 1 + PER_VALUE * i
        sums = [int(v) for v in exact[base + 1:base + 1 + PIECES]]
        squares = [int(v) for v in exact[base + 1 + PIECES:base + PER_VALUE]]
        if all(count * q == s * s for s, q in zip(sums, squares)):
            out.append(from_pieces([s // count for s in sums]))
        else:  # the posts disagree: their mean (the same float ops on every rank)
            out.append(float(summed[base]) / float(summed[0]))
    return out


def round_scale(result, average: bool) -> float:
    """What ``result``'s sums were divided by: its world size for ``Average``, else 1."""
    return (result.world_size or 1) if average else 1


def step_scale(result, average: bool, capped: bool) -> float:
    """What an optimizer multiplies round ``result``'s reduced gradient by before
    applying it as one step: ``world / posts`` where ``Average`` summed more
    posts than the world has ranks (a rank's posts piled up while the round
    waited) and ``capped`` (config ``cap_round_step``), else 1; so that no
    round steps further than a synchronous round. The same on every rank."""
    if not (average and capped):
        return 1.0
    world = result.world_size or 1
    posts = posts_in(result.arrays[-1], world)
    return world / posts if posts > world else 1.0


def values_of_round(result, average: bool) -> list[float]:
    """The carried values of ``result``'s round, whose carried array is its last
    (a round with data: at least one post carried them); ``average``: the stream
    divides sums by the world size. Raises ``EngineError`` when no post's values are in it."""
    values = decode(result.arrays[-1], round_scale(result, average))
    if values is None:
        raise EngineError(f"round {result.round} has data but no post's carried values")
    return values
