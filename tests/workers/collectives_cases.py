"""Worker: the negotiated helper collectives (hvd_partial.collectives) under mpiexec.

Usage: collectives_cases.py CASE   (values, mismatch, duplicate, stall_warning, stall_shutdown, join, reinit)
Each rank reports a dict the test asserts on.
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np

import hvd_partial as hvd
from workers.support import phase, report


def values() -> dict:
    r, n = hvd.rank(), hvd.size()
    out = {}
    phase("allreduce ops")
    out["sum"] = hvd.allreduce(np.array([r, 1], dtype=np.int64), op=hvd.Sum)
    out["min"] = hvd.allreduce(np.array([r + 1.5, -r]), op=hvd.Min)
    out["max"] = hvd.allreduce(np.array([r + 1.5, -r]), op=hvd.Max)
    out["product"] = hvd.allreduce(np.array([r + 2], dtype=np.int32), op=hvd.Product)
    # Integer average: values whose mean is not an integer, of both signs.
    ints = np.array([3 * r + 1, -(3 * r + 1), r], dtype=np.int32)
    avg = hvd.allreduce(ints, name="int_average")
    out["int_average"] = avg
    out["int_average_dtype"] = str(avg.dtype)
    out["float_average"] = hvd.allreduce(np.array([r + 1.0], dtype=np.float32))
    out["float16_sum"] = hvd.allreduce(np.full(3, 0.5, dtype=np.float16), op=hvd.Sum)
    out["float16_dtype"] = str(out["float16_sum"].dtype)
    out["scaled"] = hvd.allreduce(np.array([1.0]), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    out["grouped"] = hvd.grouped_allreduce([np.ones(2) * r, np.full(3, r, dtype=np.int64)], op=hvd.Sum)
    # Announcements larger than a negotiation slot (forty shapes) take the spill path.
    out["grouped_many"] = [float(a[0]) for a in hvd.grouped_allreduce([np.full(i + 1, float(i)) for i in range(40)],
                                                                      op=hvd.Sum, name="g" * 300)]
    try:
        hvd.allreduce(np.ones(2), op=hvd.Adasum)
        out["adasum"] = "no error"
    except hvd.UnsupportedInputError as err:
        out["adasum"] = str(err)
    phase("allgather")
    out["allgather"] = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int16))
    out["allgather_empty_rank0"] = hvd.allgather(np.full((r, 1), r, dtype=np.float64))
    phase("broadcast")
    out["broadcast"] = hvd.broadcast(np.array([r * 10, r], dtype=np.int64), root_rank=n - 1)
    out["broadcast_bool"] = hvd.broadcast(np.array([r == 0, r != 0]), root_rank=0)
    out["broadcast_object"] = hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1)
    out["allgather_object"] = hvd.allgather_object(("rank", r))
    phase("alltoall")
    # Rank r sends j + 1 rows to rank j, each row holding (r, j).
    splits = [j + 1 for j in range(n)]
    rows = np.concatenate([np.tile([r, j], (j + 1, 1)) for j in range(n)])
    received, received_splits = hvd.alltoall(rows, splits=splits)
    out["alltoall"] = received
    out["alltoall_splits"] = received_splits
    out["alltoall_even"] = hvd.alltoall(np.arange(2 * n) + 100 * r)[0]
    phase("reducescatter")
    out["reducescatter"] = hvd.reducescatter(np.arange(2 * (n + 1), dtype=np.float64).reshape(n + 1, 2) * (r + 1),
                                             op=hvd.Sum)
    out["reducescatter_avg_int"] = hvd.reducescatter(np.full((n, 1), r, dtype=np.int64))
    phase("async")
    handles = [hvd.allreduce_async(np.array([float(i)]), op=hvd.Sum) for i in range(5)]
    out["async_poll_type"] = type(hvd.poll(handles[0])).__name__
    out["async"] = [float(hvd.synchronize(h)[0]) for h in reversed(handles)]
    out["gather_async"] = hvd.synchronize(hvd.allgather_async(np.array([r])))
    # The same name on every rank, submitted in different orders on different ranks.
    names = ["a", "b", "c"] if r % 2 == 0 else ["c", "a", "b"]
    hs = {nm: hvd.allreduce_async(np.array([ord(nm) * (r + 1)]), name=nm, op=hvd.Sum) for nm in names}
    out["orders"] = {nm: int(hvd.synchronize(h)[0]) for nm, h in hs.items()}
    hvd.barrier()
    phase("done")
    return out


def mismatch() -> dict:
    """Each case: rank 1 differs from the others in one field; every rank must raise."""
    r = hvd.rank()
    odd = r == 1
    cases = {
        "shape": lambda: hvd.allreduce(np.ones(3 + odd), name="m_shape"),
        "dtype": lambda: hvd.allreduce(np.ones(3, dtype=np.float64 if odd else np.float32), name="m_dtype"),
        "op": lambda: hvd.allreduce(np.ones(3), name="m_op", op=hvd.Max if odd else hvd.Sum),
        "root": lambda: hvd.broadcast(np.ones(3), root_rank=1 if odd else 0, name="m_root"),
        "collective": lambda: (hvd.allgather(np.ones(3), name="m_kind") if odd
                               else hvd.allreduce(np.ones(3), name="m_kind")),
        "row_shape": lambda: hvd.allgather(np.ones((2, 3 + odd)), name="m_rows"),
        "unnamed_shape": lambda: hvd.allreduce(np.ones(2 + odd)),
    }
    out = {}
    for key, call in cases.items():
        phase(f"mismatch {key}")
        started = time.monotonic()
        try:
            call()
            out[key] = {"error": None}
        except hvd.MismatchError as err:
            out[key] = {"error": str(err), "type": type(err).__name__}
        out[key]["seconds"] = time.monotonic() - started
    # After all that, the same names work when ranks agree.
    phase("after mismatches")
    out["after"] = hvd.allreduce(np.ones(3), name="m_shape", op=hvd.Sum)
    return out


def duplicate() -> dict:
    from mpi4py import MPI

    r, n = hvd.rank(), hvd.size()
    out = {}
    # In turns: the other ranks hold back their call of "dup" until told, so
    # the first call cannot finish before the second is made.
    for turn in range(n):
        if r == turn:
            first = hvd.allreduce_async(np.ones(2), name="dup")
            try:
                hvd.allreduce_async(np.ones(2), name="dup")
                out["error"] = None
            except hvd.DuplicateNameError as err:
                out["error"] = str(err)
                out["is_value_error"] = isinstance(err, ValueError)
            for peer in range(n):
                if peer != turn:
                    MPI.COMM_WORLD.send(None, dest=peer, tag=79)
            out["first"] = hvd.synchronize(first)
        else:
            MPI.COMM_WORLD.recv(source=turn, tag=79)
            hvd.allreduce(np.ones(2), name="dup")
    out["again"] = hvd.allreduce(np.ones(2) * r, name="dup", op=hvd.Sum)  # the name is free again
    return out


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def stall_warning() -> dict:
    """Rank 0 submits a name that rank 1 submits only after rank 0 saw the warning."""
    r = hvd.rank()
    capture = _Capture()
    logging.getLogger("hvd_partial").addHandler(capture)
    out = {}
    if r == 0:
        handle = hvd.allreduce_async(np.ones(1), name="lonely", op=hvd.Sum)
        deadline = time.monotonic() + 60
        phase("waiting for the stall warning")
        while not any("have not submitted" in m for m in capture.messages) and time.monotonic() < deadline:
            time.sleep(0.05)
        hvd.barrier()
        out["result"] = hvd.synchronize(handle)
    else:
        hvd.barrier()
        out["result"] = hvd.allreduce(np.ones(1), name="lonely", op=hvd.Sum)
    # The negotiation's own report (the stall inspector may also report the wait).
    out["warnings"] = [m for m in capture.messages if "lonely" in m and "have not submitted" in m]
    return out


def stall_shutdown() -> dict:
    """Rank 0 waits on a name nobody else submits; the others wait in a barrier
    rank 0 never enters: the stall inspector must fail every rank."""
    r = hvd.rank()
    started = time.monotonic()
    try:
        if r == 0:
            hvd.allreduce(np.ones(1), name="never")
        else:
            hvd.barrier()
        out = {"error": None}
    except hvd.HvdPartialError as err:
        out = {"error": str(err), "type": type(err).__name__}
    out["seconds"] = time.monotonic() - started
    report(out)
    return None


def join() -> dict:
    """Rank r runs r + 1 steps, then joins: joined ranks contribute zeros to
    allreduces; an allgather while a rank has joined fails, as in Horovod."""
    r, n = hvd.rank(), hvd.size()
    sums, gathered = [], []
    for i in range(r + 1):
        phase(f"step {i}")
        sums.append(float(hvd.allreduce(np.ones(2), name=f"step{i}", op=hvd.Sum)[0]))
        try:
            gathered.append(hvd.allgather(np.array([r]), name=f"gather{i}").tolist())
        except hvd.NotSupportedError as err:
            gathered.append(type(err).__name__ if "have joined" in str(err) else str(err))
    phase("join")
    last = hvd.join()
    after = float(hvd.allreduce(np.ones(1), name="after_join", op=hvd.Sum)[0])
    return {"sums": sums, "gathered": gathered, "last": last, "after": after, "size": n}


def left() -> dict:
    """Rank 0 shuts down without submitting a name that rank 1 waits on."""
    if hvd.rank() == 0:
        hvd.shutdown()
        return {"shut_down": True}
    handle = hvd.allreduce_async(np.ones(1), name="orphan")
    try:
        hvd.synchronize(handle)
        out = {"error": None}
    except hvd.RankFailedError as err:
        out = {"error": str(err), "rank": err.rank}
    hvd.shutdown()
    return out


def reinit() -> dict:
    out = []
    for attempt in range(2):
        hvd.init()
        out.append(hvd.allreduce(np.array([hvd.rank() + attempt]), op=hvd.Sum).tolist())
        out.append(hvd.allgather_object(attempt))
        hvd.shutdown()
    return {"results": out}


CASES = {"values": values, "mismatch": mismatch, "duplicate": duplicate, "stall_warning": stall_warning,
         "stall_shutdown": stall_shutdown, "join": join, "reinit": reinit, "left": left}


if __name__ == "__main__":
    case = sys.argv[1]
    if case not in ("reinit",):
        hvd.init()
    result = CASES[case]()
    if result is not None:
        report(result)
    if case not in ("reinit", "left"):
        hvd.shutdown()
