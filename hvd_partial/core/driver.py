"""The protocol driver of one rank: the only glue between the pure core and
whatever moves messages and reduces buffers (the MPI engine, the loopback
world, the simulator). Pure: no MPI, no threads, no clocks.

It is written peer to peer. Its inputs are this rank's calls (post, flush,
leave), messages from peer ranks, and reductions that completed here; its
outputs go to a :class:`DriverHost`: a message to a peer rank (possibly this
one), a reduction to start, a call that is done or refused. Round decisions
belong to a control policy (:class:`~hvd_partial.core.control.ControlPolicy`:
the decentralized one unless a simulation names another), which the driver
reaches through reports and peer messages and which starts rounds through it.

Example::

    driver = Driver(rank, size, host)  # host: send, stream_registered, launch, reduced, finished, refused, failed
    driver.post(PostRequest("g", [buf], [False], layout, False, False, Sum, signature), Waiter("post"))
    driver.on_message(source, message)  # for every message from a peer
    driver.complete(stream, launch, reduced)  # for every reduction that finished
"""

from __future__ import annotations

from typing import Callable, Protocol

from .. import faults
from ..errors import HvdPartialError, MismatchError, StreamConflictError
from .control import ControlPolicy, DecentralControl
from .messages import Closed, FlushBegun, Goodbye, Register, Registered, Rejected, Start
from .post_request import PostRequest
from .rank_stream import Launch, RankStream, Waiter
from .round_result import RoundResult


class DriverHost(Protocol):
    """What a driver needs from the code that runs it."""

    def send(self, dest: int, message) -> None:
        """Deliver ``message`` to rank ``dest`` (this rank too), in order per pair of ranks."""

    def stream_registered(self, stream: RankStream) -> None:
        """``stream`` got its id; streams register in the same order on every rank."""

    def launch(self, stream: RankStream, launch: Launch) -> None:
        """Start the reduction ``launch``; call ``Driver.complete`` when it finished."""

    def reduced(self, stream: RankStream, launch: Launch, result: RoundResult) -> None:
        """A round completed on this rank (before any call is woken by it)."""

    def finished(self, stream: RankStream, waiter: Waiter) -> None:
        """A post or flush is done; its results are in ``waiter.results``."""

    def refused(self, waiter: Waiter, error: Exception) -> None:
        """A post failed with ``error`` (the ranks disagree about its stream)."""

    def failed(self, error: Exception) -> None:
        """This rank cannot go on (every rank must be told)."""

    def defer_activation(self, stream_id: int, round_number: int) -> None:
        """Only where the driver was made with ``defer_activations``: after the
        activation delay, call ``Driver.release_flood(stream_id, round_number,
        everyone_joined)`` while ``Driver.holds_flood(stream_id, round_number)``,
        with ``everyone_joined`` true if the host knows that every rank joined
        the round (its facts' reduction completed)."""


