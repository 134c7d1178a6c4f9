"""An in-process world of P ranks that drives the pure core (coordinator and
rank streams) with no MPI and no threads.

Every step is one event, chosen by the caller or by a seeded random
scheduler: a rank's compute thread posts or flushes, a control message is
delivered, a rank joins a round or sees it complete. The same events happen
under MPI, only there the order is decided by the machine; here it can be
scripted, randomized and replayed. Tests use it to check conservation,
consistency, staleness and eagerness over many arrival orders, and the
simulator drives it with a clock.

Example::

    world = LoopbackWorld(3, Solo(), Sum, max_staleness=2, layout=Layout.of([np.zeros(4)]))
    world.post(0, [np.ones(4)])
    world.run_communication()
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..core.coordinator import Coordinator
from ..core.fusion import Layout
from ..core.messages import FlushBegun, Register, Registered, Rejected, Start, StreamSignature
from ..core.rank_stream import Launch, RankStream, Waiter
from ..core.round_result import RoundResult
from ..modes import Mode, ReduceOp


@dataclass
class LoopbackRank:
    stream: RankStream
    inbox: deque = field(default_factory=deque)  # coordinator -> this rank
    outbox: deque = field(default_factory=deque)  # this rank -> coordinator
    launches: deque = field(default_factory=deque)  # rounds joined, not completed here
    held_post: tuple | None = None  # first post, until the stream is registered
    registered: bool = False
    waiter: Waiter | None = None
    taken: list = field(default_factory=list)  # every RoundResult taken, in order
    posted: list = field(default_factory=list)  # (seq, computed_for, array)
    taken_at_post: list = field(default_factory=list)


class LoopbackWorld:
    """P ranks of one stream, stepped one event at a time."""

    def __init__(self, world_size: int, mode: Mode, op: ReduceOp, max_staleness: int, layout: Layout):
        self.world_size = world_size
        self.mode = mode
        self.layout = layout
        self.signature = StreamSignature(layout.entries, False, mode.describe(), op.value,
                                         0 if mode.kind == "sync" else max_staleness)
        self.coordinator = Coordinator(world_size)
        self.ranks = [LoopbackRank(RankStream(j, world_size, "stream", layout, mode.kind == "sync", op))
                      for j in range(world_size)]
        self.rounds: dict[int, dict[int, list | None]] = {}  # round -> rank -> send buffers
        self.starts: list[Start] = []
        self.events = 0

    # -- compute-thread actions -------------------------------------------------

    def idle(self, j: int) -> bool:
        """Rank j's compute thread is not blocked in a post or flush."""
        return self.ranks[j].waiter is None and self.ranks[j].held_post is None

    def post(self, j: int, arrays: list[np.ndarray]):
        rank = self.ranks[j]
        assert self.idle(j)
        buffers, owned = self.layout.pack(arrays)
        waiter = Waiter("post")
        rank.taken_at_post.append(rank.stream.taken)
        if not rank.registered:
            rank.held_post = (buffers, owned, waiter)
            rank.outbox.append(Register(j, "stream", self.signature))
            return
        self._post_registered(j, buffers, owned, waiter, registered=True)

    def _post_registered(self, j, buffers, owned, waiter, registered):
        rank = self.ranks[j]
        msg, launch, done = rank.stream.post(buffers, owned, waiter, registered=registered)
        rank.posted.append((rank.stream.seq, rank.stream.taken if done else rank.stream.taken, buffers))
        if msg is not None:
            rank.outbox.append(msg)
        if launch is not None:
            self._join(j, launch)
        if done:
            rank.taken.extend(waiter.results)
        else:
            rank.waiter = waiter

    def flush(self, j: int):
        rank = self.ranks[j]
        assert self.idle(j) and rank.registered
        waiter = Waiter("flush")
        rank.outbox.append(rank.stream.flush(waiter))
        rank.waiter = waiter

    # -- communication events -----------------------------------------------------

    def communication_events(self) -> list[tuple]:
        """The events that may happen next, as tuples for ``apply``."""
        out = []
        for j, rank in enumerate(self.ranks):
            if rank.outbox:
                out.append(("to_coordinator", j))
            if rank.inbox:
                out.append(("to_rank", j))
            if rank.launches:
                launch = rank.launches[0]
                if launch.send is None or len(self.rounds.get(self._key(launch), {})) == self.world_size:
                    out.append(("complete", j))
        return out

    def _key(self, launch: Launch):
        return launch.round

    def apply(self, event: tuple):
        self.events += 1
        kind, j = event
        rank = self.ranks[j]
        if kind == "to_coordinator":
            msg = rank.outbox.popleft()
            if isinstance(msg, Register):
                out = self.coordinator.on_register(msg)
            elif type(msg).__name__ == "Post":
                out = self.coordinator.on_post(msg)
            else:
                out = self.coordinator.on_flush(msg)
            self._broadcast(out)
        elif kind == "to_rank":
            msg = rank.inbox.popleft()
            if isinstance(msg, Registered):
                rank.stream.id = msg.stream
                rank.registered = True
                buffers, owned, waiter = rank.held_post
                rank.held_post = None
                self._post_registered(j, buffers, owned, waiter, registered=False)
            elif isinstance(msg, Rejected):
                raise AssertionError(msg.reason)
            elif isinstance(msg, FlushBegun):
                problem = rank.stream.on_flush_begun(msg)
                if problem is not None:
                    raise AssertionError(problem)
            else:
                self._join(j, rank.stream.on_start(msg))
        elif kind == "complete":
            launch = rank.launches.popleft()
            if launch.send is None:
                reduced = None
            else:
                parts = self.rounds[self._key(launch)]
                reduced = [np.sum([parts[k][b] for k in range(self.world_size)], axis=0)
                           for b in range(len(launch.send))]
                reduced = [np.asarray(r, dtype=launch.send[b].dtype) for b, r in enumerate(reduced)]
            woken = rank.stream.complete(launch, reduced)
            if woken is not None:
                assert woken is rank.waiter
                rank.taken.extend(woken.results)
                rank.waiter = None
            if j == 0 and self.mode.kind != "sync" and launch.facts is not None and launch.facts.round is not None:
                self._broadcast(self.coordinator.on_round_complete(rank.stream.id, launch.round,
                                                                   rank.stream.last_included))
        else:
            raise ValueError(kind)

    def _broadcast(self, messages):
        for msg in messages:
            if isinstance(msg, Start):
                self.starts.append(msg)
            for rank in self.ranks:
                rank.inbox.append(msg)

    def _join(self, j: int, launch: Launch):
        self.ranks[j].launches.append(launch)
        if launch.send is not None:
            self.rounds.setdefault(self._key(launch), {})[j] = [np.array(b, copy=True) for b in launch.send]

    def run_communication(self, rng: random.Random | None = None, limit: int = 100_000):
        """Deliver communication events (in random order with ``rng``) until none is left."""
        for _ in range(limit):
            events = self.communication_events()
            if not events:
                return
            self.apply(rng.choice(events) if rng else events[0])
        raise AssertionError("communication did not settle")

    def results(self, j: int) -> list[RoundResult]:
        return self.ranks[j].taken
