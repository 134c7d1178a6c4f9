"""The MPI side of the negotiated helper collectives: every call goes to ONE
communicator (the transport's ``helpers`` duplicate), whatever the number of
names, so thousands of helper calls never take an MPI communicator each.

Collectives are started in the same order on every rank (the negotiation
decides that order); each method returns an MPI request, or a list of them,
that :meth:`HelperChannel.done` tests. Wake-up notices are tiny
point-to-point messages on the same communicator (another matching context
than its collectives, so they never interfere).

Example (engine thread)::

    channel = HelperChannel(transport.helpers, doorbell=transport.doorbell)
    lengths = np.empty(channel.size, np.int64)
    request = channel.allgather_counts(np.array([n], np.int64), lengths)
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

TAG_WAKE = 21

_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "product": MPI.PROD}


class HelperChannel:
    """Nonblocking collectives and wake-up notices on one communicator."""

    def __init__(self, comm, doorbell=None, tag_base: int = 0):
        self.comm = comm
        self._wake_tag = tag_base + TAG_WAKE  # the session's own (see MpiTransport.tag_base)
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.doorbell = doorbell
        self.count_parts = False  # elastic training: collectives check that every rank's part arrived
        # A process set's channel: a second duplicate of the set's communicator, the world of the
        # set's own engine (solo and majority among its members; hvd_partial.collectives.set_engines)
        self.engine_comm = None
        self._sends: list = []
        self._wake_buffer = np.zeros(1, dtype=np.int64)

    @staticmethod
    def done(requests) -> bool:
        """Whether ``requests`` completed; raises if one completed in error (a dead peer,
        whose error Open MPI's nonblocking collectives may report only in the status)."""
        if not isinstance(requests, list):
            requests = [requests]
        statuses = [MPI.Status() for _ in requests]
        if not MPI.Request.Testall(requests, statuses):
            return False
        for status in statuses:
            if status.Get_error() != MPI.SUCCESS:
                raise MPI.Exception(status.Get_error())
        return True

    # -- negotiation --------------------------------------------------------------

    def allgather_counts(self, mine: np.ndarray, out: np.ndarray):
        """Every rank's ``mine`` (one int64) into ``out``."""
        return self.comm.Iallgather(mine, out)

    def allgather_bytes(self, mine: np.ndarray, out: np.ndarray, counts):
        """Every rank's bytes, concatenated in rank order (``counts`` bytes each)."""
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return self.comm.Iallgatherv([mine, MPI.BYTE],
                                     [out, list(map(int, counts)), list(map(int, displacements)), MPI.BYTE])

    def wake(self, cycle: int) -> None:
        """Tell every other rank to join negotiation cycle ``cycle``."""
        payload = np.array([cycle], dtype=np.int64)
        for dest in range(self.size):
            if dest != self.rank:
                self._sends.append((self.comm.Isend(payload, dest=dest, tag=self._wake_tag), payload))
                if self.doorbell is not None:
                    self.doorbell.ring(dest)

    def wakes(self) -> list[int]:
        """Cycles that peers asked this rank to join since the last call."""
        if self._sends:
            self._sends = [(r, p) for r, p in self._sends if not r.Test()]
        out = []
        while self.comm.Iprobe(MPI.ANY_SOURCE, self._wake_tag):
            self.comm.Recv(self._wake_buffer, source=MPI.ANY_SOURCE, tag=self._wake_tag)
            out.append(int(self._wake_buffer[0]))
        return out

    # -- data -------------------------------------------------------------------------

    def allreduce(self, send: np.ndarray, recv: np.ndarray, op: str):
        return self.comm.Iallreduce(send, recv, op=_OPS[op])

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts, op: str):
        return self.comm.Ireduce_scatter(send, recv, list(map(int, counts)), op=_OPS[op])

    def broadcast_bytes(self, buffer: np.ndarray, root: int):
        return self.comm.Ibcast([buffer, MPI.BYTE], root=root)

    def allgather_rows(self, send: np.ndarray, recv: np.ndarray, byte_counts):
        return self.allgather_bytes(send, recv, byte_counts)

    def alltoall_bytes(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts):
        sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(np.int64)
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(np.int64)
        return self.comm.Ialltoallv([send, list(map(int, send_counts)), list(map(int, sdispl)), MPI.BYTE],
                                    [recv, list(map(int, recv_counts)), list(map(int, rdispl)), MPI.BYTE])

    # -- process sets ---------------------------------------------------------------

    def split(self, member: bool):
        """A communicator of the ranks that pass ``member=True``, in rank order (collective,
        blocking: every rank calls it at the same point); None where ``member`` is False."""
        comm = self.comm.Split(0 if member else MPI.UNDEFINED, self.rank)
        return None if comm == MPI.COMM_NULL else comm

    def on(self, comm) -> "HelperChannel":
        """A channel for the data collectives of a process set on ``comm`` (no wake-ups), with
        ``engine_comm``, a duplicate of ``comm`` for the set's own engine (collective over the set)."""
        channel = HelperChannel(comm, None, self._wake_tag - TAG_WAKE)
        channel.count_parts = self.count_parts
        channel.engine_comm = comm.Dup()
        return channel

    def free(self) -> None:
        """Free this channel's communicators (a process set removed, on every member)."""
        if self.engine_comm is not None:
            self.engine_comm.Free()
        self.comm.Free()

    def abandon(self) -> None:
        """The world changed (elastic training): revoke the communicators where MPI can, so that
        nothing pending on them waits for a rank that is gone; they are never used again."""
        for comm in filter(None, (self.comm, self.engine_comm)):
            revoke = getattr(comm, "Revoke", None)
            try:
                if revoke is not None and not comm.Is_revoked():
                    revoke()
            except (MPI.Exception, NotImplementedError, AttributeError):  # an MPI without ULFM
                pass

    def communicator_handle(self) -> int:
        """The communicator's MPI handle (for checks that no new one appears)."""
        return int(MPI._handleof(self.comm))
