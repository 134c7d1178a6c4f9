"""Used by worker scripts running under mpiexec: report results to the test."""

from __future__ import annotations

import json
import os

import numpy as np


def _path(rank: int, suffix: str) -> str:
    return os.path.join(os.environ["HVD_TEST_OUT"], f"rank{rank}.{suffix}")


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def phase(text: str) -> None:
    """Record what this rank is doing now (shown if the job hangs)."""
    with open(_path(_rank(), "phase"), "w") as fh:
        fh.write(text)


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def report(value) -> None:
    """Hand ``value`` (JSON-able, numpy allowed) to the test."""
    rank = _rank()
    tmp = _path(rank, "json.tmp")
    with open(tmp, "w") as fh:
        json.dump(_plain(value), fh)
    os.replace(tmp, _path(rank, "json"))
    phase("reported")


def digest(arrays) -> str:
    """A bitwise fingerprint of arrays (compare replicas across ranks)."""
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()
