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

import mmap
import sys

import numpy as np

# References to a pooled array while it is being checked: the pool's list,
# the loop variable and getrefcount's own argument.
_POOL_ONLY_REFS = 3

# From this size on a buffer gets pages of its own instead of coming from malloc;
# a smaller mapping holds no huge page (docs/history/engine-performance.md has the figures).
MAPPED_MIN_BYTES = 4 << 20


def allocate(n: int, dtype, zero: bool = False) -> np.ndarray:
    """A flat array of ``n`` elements of ``dtype``; zero-filled when ``zero``.

    A large one is mapped on its own (private anonymous pages, zero already,
    with huge pages asked for as numpy does) rather than taken from malloc,
    where the engine thread's buffers shared an arena with MPI's temporary
    buffers and memory kept going back to the kernel and faulting in again
    (the measurements are in docs/history/engine-performance.md).

    Example::

        buf = allocate(4 * 1024 * 1024, "float32", zero=True)
    """
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    if nbytes >= MAPPED_MIN_BYTES and hasattr(mmap, "MAP_PRIVATE"):
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                pages.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # huge pages unsupported here: 4 KiB pages then
                pass
        return np.frombuffer(pages, dtype=dtype, count=n)
    return np.zeros(n, dtype) if zero else np.empty(n, dtype)


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
        buf = allocate(n, dtype)
        self.allocated += 1
        if len(pooled) < self.keep:
            pooled.append(buf)
        return buf
