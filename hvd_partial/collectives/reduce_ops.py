"""Reductions of the helper collectives, with Horovod's semantics.

- ``Sum``, ``Min``, ``Max``, ``Product``: elementwise, in the array's dtype.
- ``Average``: the sum divided by the number of ranks. For integer arrays the
  quotient is truncated toward zero, as Horovod does (it scales the integer
  sum by ``1 / size`` in double precision and converts back), so the
  average of 1, 2 and 2 over 3 ranks is 1, and of -1, -2, -2 is -1.
- ``prescale_factor`` / ``postscale_factor`` multiply the input before and
  the result after the reduction; on integers the product is truncated too.
- ``Adasum`` is refused with :class:`~hvd_partial.errors.UnsupportedInputError`.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedInputError
from ..modes import ReduceOp

# float16 is reduced in float32 (MPI has no portable half-precision sum).
_WIDENED = {np.dtype(np.float16): np.dtype(np.float32)}


def check_op(op, what: str) -> ReduceOp:
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{what}: op must be one of hvd_partial.Average, Sum, Min, Max, Product, got {op!r}")
    if op is ReduceOp.ADASUM:
        raise UnsupportedInputError(
            f"{what}: op=Adasum is not implemented by hvd_partial; use op=Average (the default), or Sum with "
            "your own scaling")
    return op


def wire_op(op: ReduceOp) -> str:
    """The MPI reduction behind ``op``."""
    return {ReduceOp.AVERAGE: "sum", ReduceOp.SUM: "sum", ReduceOp.MIN: "min", ReduceOp.MAX: "max",
            ReduceOp.PRODUCT: "product"}[op]


def check_reducible(array: np.ndarray, what: str) -> None:
    if array.dtype.kind not in "iuf":
        raise UnsupportedInputError(f"{what}: cannot reduce arrays of dtype {array.dtype.name}; supported: "
                                    "signed and unsigned integers, float16, float32, float64")


def wire_dtype(dtype: np.dtype) -> np.dtype:
    return _WIDENED.get(np.dtype(dtype), np.dtype(dtype))


def scale(array: np.ndarray, factor: float) -> np.ndarray:
    """``array * factor`` in ``array``'s dtype, integers truncated toward zero."""
    if factor == 1.0:
        return array
    if array.dtype.kind == "f":
        return np.multiply(array, array.dtype.type(factor), out=array) if array.flags.writeable else array * factor
    return (array.astype(np.float64) * factor).astype(array.dtype)


def finish_reduction(result: np.ndarray, op: ReduceOp, size: int, postscale: float, dtype: np.dtype) -> np.ndarray:
    """The reduced ``result`` (in the wire dtype) as the caller's ``dtype``,
    averaged and post-scaled."""
    if op is ReduceOp.AVERAGE:
        if result.dtype.kind == "f":
            np.divide(result, size, out=result)
            result = scale(result, postscale)
        else:
            result = scale(result, postscale / size)
    else:
        result = scale(result, postscale)
    return result if result.dtype == dtype else result.astype(dtype)
