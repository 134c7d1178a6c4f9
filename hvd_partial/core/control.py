"""The control policy: who decides when the rounds of solo and majority
streams start, and how the ranks agree on registration, sync flushes and
shutdown. A :class:`~hvd_partial.core.driver.Driver` reports its rank's events
to its policy (:class:`ControlPolicy`) and hands it the peer messages the
driver itself does not handle.

The product's policy is :class:`DecentralControl`: every rank runs each solo
or majority stream's :class:`~hvd_partial.core.decentral.stream.DecentralStream`
and starts rounds itself; agreements go up a tree to rank 0 and are flooded
back (:mod:`hvd_partial.core.decentral.agreement`). O(log P) control messages
per rank per round; docs/control-plane.md.

Example::

    control = DecentralControl(rank=0, size=4, send=..., start=...)
    control.report(Register(0, "g", signature))  # joins the registration gather
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..errors import ConfigError, EngineError
from ..modes import mode_from_description
from .decentral.agreement import Agreements
from .decentral.messages import Defer, Join, ReleaseActivation, Send
from .decentral.stream import DecentralStream
from .messages import Flush, Goodbye, Register


class ControlPolicy(Protocol):
    """What a driver asks of its control policy. The policy acts through the
    callables it was made with: ``send(dest, message)`` (its decisions for its
    own rank are messages to itself), ``start(stream_id, round, facts)`` and,
    where the host holds floods back, ``defer(stream_id, round)``."""

    def report(self, message) -> None:
        """This rank's own Register, Flush or Goodbye."""

    def posted(self, stream, seq: int, computed_for: int, taken: int, waiting: bool) -> None:
        """This rank posted to the registered ``stream``."""

    def on_message(self, source: int, message) -> None:
        """A peer message the driver does not handle itself."""

    def registered(self, stream) -> None:
        """``stream`` got its id here and holds this rank's first post."""

    def round_completed(self, stream, launch, result=None) -> None:
        """This rank completed ``launch`` of ``stream``."""

    def take(self, stream) -> None:
        """The rank stream took its completed rounds outside a post."""

    def take_ready(self, stream) -> bool:
        """Whether every round this rank joined parked on ``stream`` has completed here."""

    def park(self) -> None:
        """This rank waits in a call that needs every rank."""

    def unpark(self) -> None:
        """The call that parked this rank returned."""

    def shutdown_ready(self) -> None:
        """This rank's shutdown is done but for knowing that every rank's is."""

    def fail(self, error: Exception) -> None:
        """This rank failed: decide nothing more."""

    def decides_completion(self, stream) -> bool:
        """Whether a completion of ``stream`` feeds a decision at this rank (the simulator's cost model)."""

    def awaiting_start(self, stream_id: int, round_number: int) -> bool:
        """Whether this rank joined that round before hearing that it started
        (its reduction cannot finish before then, so the host may nap)."""

    def holds_flood(self, stream_id: int, round_number: int) -> bool:
        """Whether this rank still holds back the flood of that round."""

    def release_flood(self, stream_id: int, round_number: int, everyone_joined: bool = False) -> None:
        """The host's timer: the activation delay of that round passed (``everyone_joined``: its facts are reduced)."""

    def release_message(self, stream_id: int, round_number: int, everyone_joined: bool = False):
        """The same news as a message to this rank, for worlds that model the delay as one."""

@dataclass(frozen=True, slots=True)
class StreamMessage:
    """A decentralized stream's message to a peer: ``message`` is for stream ``stream`` (its id)."""

    stream: int
    message: Any

    def __reduce__(self):  # a plain tuple on the wire: one per activation, so it should be cheap
        return StreamMessage, (self.stream, self.message)


