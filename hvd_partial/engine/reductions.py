"""Reduction progress: the rounds the protocol driver launched, started on
each stream's own MPI communicator and tested until they complete.

Each stream gets a communicator of its own (duplicated one at a time, in
registration order, the same on every rank), so that collectives of different
streams never need ordering against each other; a stream's rounds complete in
the order they were launched.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from .. import faults
from ..core.buffer_pool import BufferPool
from ..core.rank_stream import Launch, RankStream
from ..errors import PartialResultError, TooManyStreamsError
from ..transport.protocol import Transport

# How long a reduction is tested continuously before the tests space out
# (reduce_poll_us); see Reductions.poll.
_PATIENCE_SECONDS = 1e-3


def _counted_copies(pool: BufferPool, send: list) -> tuple[list, list]:
    """Copies of ``send`` to reduce, each one element longer, set to 1: after the
    sum it counts the ranks whose part arrived. Returns (buffers to reduce, views of the data)."""
    counted, views = [], []
    for s in send:
        buf = pool.take_one(s.size + 1, s.dtype.name)
        np.copyto(buf[:-1], s.reshape(-1))
        buf[-1] = 1
        counted.append(buf)
        views.append(buf[:-1].reshape(s.shape))
    return counted, views


def _every_part_arrived(entry: "RoundEntry") -> bool:
    return all(int(buf[-1]) == entry.expected for buf in entry.counted)


class RoundEntry:
    """A launched round: its receive buffers and MPI requests once started
    (the facts' request, of a solo or majority round, is also kept apart)."""

    __slots__ = ("launch", "recv", "requests", "facts_request", "started", "counted", "expected")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.recv = None
        self.counted = None  # elastic training: the reduced buffers, each with a count of contributors last
        self.expected = 0  # ... which must be the size of the world the round ran on
        self.requests = None
        self.facts_request = None
        self.started = 0.0


class Reductions:
    """Every stream's rounds in flight on this rank.

    ``complete(stream, launch, reduced)`` is called for each finished round, in
    launch order per stream (``reduced`` is None for a round nobody sent to).
    """

    def __init__(self, transport: Transport, rank: int, reduce_poll_us: float,
                 complete: Callable[[RankStream, Launch, Any], None]):
        self.transport = transport
        self.rank = rank
        self._complete = complete
        self._reduce_poll = reduce_poll_us / 1e6
        self._streams: dict[int, RankStream] = {}
        self._rounds: dict[int, deque] = {}
        self._pools: dict[int, BufferPool] = {}
        self._comms: dict[int, Any] = {}  # stream id -> its communicator, once duplicated
        self._awaiting_comm: set[int] = set()  # stream ids still without a communicator
        self._next_comm = 0  # communicators are duplicated in stream id order, the same on every rank
        self._duplicating: tuple | None = None  # (stream id, communicator, request)
        # Elastic training: reduce into copies, never in place, so that each round's
        # contribution survives a failure in the middle of its reduction (to be redone).
        self.keep_contributions = False

    def add_stream(self, stream: RankStream) -> None:
        """A stream was registered (in the same order on every rank): it needs a communicator."""
        sid = stream.id
        self._rounds[sid] = deque()
        self._streams[sid] = stream
        self._pools[sid] = BufferPool()
        self._awaiting_comm.add(sid)

    def launch(self, stream: RankStream, launch: Launch) -> None:
        self._rounds[stream.id].append(RoundEntry(launch))
        self._start_entries(stream.id)

    @property
    def in_flight(self) -> bool:
        return any(self._rounds.values())

    def only_awaiting_start(self, awaiting: Callable[[int, int], bool]) -> bool:
        """Whether every stream's oldest round in flight is one this rank
        joined before it started (``awaiting(stream id, round)``), so that
        none can finish before a peer's activation comes."""
        heads = [(sid, q[0]) for sid, q in self._rounds.items() if q]
        # once the facts are reduced every rank joined: the data needs this rank in MPI
        return bool(heads) and all(awaiting(sid, e.launch.round) and not self._facts_done(e) for sid, e in heads)

    def everyone_joined(self, sid: int, round_number: int) -> bool:
        """Whether every rank has joined round ``round_number`` of stream
        ``sid``, still in flight here: its facts' reduction completed, and an
        allreduce completes only once every rank started it."""
        for entry in self._rounds.get(sid, ()):
            if entry.launch.round == round_number:
                return self._facts_done(entry)
        return False

    def _facts_done(self, entry: RoundEntry) -> bool:
        return entry.facts_request is not None and self.transport.done([entry.facts_request])

    def progress(self) -> bool:
        """Start what can start, complete what finished; True if anything did."""
        worked = False
        if self._duplicating is not None or self._awaiting_comm:
            worked = self._progress_comms()
        for sid, queue in self._rounds.items():
            while queue:
                entry = queue[0]
                if entry.launch.send is not None:
                    if entry.requests is None or not self._finished(entry):
                        break
                queue.popleft()
                self._complete(self._streams[sid], entry.launch, entry.recv)
                worked = True
        return worked

    def _finished(self, entry: RoundEntry) -> bool:
        if not self.keep_contributions:
            return self.transport.done(entry.requests)
        # Elastic training: a request that completed in error raises, and so does one that
        # completed without every rank's part (Open MPI's nonblocking collectives can, once a peer died).
        if not self.transport.done_checked(entry.requests):
            return False
        if not _every_part_arrived(entry):
            raise PartialResultError(f"rank {self.rank}: round {entry.launch.round} completed without every rank's "
                                    "part (a peer died)")
        return True

    def poll(self, deadline: float, commands) -> None:
        """Test the oldest reduction of every stream until one completes, a
        command arrives on the ``commands`` queue or ``deadline`` passes.

        Tests follow each other, yielding the CPU in between (a reduction
        progresses only while every rank's engine is in MPI). With
        ``reduce_poll_us`` set, a reduction in flight for over a millisecond
        is tested that often instead, sleeping in between, which leaves the
        CPU to ranks that compute meanwhile (off by default: it slows mid-size
        rounds; see docs/history/engine-performance.md).
        """
        entries = [q[0] for q in self._rounds.values() if q and q[0].requests is not None]
        if not entries:
            os.sched_yield()
            return
        heads = [e.requests for e in entries]
        # With no spacing set the tests never sleep: no need to know the age.
        patient_until = min(e.started for e in entries) + _PATIENCE_SECONDS if self._reduce_poll else float("inf")
        done = self.transport.done
        while not commands:
            for requests in heads:
                if done(requests):
                    return
            now = time.perf_counter()
            if now >= deadline:
                return
            if now < patient_until:
                os.sched_yield()
            else:
                time.sleep(self._reduce_poll)

    def free_comms(self) -> None:
        """Free the streams' communicators (collective: every rank, in stream order)."""
        if self._duplicating is not None:
            sid, comm, request = self._duplicating
            request.Wait()
            self._comms[sid] = comm
            self._duplicating = None
        for sid in sorted(self._comms):
            self._comms[sid].Free()
        self._comms.clear()

    # -- elastic training: surviving a dead rank ------------------------------------------

    def complete_finished(self, is_failure: Callable[[BaseException], bool]) -> None:
        """Complete every round whose reduction finished here before the failure,
        in order per stream, stopping at a stream's first round that failed."""
        for sid, queue in self._rounds.items():
            while queue:
                entry = queue[0]
                if entry.launch.send is not None:
                    try:
                        if entry.requests is None or not self._finished(entry):
                            break
                    except PartialResultError:
                        break
                    except Exception as err:  # noqa: BLE001 - MPI's error types stay in the transport
                        if not is_failure(err):
                            raise
                        break
                queue.popleft()
                self._complete(self._streams[sid], entry.launch, entry.recv)

    def stream_comms(self) -> list:
        """The streams' communicators made so far (not one still being duplicated)."""
        return list(self._comms.values())

    @property
    def duplicating(self) -> bool:
        return self._duplicating is not None

    def pop_round(self, sid: int, round_number: int) -> Launch:
        """Take the oldest round of stream ``sid`` off, unreduced: a survivor that completed it
        hands this rank its result."""
        entry = self._rounds[sid].popleft()
        if entry.launch.round != round_number:
            raise AssertionError(f"stream {sid}: round {entry.launch.round} in flight, expected {round_number}")
        return entry.launch

    def in_flight_launches(self, sid: int) -> list[Launch]:
        return [entry.launch for entry in self._rounds.get(sid, ())]

    def remake_comms(self, make) -> None:
        """The world shrank: forget the old communicators (revoked, never freed) and make
        one per registered stream with ``make()``, in stream id order (the same on every survivor)."""
        self._comms.clear()
        self._duplicating = None
        self._awaiting_comm.clear()
        for sid in sorted(self._streams):
            self._comms[sid] = make()
        self._next_comm = max(self._streams, default=-1) + 1

    def restart(self, sid: int) -> None:
        """Start stream ``sid``'s rounds in flight again, on its new communicator."""
        for entry in self._rounds[sid]:
            entry.requests = entry.facts_request = entry.recv = entry.counted = None
        self._start_entries(sid)

    # -- internals ----------------------------------------------------------------------

    def _progress_comms(self) -> bool:
        """Duplicate the streams' communicators one at a time, in registration
        order (the same on every rank): Open MPI deadlocks with several
        duplications of one communicator in flight."""
        worked = False
        sid = None
        try:
            if self._duplicating is not None:
                sid, comm, request = self._duplicating
                if not self.transport.stream_comm_ready(request):
                    return False
                self._duplicating = None
                self._comms[sid] = comm
                self._start_entries(sid)
                worked = True
            if self._next_comm in self._awaiting_comm:
                sid = self._next_comm
                self._awaiting_comm.discard(sid)
                self._next_comm += 1
                comm, request = self.transport.new_stream_comm()
                self._duplicating = (sid, comm, request)
                worked = True
        except TooManyStreamsError as err:
            raise TooManyStreamsError(
                f"MPI could not create a communicator for stream {self._streams[sid].name!r} (stream number "
                f"{len(self._comms) + 1}) on rank {self.rank}: {err}. Every stream holds an MPI communicator of its "
                "own and MPI allows only so many (MPICH about 2,000): reduce many arrays as one stream with "
                "grouped_partial_allreduce_async") from err
        return worked

    def _start_entries(self, sid: int) -> None:
        comm = self._comms.get(sid)
        if comm is None:  # still being duplicated
            return
        pool = self._pools[sid]
        for entry in self._rounds[sid]:
            launch = entry.launch
            if entry.requests is None and launch.send is not None:
                # Every reduction is in place: MPI needs MPI_IN_PLACE on all
                # ranks of an allreduce or on none, while whether a send buffer
                # is the stream's own is a local fact. An owned buffer becomes
                # the result; the caller's arrays (and shared zeros) are copied
                # into a pooled one first, as MPI would copy into a receive buffer.
                if self.keep_contributions:
                    entry.counted, entry.recv, entry.expected = *_counted_copies(pool, launch.send), self.transport.size
                    reduced = entry.counted
                else:
                    entry.recv = reduced = [s if mine else pool.copy_of(s) for s, mine in zip(launch.send, launch.owned)]
                recv = reduced
                start = self.transport.iallreduce_in_place
                if launch.with_facts:
                    # The facts (small) go first, so that their completion soon tells that
                    # every rank joined, however long the data takes (see everyone_joined).
                    entry.facts_request = start(comm, recv[-1])
                    entry.requests = [start(comm, r) for r in recv[:-1]] + [entry.facts_request]
                else:
                    entry.requests = [start(comm, r) for r in recv]
                entry.started = time.perf_counter()
                faults.point("round_launched")
