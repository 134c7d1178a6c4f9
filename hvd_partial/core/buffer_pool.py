"""Reuse of result and staging buffers that nothing refers to any more.

Every round's result is a buffer the caller owns, and posts are staged in
buffers of their own (fused arrays, copies of data still pending when its
post returns). Allocating these fresh each round costs a page fault per page
(for a large buffer, about as much as the reduction itself, and on 2 cores
it slows the other ranks too), so buffers are recycled once nothing outside
the pool refers to them any more: not the result, not a view of it, not a
tensor made from it, not a round still reducing it.
"""

from __future__ import annotations

import sys

import numpy as np

# References to a pooled array while it is being checked: the pool's list,
# the loop variable and getrefcount's own argument.
_POOL_ONLY_REFS = 3


class BufferPool:
    """Flat buffers of one stream: its results, or its staged posts.

    Example::

        pool = BufferPool(keep=3)
        buffers = pool.take([(1024, "float32")])
    """

    def __init__(self, keep: int = 3):
        self.keep = keep
        self._buffers: dict[tuple[int, str], list[np.ndarray]] = {}
        self.reused = 0
        self.allocated = 0

    def take(self, specs) -> list[np.ndarray]:
        return [self.take_one(n, dtype) for n, dtype in specs]

    def copy_of(self, array: np.ndarray) -> np.ndarray:
        """A pooled flat copy of ``array``."""
        buf = self.take_one(array.size, array.dtype.name)
        np.copyto(buf, array.reshape(-1))
        return buf

    def take_one(self, n: int, dtype: str) -> np.ndarray:
        pooled = self._buffers.setdefault((n, dtype), [])
        for buf in pooled:
            if sys.getrefcount(buf) <= _POOL_ONLY_REFS:
                self.reused += 1
                return buf
        buf = np.empty(n, dtype=dtype)
        self.allocated += 1
        if len(pooled) < self.keep:
            pooled.append(buf)
        return buf