class DecentralControl:
    """No coordinator: every solo and majority stream runs a
    :class:`~hvd_partial.core.decentral.stream.DecentralStream` on every rank,
    which starts rounds here (``start(stream_id, round, facts)``), floods
    activations to hypercube neighbours and gathers catch-up, flush and quorum
    notices, O(log P) messages per rank per round (docs/control-plane.md).
    Registration, sync streams' flushes and shutdown are
    :class:`~hvd_partial.core.decentral.agreement.Agreements`: gathers to rank 0
    and floods of the outcome, O(log P) messages per rank each.
    """

    def __init__(self, rank: int, size: int, send: Callable[[int, object], None],
                 start: Callable[[int, int, object], None], defer: Callable[[int, int], None] | None = None,
                 quorum_counters: Callable[[int], object] | None = None):
        self.rank = rank
        self.size = size
        self._send = send
        self._start = start
        # Where the host holds a solo round's flood back (defer(stream_id, round); see
        # DecentralStream), it later delivers release_message(stream_id, round) to this rank.
        self._defer = defer
        # The host's quorum counters of the n-th stream with a quorum (QuorumCounters; streams
        # register in the same order on every rank, so n is the same everywhere).
        self._quorum_counters = quorum_counters
        self._quorum_streams = 0
        self._quorum_pending: set[str] = set()  # proposed streams with a quorum, not yet registered
        # Outcomes for this rank's driver travel as messages to itself.
        self.agreements = Agreements(rank, size, send, lambda decision: send(rank, decision))
        self.streams: dict[int, DecentralStream] = {}
        self._signatures: dict[str, object] = {}

    def posted(self, stream, seq: int, computed_for: int, taken: int, waiting: bool) -> None:
        # The stream's DecentralStream reads the post from the rank stream itself.
        machine = self.streams.get(stream.id)
        if machine is None:
            raise EngineError(f"rank {self.rank}: a post to {stream.name!r}, which has no decentralized rounds")
        self._carry_out(stream.id, machine.post())

    def report(self, message) -> None:
        kind = type(message)
        if kind is Flush:
            stream = self.streams.get(message.stream)
            if stream is not None:
                self._carry_out(message.stream, stream.flush(message.final))
            else:
                self.agreements.sync_flush(message.stream, message.taken)
            return
        elif kind is Register:
            if _quorum_of(message.signature) is not None and self._quorum_counters is not None:
                # Probe the counters this stream would get, so that a full window refuses
                # this rank's own first post (the same post on every rank), not the engine.
                self._quorum_counters(self._quorum_streams + len(self._quorum_pending))
                self._quorum_pending.add(message.name)
            self._signatures[message.name] = message.signature
            self.agreements.register(message.name, message.signature)
            return
        elif kind is Goodbye:
            self.agreements.leave(message.names)
            return
        raise EngineError(f"rank {self.rank}: unexpected report {message!r}")

    def shutdown_ready(self) -> None:
        self.agreements.done()

    def park(self) -> None:
        """This rank waits in a call that needs every rank: its idle streams hold nobody back."""
        for sid, machine in self.streams.items():
            self._carry_out(sid, machine.park())

    def unpark(self) -> None:
        for machine in self.streams.values():
            machine.unpark()

    def take(self, stream) -> None:
        """The rank stream took its completed rounds outside a post: so does its state machine."""
        machine = self.streams.get(stream.id)
        if machine is not None:
            self._carry_out(stream.id, machine.took())

    def take_ready(self, stream) -> bool:
        """Every round this rank joined parked on ``stream`` has completed here."""
        machine = self.streams.get(stream.id)
        return machine is None or machine.take_ready

    def registered(self, stream) -> None:
        signature = self._signatures.pop(stream.name, None)
        self._quorum_pending.discard(stream.name)
        if stream.sync or signature is None:
            return
        mode = mode_from_description(signature.mode)
        if mode.kind not in ("solo", "majority"):
            raise ConfigError(f"stream {stream.name!r}: no decentralized rounds for mode {mode.kind!r}")
        quorum = _quorum_of(signature)
        counters = None
        if quorum is not None and self._quorum_counters is not None:
            counters = self._quorum_counters(self._quorum_streams)
            self._quorum_streams += 1
        # the machine reads the rank stream's posts (the first one, which the registration carried, too)
        machine = DecentralStream(self.rank, self.size, mode.kind, signature.max_staleness, stream, stream.name,
                                  seed=getattr(mode, "seed", 0), quorum=quorum,
                                  defer_activations=self._defer is not None, counters=counters)
        self.streams[stream.id] = machine
        stream.read_facts = machine.read_facts
        stream.posts_need_data = True
        self._carry_out(stream.id, machine.registered())

    def on_message(self, source: int, message) -> None:
        if type(message) is StreamMessage:
            self._carry_out(message.stream, self.streams[message.stream].on_message(source, message.message))
        else:
            self.agreements.on_message(source, message)

    def decides_completion(self, stream) -> bool:
        return False

    def awaiting_start(self, sid: int, round_number: int) -> bool:
        machine = self.streams.get(sid)
        return machine is not None and machine.floods.awaiting_start == round_number

    def holds_flood(self, sid: int, round_number: int) -> bool:
        """Whether this rank still holds back the flood of that round (else its timer has nothing to do)."""
        machine = self.streams.get(sid)
        return machine is not None and machine.floods.held_back == round_number

    def release_flood(self, sid: int, round_number: int, everyone_joined: bool = False) -> None:
        machine = self.streams.get(sid)
        if machine is not None:
            self._carry_out(sid, machine.release_flood(round_number, everyone_joined))

    @staticmethod
    def release_message(sid: int, round_number: int, everyone_joined: bool = False) -> StreamMessage:
        """What the host hands this rank's driver when the activation delay of
        ``round_number`` passed (``everyone_joined``: its facts are reduced)."""
        return StreamMessage(sid, ReleaseActivation(round_number, everyone_joined))

    def round_completed(self, stream, launch, result=None) -> None:
        machine = self.streams.get(stream.id)
        if machine is None:  # a sync round: nothing to decide
            return
        self._carry_out(stream.id, machine.on_reduced(launch.round, stream.last_facts, result))

    def rebase(self, rank: int, size: int, heard: dict, next_id: int,
               quorum_counters: Callable[[int], object] | None) -> list:
        """The world shrank (elastic training): this rank is ``rank`` of ``size``.
        The agreements go on there (``heard``: every outcome some survivor heard;
        ``next_id``: the next stream id); returns the outcomes this rank missed,
        to act on (:meth:`Agreements.act_on`) before the streams are rebased."""
        self.rank, self.size = rank, size
        self._quorum_counters = quorum_counters
        for machine in self.streams.values():  # until rebase_stream, rounds handed over decide nothing
            machine.rebasing = True
        send = self._send
        self.agreements, missed = self.agreements.rebased(rank, size, send, lambda decision: send(rank, decision),
                                                          heard, next_id)
        return missed

    def rebase_stream(self, stream, started: int, quorum_index: int | None) -> None:
        """Rebase ``stream``'s machine on the new world once every survivor completed
        the same rounds; ``quorum_index``: its number among the streams with a quorum."""
        machine = self.streams.get(stream.id)
        if machine is None:
            return
        counters = None
        if machine.quorum is not None and self._quorum_counters is not None and self.size > 1:
            counters = self._quorum_counters(quorum_index)
        machine.rebase(self.rank, self.size, stream.last_facts, started, counters)

    def uses_quorum(self, stream_id: int) -> bool:
        """Whether that stream is majority with a quorum (its counters are in the window)."""
        machine = self.streams.get(stream_id)
        return machine is not None and machine.quorum is not None

    def catch_up(self, stream, started: int) -> None:
        """Join the rounds a survivor started that this rank had not, and decide what comes next."""
        machine = self.streams.get(stream.id)
        if machine is not None:
            self._carry_out(stream.id, machine.catch_up(started))

    def fail(self, error: Exception) -> None:
        for machine in self.streams.values():
            machine.fail(error)

    def _carry_out(self, sid: int, actions) -> None:
        """Do what the stream's state machine asks."""
        for action in actions:
            kind = type(action)
            if kind is Send:
                self._send(action.dest, StreamMessage(sid, action.message))
            elif kind is Join:
                self._start(sid, action.round, action.facts)
            elif kind is Defer:
                self._defer(sid, action.round)


def _quorum_of(signature) -> int | None:
    """The quorum of a stream's mode, from its registration signature; None: no quorum."""
    if signature is None:
        return None
    return getattr(mode_from_description(signature.mode), "quorum", None)