class Driver:
    """The protocol of every stream of one rank."""

    def __init__(self, rank: int, size: int, host: DriverHost, defer_activations: bool = False,
                 quorum_counters=None, control: Callable[..., ControlPolicy] = DecentralControl):
        """``quorum_counters(n)``: the host's :class:`~.decentral.quorum.QuorumCounters`
        of the n-th stream with a quorum to register (more than one rank);
        ``control(rank, size, send, start, defer, quorum_counters)`` makes the policy."""
        self.rank = rank
        self.size = size
        self.host = host
        # The policy sends and starts rounds through the driver, which holds its host as given
        # (the engine passes a weak proxy: no cycle keeps a stopped engine alive).
        self.control = control(rank, size, self._send, self._start_round,
                               self._defer_activation if defer_activations else None, quorum_counters)
        self.streams: dict[str, RankStream] = {}
        self.by_id: dict[int, RankStream] = {}
        self._held: dict[str, tuple] = {}  # first posts waiting for registration: (buffers, owned, waiter)
        self.leaving = False  # shutdown began: flush every stream, then say goodbye
        self.closed = False  # every rank said goodbye and every flush round started
        self._to_flush: set[int] = set()
        self._flushed: set[int] = set()
        self._goodbye_sent: frozenset | None = None
        # Elastic training, after the world grew: stream name -> rounds it completed on the engine
        # before (docs/elastic.md, "Growing back"). Such a stream registers again with its first
        # post here and numbers its rounds on from there; a flush before that post has nothing to do.
        self.carried: dict[str, int] = {}
        self._decisions = {Start: self._on_start, Registered: self._on_registered, Rejected: self._on_rejected,
                           FlushBegun: self._on_flush_begun, Closed: self._on_closed}

    # -- this rank's calls ------------------------------------------------------------

    def post(self, request: PostRequest, waiter: Waiter) -> None:
        """Post ``request.buffers`` to stream ``request.name``; ``waiter`` is finished (or refused) later."""
        name = request.name
        stream = self.streams.get(name)
        if stream is None:
            stream = RankStream(self.rank, self.size, name, request.layout, request.sync, request.op,
                                grouped=request.grouped)
            stream.round_offset = self.carried.get(name, 0)
            self.streams[name] = stream
            self._held[name] = (request.buffers, request.owned, waiter)
            faults.point("registration_reported")
            try:
                self.control.report(Register(self.rank, name, request.signature))
            except HvdPartialError:  # refused before any peer heard of it: as if never posted
                del self.streams[name], self._held[name]
                raise
            return
        if stream.id is None:
            raise StreamConflictError(
                f"stream {name!r} is still registering on rank {self.rank}; synchronize its first post first")
        self._after_post(stream, waiter, *stream.post(request.buffers, request.owned, waiter))

    def flush(self, name: str, waiter: Waiter) -> None:
        stream = self.streams.get(name)
        if stream is None:
            raise StreamConflictError(f"flush({name!r}) on rank {self.rank}: this rank never posted to that stream")
        if stream.id is None:
            raise StreamConflictError(
                f"flush({name!r}) on rank {self.rank}: the stream is still registering; synchronize its first post")
        self.control.report(stream.flush(waiter))

    def park(self) -> None:
        """This rank waits in a call that needs every rank (a helper collective,
        a flush): until :meth:`unpark`, its idle solo and majority streams hold nobody back."""
        self.control.park()

    def unpark(self) -> None:
        self.control.unpark()

    def take(self, name: str) -> list[RoundResult] | None:
        """Take the rounds of stream ``name`` completed since this rank's last take,
        without posting (none while a post or flush of it is in progress); None
        until every round this rank joined parked has completed (ask again then)."""
        stream = self.streams.get(name)
        if stream is None or stream.id is None:
            return []
        if not self.control.take_ready(stream):
            return None
        results = stream.take()
        if results:
            self.control.take(stream)
        return results

    def leave(self) -> None:
        """Begin shutdown: flush every stream (in id order) once it is idle, then say goodbye."""
        self.leaving = True
        self._to_flush = set(self.by_id) - self._flushed
        self._progress_leaving()

    @property
    def left(self) -> bool:
        """Shutdown is complete as far as the protocol goes (reductions may still run)."""
        return self.leaving and self.closed and not self._to_flush and not self.waiting

    @property
    def waiting(self) -> bool:
        """Some post or flush of this rank is not done."""
        return bool(self._held) or any(s.waiter is not None for s in self.streams.values())

    def fail(self, error: Exception | None = None) -> list[Waiter]:
        """Forget every call in progress (this rank failed); returns their waiters."""
        self.control.fail(error)
        out = [w for _, _, w in self._held.values()]
        self._held.clear()
        for stream in self.streams.values():
            if stream.waiter is not None:
                out.append(stream.waiter)
                stream.waiter = None
        return out

    # -- events -------------------------------------------------------------------------

    def on_message(self, source: int, message) -> None:
        handler = self._decisions.get(type(message))
        if handler is None:
            self.control.on_message(source, message)
        else:
            handler(message)
        if self.leaving:
            self._progress_leaving()

    def for_control(self, message) -> bool:
        """Whether ``message`` goes to the control policy (rather than being one of its decisions)."""
        return type(message) not in self._decisions

    def complete(self, stream: RankStream, launch: Launch, reduced: list | None) -> RoundResult:
        """The reduction ``launch`` finished with ``reduced`` (None: nothing was sent anywhere)."""
        waiter = stream.complete(launch, reduced)
        result = waiter.results[-1] if waiter is not None else stream.results[-1]
        self.host.reduced(stream, launch, result)
        if waiter is not None:
            self.host.finished(stream, waiter)
        self.control.round_completed(stream, launch, result)
        if self.leaving:
            self._progress_leaving()
        return result

    # -- a failure: the survivors go on in a smaller world (elastic training; core/rebase.py) --

    def begin_again(self) -> None:
        """Last: this rank's own agreement reports that no outcome answered begin again."""
        self.control.agreements.begin_again()
        if self.leaving:
            self._progress_leaving()

    # -- decisions from the control policy ----------------------------------------------------

    def _on_start(self, message: Start) -> None:
        stream = self.by_id[message.stream]
        self.host.launch(stream, stream.on_start(message))

    def _on_registered(self, message: Registered) -> None:
        stream = self.streams[message.name]
        stream.id = message.stream
        self.by_id[message.stream] = stream
        self.host.stream_registered(stream)
        buffers, owned, waiter = self._held.pop(message.name)
        self._after_post(stream, waiter, *stream.post(buffers, owned, waiter, registered=False))
        self.control.registered(stream)
        if self.leaving:
            self._to_flush.add(message.stream)

    def _on_rejected(self, message: Rejected) -> None:
        self.streams.pop(message.name, None)
        held = self._held.pop(message.name, None)
        if held is not None:
            self.host.refused(held[2], MismatchError(f"rank {self.rank}: {message.reason}"))

    def _on_flush_begun(self, message: FlushBegun) -> None:
        problem = self.by_id[message.stream].on_flush_begun(message)
        if problem is not None:
            # A round of this stream is in flight that the flushing rank will
            # never join; it cannot be cancelled, so this rank stops.
            self.host.failed(MismatchError(problem))

    def _on_closed(self, message: Closed) -> None:
        self.closed = True

    # -- internals ------------------------------------------------------------------------------

    def _send(self, dest: int, message) -> None:
        self.host.send(dest, message)

    def _defer_activation(self, sid: int, round_number: int) -> None:
        self.host.defer_activation(sid, round_number)

    def holds_flood(self, sid: int, round_number: int) -> bool:
        """Whether this rank still holds back the flood of that round (else its timer has nothing to do)."""
        return self.control.holds_flood(sid, round_number)

    def release_flood(self, sid: int, round_number: int, everyone_joined: bool = False) -> None:
        """The host's timer: the activation delay of ``round_number`` of stream
        ``sid`` passed, so its held-back flood goes out (dropped if ``everyone_joined``)."""
        self.control.release_flood(sid, round_number, everyone_joined)
        if self.leaving:
            self._progress_leaving()

    def release_message(self, sid: int, round_number: int, everyone_joined: bool = False):
        """The message that ends the activation delay of ``round_number`` of
        stream ``sid``; ``everyone_joined``: the host knows that every rank
        joined the round (its facts' reduction completed), so the flood is dropped."""
        return self.control.release_message(sid, round_number, everyone_joined)

    def _start_round(self, sid: int, round_number: int, facts) -> None:
        """The control policy started a round here (with this rank's ``facts``)."""
        stream = self.by_id[sid]
        self.host.launch(stream, stream.join(round_number, facts))

    def _after_post(self, stream: RankStream, waiter: Waiter, report, launch, done) -> None:
        if report is not None:
            self.control.posted(stream, *report)
        if launch is not None:
            self.host.launch(stream, launch)
        if done:
            self.host.finished(stream, waiter)

    def _progress_leaving(self) -> None:
        for sid in sorted(self._to_flush):
            stream = self.by_id[sid]
            if stream.waiter is None:
                self.control.report(stream.flush(Waiter("flush"), final=True))
                self._to_flush.discard(sid)
                self._flushed.add(sid)
        if not self._to_flush and self._goodbye_sent != frozenset(self._flushed):
            self._goodbye_sent = frozenset(self._flushed)
            self.control.report(Goodbye(self.rank, tuple(sorted(self._flushed)), tuple(self.streams)))
        if self._goodbye_sent is not None and not self._to_flush and not self.waiting:
            self.control.shutdown_ready()
