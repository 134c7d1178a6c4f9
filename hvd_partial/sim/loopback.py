"""An in-process world of P ranks: each rank runs the protocol
:class:`~hvd_partial.core.driver.Driver` (the same one the MPI engine runs),
and this module only delivers their messages and sums their reductions. No
MPI, no threads.

Every step is one event, chosen by the caller or by a seeded random
scheduler: a rank's compute thread posts, flushes or shuts down, a message
from one rank reaches another (in order per pair of ranks, as MPI keeps
them), a reduction completes on a rank, a rank dies, or a live rank learns
that a peer died. The same events happen under MPI, only there the order is
decided by the machine; here it can be scripted, randomized and replayed.
Tests use it to check conservation, consistency, staleness and eagerness over
many arrival orders, and the simulator drives it with a clock.

Example::

    world = LoopbackWorld(3, Solo(), Sum, max_staleness=2, layout=Layout.of([np.zeros(4)]))
    world.post(0, [np.ones(4)])
    world.run_communication()
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from ..core.control import DecentralControl, StreamMessage
from ..core.decentral.messages import ReleaseActivation
from ..core.decentral.quorum import SharedQuorumCounters
from ..core.driver import Driver
from ..core.fusion import Layout
from ..core.growth import rests_carried, start_carried
from ..core.messages import StreamSignature
from ..core.post_request import PostRequest
from ..core.rebase import (adopt_world, catch_up, columns_between, plan_streams, rebase_stream, recovery_report,
                           reindex_in_flight)
from ..core.rank_stream import Launch, RankStream, Waiter
from ..core.round_result import RoundResult
from ..errors import RankFailedError
from ..modes import Mode, ReduceOp
from .coordinator import central_control
from .growing import grow_world

#: The control policy of each plane a world can run (the product runs ``decentral``).
CONTROL_PLANES = {"decentral": DecentralControl, "central": central_control}
STREAM = "stream"  # the name of the world's stream unless a call names another


class LoopbackRank:
    """One rank of the world: the host of its driver."""

    def __init__(self, world: "LoopbackWorld", rank: int):
        self.world = world
        self.rank = rank
        self.original = rank  # its rank at init, or its number when a grow started it (``rank`` changes)
        self.restart({})
        self.launches = world.make_queue("launches", rank, rank)  # (stream, launch) joined, not completed here
        self.waiter: Waiter | None = None  # the compute thread's call in progress
        self.taken: dict[str, list[RoundResult]] = {}  # stream -> every result taken, in order
        self.answers: list[list[RoundResult]] = []  # what each post returned, in order
        self.errors: list[Exception] = []  # calls that raised
        self.failure: Exception | None = None  # this rank stopped: it died, or learnt that a peer did
        self.notice_due = False  # a peer died and this rank has not noticed yet

    def restart(self, carried: dict[str, int]) -> None:
        """A new driver on the world as it is now (at init, and on every rank when the world
        grew: the engine restarted), its streams numbering their rounds on from ``carried``."""
        world = self.world
        self.driver = Driver(self.rank, world.world_size, self, world.defer_activations,
                             world.quorum_counters.for_rank(self.rank), world.control)
        start_carried(self.driver, carried)

    # -- views used by tests and the simulators -------------------------------------------

    @property
    def stream(self) -> RankStream | None:
        return self.driver.streams.get(STREAM)

    @property
    def registered(self) -> bool:
        s = self.stream
        return s is not None and s.id is not None

    # -- DriverHost -------------------------------------------------------------------------

    def send(self, dest: int, message) -> None:
        world = self.world
        if self.failure is not None or world.ranks[dest].failure is not None:
            return  # a stopped rank sends nothing, and what is sent to it is lost
        # A rank's reports to its own control policy are handed over apart from
        # the decisions it sends itself (as the engine does); between ranks, one channel.
        own = dest == self.rank and self.driver.for_control(message)
        world.channel(self.rank, dest, 1 if own else 0).append(message)

    def stream_registered(self, stream: RankStream) -> None:
        if self.world.elastic:  # as the engine's host: completed rounds are kept for the survivors of a failure
            stream.keep_rounds()
            stream.world_version = self.world.version

    def defer_activation(self, stream_id: int, round_number: int) -> None:
        # The activation delay ends at some later event: a message to itself, delivered like any other.
        self.send(self.rank, self.driver.release_message(stream_id, round_number))

    def launch(self, stream: RankStream, launch: Launch) -> None:
        self.launches.append((stream, launch))
        if launch.send is not None:
            self.world.join(self.rank, stream, launch)

    def reduced(self, stream: RankStream, launch: Launch, result: RoundResult) -> None:
        pass

    def finished(self, stream: RankStream, waiter: Waiter) -> None:
        if self.world.keeps_results(self.rank):
            self.taken.setdefault(stream.name, []).extend(waiter.results)
            if waiter.kind == "post":
                self.answers.append(waiter.results)
        if waiter is self.waiter:
            self.waiter = None

    def refused(self, waiter: Waiter, error: Exception) -> None:
        self.errors.append(error)
        if waiter is self.waiter:
            self.waiter = None

    def failed(self, error: Exception) -> None:
        raise error


class LoopbackWorld:
    """P ranks stepped one event at a time. ``keep_results``: the ranks whose
    taken results are kept (default all; the simulator keeps rank 0's only).
    ``defer_activations``: solo and majority rounds
    started in balanced training hold their flood back until a later event
    (the engine's activation delay), and majority's other ranks join early.
    ``control_plane``: ``"decentral"`` (the product's) or ``"central"`` (the
    reference coordinator of :mod:`hvd_partial.sim.coordinator`).
    ``elastic``: ranks keep their completed rounds, :meth:`kill` has the
    survivors go on in a smaller world (the engine's recovery), and :meth:`grow`
    starts new ranks where every stream is at rest (the engine's grow)."""

    def __init__(self, world_size: int, mode: Mode, op: ReduceOp, max_staleness: int, layout: Layout,
                 keep_results=None, control_plane: str = "decentral", defer_activations: bool = False,
                 elastic: bool = False):
        self.world_size = world_size
        self.elastic = elastic
        self.version = 0  # the world's version: one more at each shrink and each grow
        self.members = tuple(range(world_size))  # the ranks at init that make up the world, in rank order
        self.worlds = {0: self.members}  # version -> members, every world since init
        self.departed: list[LoopbackRank] = []  # ranks killed (elastic), out of ``ranks``
        self.shrinks: list[dict] = []  # what each kill did (see kill)
        self.joined: tuple[int, ...] = ()  # the numbers of the ranks grows started, in order
        self.grows: list[dict] = []  # what each grow did (see grow)
        self.stopping = False  # the ranks shut their drivers down for a grow: their results go nowhere
        self.on_join = None  # on_join(rank, stream, launch), if set: a rank joined a reduction
        if control_plane not in CONTROL_PLANES:
            raise ValueError(f"control_plane must be one of {tuple(CONTROL_PLANES)}, got {control_plane!r}")
        self.control_plane = control_plane
        self.control = CONTROL_PLANES[control_plane]
        self.defer_activations = defer_activations
        self.mode = mode
        self.op = op
        self.layout = layout
        self.signature = StreamSignature(layout.entries, False, mode.describe(), op.value,
                                         0 if mode.kind == "sync" else max_staleness)
        self._keep = None if keep_results is None else frozenset(keep_results)
        # dest -> (src, lane) -> messages; lane 1: a rank's reports to its own control policy
        self.inbound: list[dict[tuple, deque]] = [{} for _ in range(world_size)]
        self.parts: dict[tuple, dict[int, list]] = {}  # (stream, round) -> rank -> send buffers
        self._sums: dict[tuple, list] = {}  # (stream, round) -> the reduced buffers, until every rank took them
        self._taken_sums: dict[tuple, int] = {}
        self.dead = [False] * world_size
        self.events = 0
        self.quorum_counters = SharedQuorumCounters()  # every rank's, for majority with a quorum
        self.ranks = [LoopbackRank(self, j) for j in range(world_size)]

    # -- queues (the simulator times them) --------------------------------------------------

    def make_queue(self, kind: str, src: int, dest: int, lane: int = 0) -> deque:
        """A new queue: ``kind`` is "channel" (messages src -> dest) or "launches"."""
        return deque()

    def channel(self, src: int, dest: int, lane: int = 0) -> deque:
        q = self.inbound[dest].get((src, lane))
        if q is None:
            q = self.inbound[dest][(src, lane)] = self.make_queue("channel", src, dest, lane)
        return q

    def keeps_results(self, j: int) -> bool:
        return not self.stopping and (self._keep is None or j in self._keep)

    @property
    def coordinator(self):
        return self.ranks[0].driver.control.coordinator

    # -- compute-thread actions -----------------------------------------------------------

    def idle(self, j: int) -> bool:
        """Rank j's compute thread is not blocked in a call."""
        return self.ranks[j].waiter is None

    def post(self, j: int, arrays: list[np.ndarray], name: str = STREAM):
        rank = self.ranks[j]
        assert self.idle(j) and rank.failure is None
        buffers, owned = self.layout.pack(arrays)
        waiter = rank.waiter = Waiter("post")
        try:
            rank.driver.post(PostRequest(name, buffers, owned, self.layout, False, self.mode.kind == "sync", self.op,
                                         self.signature), waiter)
        except Exception:
            rank.waiter = None
            raise

    def flush(self, j: int, name: str = STREAM):
        rank = self.ranks[j]
        assert self.idle(j) and rank.failure is None
        if rests_carried(rank.driver, name):
            return  # carried over a grow and not posted to since: no rounds (the engine's flush)
        waiter = rank.waiter = Waiter("flush")
        try:
            rank.driver.flush(name, waiter)
        except Exception:
            rank.waiter = None
            raise

    def park(self, j: int) -> None:
        """Rank j's compute thread begins waiting in a call that needs every rank."""
        self.ranks[j].driver.park()

    def unpark(self, j: int) -> None:
        self.ranks[j].driver.unpark()

    def take(self, j: int, name: str = STREAM) -> bool:
        """Rank j takes the rounds completed since its last take, as a host
        does after a park; False while a round it joined parked is in flight."""
        results = self.ranks[j].driver.take(name)
        if results is None:
            return False
        if self.keeps_results(j):
            self.ranks[j].taken.setdefault(name, []).extend(results)
        return True

    def shutdown(self, j: int):
        """Rank j shuts down: its driver flushes every stream and says goodbye."""
        rank = self.ranks[j]
        assert self.idle(j) and rank.failure is None
        rank.driver.leave()

    def left(self, j: int) -> bool:
        """Rank j's shutdown is complete (its reductions too)."""
        rank = self.ranks[j]
        return rank.driver.left and not rank.launches

    def fail(self, j: int, reason: str = "killed"):
        """Rank j dies: its messages in flight are lost, and every live rank
        learns of it later (as the engine's liveness check does)."""
        self.dead[j] = True
        self._stop(j, RankFailedError(j, reason))
        for k, rank in enumerate(self.ranks):
            if rank.failure is None:
                rank.notice_due = True
        for dest in range(self.world_size):
            for (src, _), q in self.inbound[dest].items():
                if dest == j or src == j:
                    q.clear()

    def _stop(self, j: int, error: Exception):
        rank = self.ranks[j]
        rank.failure = error
        rank.notice_due = False
        rank.driver.fail(error)
        if rank.waiter is not None:
            rank.errors.append(error)
            rank.waiter = None
        rank.launches.clear()

    # -- communication events ----------------------------------------------------------

    def communication_events(self) -> list[tuple]:
        """The events that may happen next, as tuples for ``apply``: per
        receiving rank, its deliveries by source, then a completion, then a
        failure notice."""
        out = []
        for j, rank in enumerate(self.ranks):
            if rank.failure is not None:
                continue
            for src, lane in sorted(self.inbound[j]):
                if self.inbound[j][(src, lane)]:
                    out.append(("deliver", src, j, lane) if lane else ("deliver", src, j))
            if rank.launches and self._reducible(*rank.launches[0]):
                out.append(("complete", j))
            if rank.notice_due:
                out.append(("notice", j))
        return out

    def _release(self, j: int, message: StreamMessage) -> StreamMessage:
        """The end of rank j's activation delay, telling (as the engine learns
        from the round's facts) whether every rank joined the round by now."""
        stream = self.ranks[j].driver.by_id.get(message.stream)
        r = message.message.round
        if stream is None or not self.everyone_joined(stream.name, r):
            return message
        return self.ranks[j].driver.release_message(message.stream, r, everyone_joined=True)

    def everyone_joined(self, name: str, round_number: int) -> bool:
        """Whether every rank joined round ``round_number`` of stream ``name``."""
        key = (name, round_number)
        return key in self._sums or len(self.parts.get(key, ())) == self.world_size

    def _reducible(self, stream: RankStream, launch: Launch) -> bool:
        key = (stream.name, launch.round)
        return launch.send is None or key in self._sums or len(self.parts.get(key, ())) == self.world_size

    def apply(self, event: tuple):
        self.events += 1
        kind = event[0]
        if kind == "deliver":  # ("deliver", src, dest[, lane])
            src, dest = event[1], event[2]
            message = self.inbound[dest][(src, event[3] if len(event) > 3 else 0)].popleft()
            if src == dest and type(message) is StreamMessage and type(message.message) is ReleaseActivation:
                release = self._release(dest, message).message  # the host's timer, modelled as a message
                self.ranks[dest].driver.release_flood(message.stream, release.round, release.everyone_joined)
            else:
                self.ranks[dest].driver.on_message(src, message)
        elif kind == "complete":
            self.complete(event[1])
        elif kind == "notice":
            j = event[1]
            dead = [k for k in range(self.world_size) if self.dead[k]]
            self._stop(j, RankFailedError(dead[0], "no message from it (the failure was noticed)"))
        else:
            raise ValueError(f"unknown event {event!r}")

    def complete(self, j: int):
        rank = self.ranks[j]
        stream, launch = rank.launches.popleft()
        reduced = None if launch.send is None else self._reduce(stream.name, launch)
        rank.driver.complete(stream, launch, reduced)

    def join(self, j: int, stream: RankStream, launch: Launch):
        """Rank j joined a reduction: its send buffers are copied now, as MPI reads them."""
        self.parts.setdefault((stream.name, launch.round), {})[j] = [np.array(b, copy=True) for b in launch.send]
        if self.on_join is not None:
            self.on_join(self.ranks[j], stream, launch)

    # -- elastic training: a rank dies and the survivors go on (engine/recovery.py) ----------

    def kill(self, *failed: int) -> dict:
        """Ranks ``failed`` (of the world now) die, at once, and every survivor
        runs the engine's recovery (:func:`hvd_partial.engine.recovery.recover`)
        with the same core steps (:mod:`hvd_partial.core.rebase`), the world
        standing in for MPI: the reports' gather is a list, a holder's
        broadcast of a kept round a copy, and a round redone on the new world
        sums the survivors' contributions only. Every control message in
        flight is lost (the revoke); a rank's decisions to itself stay (the
        engine's dispatch keeps them). Needs ``elastic``. Returns (and appends
        to :attr:`shrinks`) what the recovery did: ``failed`` (ranks at init),
        ``members``, ``version``, ``plans`` (stream name -> StreamPlan) and
        ``completed`` (stream name -> rounds every survivor completed after it)."""
        if not self.elastic:
            raise ValueError("kill needs an elastic world; fail() is a failure without elastic training")
        failed = set(failed)
        if not failed or not failed < set(range(self.world_size)):
            raise ValueError(f"kill {sorted(failed)} of {self.world_size} ranks: at least one must survive")
        old = self.ranks
        lost = []
        for j in sorted(failed):  # the dead: they do nothing more
            rank = old[j]
            self._stop(j, RankFailedError(j, "killed"))
            self.departed.append(rank)
            lost.append(rank.original)
        survivors = [rank for j, rank in enumerate(old) if j not in failed]
        # 1. (a round whose reduction finished here was completed by its own event: the schedule decides)
        # 2. revoke and shrink: control messages in flight are lost, decisions to itself stay
        own = {rank: self.inbound[rank.rank].get((rank.rank, 0)) for rank in survivors}
        members = self.begin_world(survivors)
        size = self.world_size
        for rank, queue in own.items():
            if queue:
                self.channel(rank.rank, rank.rank).extend(queue)
        # 3. what each survivor holds; the agreements' outcomes it missed; its own decisions
        reports = [recovery_report(rank.driver) for rank in survivors]
        for rank in survivors:
            adopt_world(rank.driver, rank.rank, size, reports, self.quorum_counters.for_rank(rank.rank))
        for rank in survivors:
            self._deliver_own(rank)
        # 4. per stream, rounds handed over and rounds redone; 5. rebased
        plans = plan_streams([{sid: (s.completed, s.started) for sid, s in rank.driver.by_id.items()}
                              for rank in survivors])
        quorum_index = 0
        named = {}
        for sid, plan in plans.items():
            name = survivors[0].driver.by_id[sid].name
            named[name] = plan
            holder = survivors[plan.holder].driver.by_id[sid]
            for r in plan.handed:
                data = holder.kept_round(r)  # (the holder's broadcast)
                for rank in survivors:
                    stream = rank.driver.by_id[sid]
                    if stream.completed <= r:
                        rank.driver.complete(stream, self._pop_round(rank, sid, r),
                                             None if data is None else [b.copy() for b in data])
            uses_quorum = survivors[0].driver.control.uses_quorum(sid)
            for rank in survivors:
                driver, stream = rank.driver, rank.driver.by_id[sid]
                columns = columns_between(self.worlds[stream.world_version], members)
                rebase_stream(driver, stream, columns, plan.started, quorum_index if uses_quorum else None,
                              self.version)
                in_flight = [launch for s, launch in rank.launches if s is stream]
                reindex_in_flight(in_flight, columns, size)
                for launch in in_flight:  # redone on the new world
                    if launch.send is not None:
                        self.parts.setdefault((name, launch.round), {})[rank.rank] = [
                            np.array(b, copy=True) for b in launch.send]
                if not stream.sync:
                    catch_up(driver, stream, plan.started)
            quorum_index += uses_quorum
        for rank in survivors:
            rank.driver.begin_again()
        done = {"failed": tuple(lost), "members": members, "version": self.version, "plans": named,
                "completed": {name: survivors[0].driver.streams[name].completed for name in named}}
        self.shrinks.append(done)
        return done

    def begin_world(self, ranks: list) -> tuple[int, ...]:
        """The world changed (a shrink or a grow): ``ranks`` in rank order make up the next
        version; nothing is in flight in it, and its quorum window is new. Returns its members."""
        self.ranks = ranks
        self.world_size = size = len(ranks)
        self.dead = [False] * size
        self.inbound = [{} for _ in range(size)]
        for new, rank in enumerate(ranks):
            rank.rank = new
        self.version += 1
        self.members = members = tuple(rank.original for rank in ranks)
        self.worlds[self.version] = members
        self.quorum_counters = SharedQuorumCounters()  # the quorum window, made again
        for table in (self.parts, self._sums, self._taken_sums):  # the old world's reductions are over
            table.clear()
        return members

    def grow(self, count: int, rng: random.Random | None = None) -> dict | None:
        """``count`` new ranks join where every rank is idle and every stream at rest, as the
        engine's grow does (:mod:`hvd_partial.sim.growing`); None (nothing changes) elsewhere."""
        return grow_world(self, count, LoopbackRank, rng)

    def _deliver_own(self, rank: "LoopbackRank") -> None:
        """Hand rank's driver the decisions it sent itself (the engine's ``Dispatch.deliver_own``)."""
        queue = self.inbound[rank.rank].get((rank.rank, 0))
        while queue:
            rank.driver.on_message(rank.rank, queue.popleft())

    @staticmethod
    def _pop_round(rank: "LoopbackRank", sid: int, round_number: int) -> Launch:
        """Take rank's oldest launch of stream ``sid`` off, unreduced (a survivor hands its result)."""
        for i, (stream, launch) in enumerate(rank.launches):
            if stream.id == sid:
                if launch.round != round_number:
                    raise AssertionError(f"stream {sid}: round {launch.round} in flight, expected {round_number}")
                del rank.launches[i]
                return launch
        raise AssertionError(f"stream {sid}: round {round_number} is not in flight on rank {rank.rank}")

    def _reduce(self, name: str, launch: Launch) -> list:
        key = (name, launch.round)
        total = self._sums.get(key)
        if total is None:
            parts = self.parts.pop(key)
            total = self._sums[key] = [
                np.add.reduce([parts[k][b] for k in range(self.world_size)], axis=0).astype(
                    launch.send[b].dtype, copy=False) for b in range(len(launch.send))]
        taken = self._taken_sums[key] = self._taken_sums.get(key, 0) + 1
        if taken == self.world_size:  # every rank has it: free the round's buffers
            del self._sums[key], self._taken_sums[key]
        return [t.copy() for t in total]

    def run_communication(self, rng: random.Random | None = None, limit: int = 100_000):
        """Deliver communication events (in random order with ``rng``) until none is left."""
        for _ in range(limit):
            events = self.communication_events()
            if not events:
                return
            self.apply(rng.choice(events) if rng else events[0])
        raise AssertionError("communication did not settle")

    def results(self, j: int, name: str = STREAM) -> list[RoundResult]:
        return self.ranks[j].taken.setdefault(name, [])
