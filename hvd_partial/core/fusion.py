"""Packing many arrays into few flat buffers (per dtype, each at most the
fusion threshold) and back.

A stream of one contiguous array travels as a flat view of it (no copy);
a grouped stream is packed into buffers of one dtype each, at most
``bucket_bytes`` long (``fusion_threshold_bytes``; an array larger than that
travels alone), and results are unpacked as views of the reduced buffers (no
copy). Every buffer of a stream belongs to the same rounds: buckets bound the
size of one MPI call, not what a round contains.

A stream may also be cut into groups (``partition``: Horovod's ``groups`` of
the torch optimizer): each group is fused on its own (per dtype, at most
``bucket_bytes`` a buffer), so its arrays never share a buffer, and so one
MPI call, with another group's; every group is still in every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import ConfigError, UnsupportedInputError
from .buffer_pool import allocate

SUPPORTED_DTYPES = ("float16", "float32", "float64", "int32", "int64", "uint8", "int8")
# dtype.name is computed in Python on every access; posts are a hot path.
_NAMES = {np.dtype(name): name for name in SUPPORTED_DTYPES}


def dtype_name(dtype: np.dtype) -> str:
    name = _NAMES.get(dtype)
    return name if name is not None else dtype.name


def check_array(array, what: str = "array") -> np.ndarray:
    """Validate one posted array; returns it as an ndarray (no copy)."""
    if not isinstance(array, np.ndarray):
        raise UnsupportedInputError(f"{what} must be a numpy.ndarray, got {type(array).__name__}")
    if array.dtype not in _NAMES:
        raise UnsupportedInputError(
            f"{what} has unsupported dtype {array.dtype.name}; supported: {', '.join(SUPPORTED_DTYPES)}")
    if not array.flags.c_contiguous:
        raise UnsupportedInputError(f"{what} is not C-contiguous; pass numpy.ascontiguousarray(x)")
    return array


def check_partition(partition, count: int) -> tuple[tuple[int, ...], ...]:
    """``partition`` as a tuple of non-empty tuples of array indices that hold
    each of ``count`` arrays exactly once; ``ConfigError`` naming the problem."""
    try:
        parts = tuple(tuple(int(i) for i in part) for part in partition)
    except (TypeError, ValueError):
        raise ConfigError(f"groups must be lists of array indices, got {partition!r}") from None
    seen: set[int] = set()
    for part in parts:
        if not part:
            raise ConfigError(f"groups {partition!r}: a group is empty")
        for i in part:
            if not 0 <= i < count:
                raise ConfigError(f"groups {partition!r}: index {i} is not one of the {count} arrays")
            if i in seen:
                raise ConfigError(f"groups {partition!r}: array {i} is in two groups")
            seen.add(i)
    if len(seen) != count:
        missing = sorted(set(range(count)) - seen)
        raise ConfigError(f"groups {partition!r}: arrays {missing} are in no group; every array must be in one")
    return parts


@dataclass(frozen=True)
class Layout:
    """Shapes and dtypes of the arrays of a stream, and how they are fused."""

    entries: tuple  # ((shape, dtype_name), ...)
    bucket_bytes: int | None = None  # largest fused buffer; None: one buffer per dtype
    partition: tuple | None = None  # ((array indices), ...): groups fused apart; None: one group

    @classmethod
    def of(cls, arrays, bucket_bytes: int | None = None, partition=None) -> "Layout":
        entries = tuple((a.shape, dtype_name(a.dtype)) for a in arrays)
        if partition is not None:
            partition = check_partition(partition, len(entries))
        return cls(entries, bucket_bytes, partition)

    @property
    def described(self) -> tuple:
        """What ranks must agree on: the arrays and how they are bucketed and grouped."""
        out = self.entries
        if self.bucket_bytes is not None:
            out = (out, ("bucket_bytes", self.bucket_bytes))
        if self.partition is not None:
            out = (out, ("groups", self.partition))
        return out

    # Derived once per layout (the engine asks on every round); cached_property
    # writes the instance dict directly, which a frozen dataclass allows.
    @cached_property
    def groups(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(dtype, indices of the arrays in one buffer): per group of ``partition``
        (in its order; the whole stream without one), dtypes in order of first
        use, each split into consecutive buckets of at most ``bucket_bytes``."""
        out = []
        for part in self.partition or (range(len(self.entries)),):
            out.extend(self._fuse(part))
        return tuple(out)

    def _fuse(self, part) -> list[tuple[str, tuple[int, ...]]]:
        order: dict[str, list[int]] = {}
        for i in part:
            order.setdefault(self.entries[i][1], []).append(i)
        limit = self.bucket_bytes
        out = []
        for dtype, idx in order.items():
            if limit is None:
                out.append((dtype, tuple(idx)))
                continue
            itemsize = np.dtype(dtype).itemsize
            bucket: list[int] = []
            filled = 0
            for i in idx:
                nbytes = self._sizes[i] * itemsize
                if bucket and filled + nbytes > limit:
                    out.append((dtype, tuple(bucket)))
                    bucket, filled = [], 0
                bucket.append(i)
                filled += nbytes
            out.append((dtype, tuple(bucket)))
        return out

    @cached_property
    def _sizes(self) -> tuple[int, ...]:
        return tuple(int(np.prod(shape, dtype=np.int64)) for shape, _ in self.entries)

    @cached_property
    def _specs(self) -> tuple[tuple[int, str], ...]:
        return tuple((sum(self._sizes[i] for i in idx), dtype) for dtype, idx in self.groups)

    def sizes(self) -> list[int]:
        return list(self._sizes)

    def buffer_specs(self) -> list[tuple[int, str]]:
        return list(self._specs)

    def zeros(self) -> list[np.ndarray]:
        return [allocate(n, dtype, zero=True) for n, dtype in self.buffer_specs()]

    def pack(self, arrays, pool=None) -> tuple[list[np.ndarray], list[bool]]:
        """Flat buffers holding ``arrays``, and for each whether it is a copy
        (a dtype with several arrays is concatenated, into a buffer of
        ``pool`` when given; a lone array is a view)."""
        if len(arrays) == 1:
            return [arrays[0].reshape(-1)], [False]
        out, owned = [], []
        sizes = self._sizes
        for dtype, idx in self.groups:
            if len(idx) == 1:
                out.append(arrays[idx[0]].reshape(-1))
            else:
                into = None if pool is None else pool.take_one(sum(sizes[i] for i in idx), dtype)
                out.append(np.concatenate([arrays[i].reshape(-1) for i in idx], out=into))
            owned.append(len(idx) > 1)
        return out, owned

    def unpack(self, buffers) -> list[np.ndarray]:
        """Views of ``buffers`` shaped like the stream's arrays."""
        sizes = self._sizes
        out: list = [None] * len(self.entries)
        for buf, (_, idx) in zip(buffers, self.groups):
            offset = 0
            for i in idx:
                out[i] = buf[offset:offset + sizes[i]].reshape(self.entries[i][0])
                offset += sizes[i]
        return out
