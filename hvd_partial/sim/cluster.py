"""Cluster simulator: the protocol's own code (the coordinator and every
rank's stream, driven through :class:`~hvd_partial.transport.loopback.LoopbackWorld`)
on a simulated clock where communication costs what a
:class:`~hvd_partial.sim.network.NetworkModel` says.

It models what the MPI engine does, message by message:

- a rank that finishes a step posts; its post reaches the coordinator (rank 0's
  engine) after ``message_seconds(P)`` (rank 0's own posts at once);
- the coordinator serves one message at a time, in order of arrival,
  ``coordinator_seconds(P)`` each, and sends every message it broadcasts to
  ranks 1..P-1 one after the other, ``send_seconds(P)`` apart, each arriving
  ``message_seconds(P)`` later (rank 0 gets its own at once);
- a rank joins a round when the round's start reaches it (sync: when it
  posts); the round's reduction finishes ``reduce_seconds(P, nbytes)`` after
  the last rank joined (and not before the previous round's), where a solo
  or majority round's bytes include the facts every rank sends with its data;
- a rank whose post returned starts its next step at once, which takes its
  compute time plus ``step_overhead_s``; a rank done with its steps flushes,
  as in :func:`~hvd_partial.sim.replay.replay`.

With ``NetworkModel.free()`` every cost is zero and the result equals
``replay`` exactly (same rounds, same finishing times), which the tests check.

Example::

    from hvd_partial.modes import Solo
    from hvd_partial.sim import NetworkModel, simulate, sleeper_schedule

    compute = sleeper_schedule(world_size=64, step_s=0.020, delay_s=0.100, seed=0)
    net = NetworkModel(reduce_base_s=3e-4, reduce_alpha_s=1e-4, message_latency_s=2e-4)
    result = simulate(64, Solo(), max_staleness=8, steps=50, compute_seconds=compute, network=net)
    print(result.rounds_per_second, result.staleness_mean)
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..core.fusion import Layout
from ..modes import Mode, Sum
from ..transport.loopback import LoopbackWorld
from .network import NetworkModel

log = logging.getLogger("hvd_partial.sim")

# event classes: communication first, then compute, at equal times (as replay does)
_COMM, _COMPUTE = 0, 1
# kinds of communication events, in the order LoopbackWorld lists them
_OUT, _IN, _DONE, _WAKE = 0, 1, 2, 3  # _WAKE: the coordinator is free again


@dataclass
class SimResult:
    """What a simulated run did. ``seconds`` is when the last rank's last post
    returned, as in :class:`~hvd_partial.sim.replay.ReplayResult`."""

    rounds: int  # rounds started (the final flush round excluded)
    seconds: float
    finish: list  # per rank: when its last post returned
    posts: int  # contributions posted by all ranks (the work done)
    world_size: int
    contributors_mean: float = 0.0  # ranks with data per round (mean over rounds)
    staleness_mean: float = 0.0  # rounds, mean over contributions
    staleness_max: int = 0
    fresh_fraction: float = 0.0  # fresh contributions / (rounds * P)
    events: int = 0
    coordinator_busy_s: float = 0.0  # time rank 0's engine spent coordinating
    initiators: list = field(default_factory=list)

    @property
    def rounds_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds > 0 else float("inf")

    @property
    def posts_per_second(self) -> float:
        """Samples-per-second analogue: gradients computed per second, all ranks."""
        return self.posts / self.seconds if self.seconds > 0 else float("inf")


class _TimedDeque(deque):
    """A deque that keeps each item's ready time beside it and tells the
    simulator about every append."""

    def __init__(self, sim: "ClusterSimulator", kind: int, rank: int):
        super().__init__()
        self.times: deque = deque()
        self.kind = kind
        self.rank = rank
        self.scheduled = False
        self._sim = sim

    def append(self, item):
        ready = self._sim._ready_time(self)
        super().append(item)
        self.times.append(ready)
        self._sim._appended(self)

    def popleft(self):
        self.times.popleft()
        return super().popleft()


class _ReducingWorld(LoopbackWorld):
    """LoopbackWorld with a cheaper "complete" event for large worlds: the
    round's sum is computed once for all ranks (the loopback sums every rank's
    parts again on every rank, O(P^2) per round), and only rank 0 keeps the
    results it took (the others' would cost O(P^2) memory per round). The
    protocol calls are the same as LoopbackWorld's: ``RankStream.complete`` on
    the rank, then ``Coordinator.on_round_complete`` for rank 0."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reduced: dict = {}
        self._completions: dict = {}

    def apply(self, event: tuple):
        kind, j = event
        if kind != "complete":
            return super().apply(event)
        self.events += 1
        rank = self.ranks[j]
        launch = rank.launches.popleft()
        key = self._key(launch)
        if launch.send is None:
            reduced = None
        else:
            total = self._reduced.get(key)
            if total is None:
                parts = self.rounds.pop(key)
                total = self._reduced[key] = [
                    np.add.reduce([parts[k][b] for k in range(self.world_size)], axis=0).astype(
                        launch.send[b].dtype, copy=False) for b in range(len(launch.send))]
            reduced = [t.copy() for t in total]
        woken = rank.stream.complete(launch, reduced)
        if woken is not None:
            assert woken is rank.waiter
            if j == 0:
                rank.taken.extend(woken.results)
            rank.waiter = None
        if j == 0 and self.mode.kind != "sync" and launch.facts is not None and launch.facts.round is not None:
            self._broadcast(self.coordinator.on_round_complete(rank.stream.id, launch.round,
                                                               rank.stream.last_included))
        done = self._completions[key] = self._completions.get(key, 0) + 1
        if done == self.world_size:  # every rank has it: free the round's buffers
            self._reduced.pop(key, None)
            del self._completions[key]


class ClusterSimulator:
    """One simulated run (see :func:`simulate`)."""

    def __init__(self, world_size: int, mode: Mode, max_staleness: int, steps: int | Sequence[int],
                 compute_seconds: Callable[[int, int], float], network: NetworkModel | None = None,
                 nbytes: int = 4, deadline_s: float | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.P = world_size
        self.mode = mode
        self.net = network or NetworkModel.free()
        self.nbytes = int(nbytes)
        self.steps = [int(steps)] * world_size if isinstance(steps, (int, np.integer)) else [int(s) for s in steps]
        if len(self.steps) != world_size:
            raise ValueError(f"steps has {len(self.steps)} entries for {world_size} ranks")
        self.compute_seconds = compute_seconds
        self.deadline = deadline_s
        tau = 0 if mode.kind == "sync" else max_staleness
        # The reduction runs over a one-element buffer; its cost is the model's for ``nbytes``.
        self.world = _ReducingWorld(world_size, mode, Sum, tau, Layout.of([np.zeros(1)]))
        for j, rank in enumerate(self.world.ranks):
            rank.outbox = _TimedDeque(self, _OUT, j)
            rank.inbox = _TimedDeque(self, _IN, j)
            rank.launches = _TimedDeque(self, _DONE, j)
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.done_steps = [0] * world_size
        self.computing = [False] * world_size
        self.flushed = [False] * world_size
        self.finish = [0.0] * world_size
        # coordinator (rank 0's engine): busy until, and the clock of its outgoing sends
        self.coord_free = 0.0
        self.coord_busy = 0.0
        self.coord_queue: deque = deque()  # outboxes whose front waits for the coordinator
        self._send_clock: float | None = None
        # reductions: per round, joins so far and the last join time; when each finished
        self.joins: dict = {}
        self.round_done: dict = {}
        self.last_reduce_done = 0.0
        self._reduce_cost: dict[int, float] = {}  # by bytes of facts carried with the data
        self.latency = self.net.message_seconds(world_size)
        self.send_cost = self.net.send_seconds(world_size)
        self.coord_cost = self.net.coordinator_seconds(world_size)
        self.step_overhead = self.net.step_overhead_s
        self.events = 0
        self._one = [np.ones(1)]
        self._touched: set = set(range(world_size))

    # -- ready times of communication --------------------------------------------------

    def _ready_time(self, queue: _TimedDeque) -> float:
        if queue.kind == _OUT:
            return self.now if queue.rank == 0 else self.now + self.latency
        if queue.kind == _IN:
            if self._send_clock is None:  # pragma: no cover - only the coordinator sends to ranks
                raise AssertionError("a message to a rank from outside the coordinator")
            if queue.rank == 0:
                return self._send_clock  # rank 0's engine hands it over locally
            self._send_clock += self.send_cost
            return self._send_clock + self.latency
        return self.now  # a launch: the rank joins the round now

    def _appended(self, queue: _TimedDeque):
        if queue.kind == _DONE:
            self._joined(queue[-1])
        if not queue.scheduled and len(queue) == 1:
            self._schedule_front(queue)

    def _joined(self, launch):
        if launch.send is None:
            return
        key = launch.round
        count, last = self.joins.get(key, (0, 0.0))
        count, last = count + 1, max(last, self.now)
        if count < self.P:
            self.joins[key] = (count, last)
            return
        self.joins.pop(key, None)
        start = max(last, self.last_reduce_done)
        self.round_done[key] = self.last_reduce_done = start + self._reduce_seconds(launch)
        for rank in self.world.ranks:
            q = rank.launches
            if q and not q.scheduled and q[0].round == key:
                self._schedule_front(q)

    def _reduce_seconds(self, launch) -> float:
        # a solo/majority round carries every rank's facts in its last buffer, with the data
        extra = launch.send[-1].nbytes if getattr(launch, "with_facts", False) else 0
        cost = self._reduce_cost.get(extra)
        if cost is None:
            cost = self._reduce_cost[extra] = self.net.reduce_seconds(self.P, self.nbytes + extra)
        return cost

    def _schedule_front(self, queue: _TimedDeque):
        if queue.kind == _DONE:
            launch = queue[0]
            ready = queue.times[0] if launch.send is None else self.round_done.get(launch.round)
            if ready is None:
                return  # not every rank has joined yet: scheduled when the last one does
        else:
            ready = queue.times[0]
        queue.scheduled = True
        self.seq += 1
        heapq.heappush(self.heap, (max(ready, self.now), _COMM, queue.rank, queue.kind, self.seq, queue))

    # -- running -----------------------------------------------------------------------

    def run(self) -> SimResult:
        self._schedule_idle()
        while self.heap:
            time, cls, j, kind, _, payload = heapq.heappop(self.heap)
            self.now = time
            self.events += 1
            if cls == _COMPUTE:
                self.computing[j] = False
                self.done_steps[j] += 1
                self.world.post(j, self._one)
                if j:
                    self.world.ranks[j].taken.clear()  # only rank 0's results are reported
                self._touched.add(j)
            elif kind == _WAKE:
                self._serve_coordinator()
            else:
                self._communicate(payload)
            if not (self.heap and self.heap[0][0] <= self.now and self.heap[0][1] == _COMM):
                self._schedule_idle()
        if any(not self.world.idle(j) for j in range(self.P)):  # pragma: no cover - a protocol bug
            raise RuntimeError("simulation ended with ranks still waiting")
        result = self._result()
        log.debug("simulated %d ranks, %s: %d rounds in %.3f s of simulated time (%d events)",
                  self.P, self.mode, result.rounds, result.seconds, self.events)
        return result

    def _communicate(self, queue: _TimedDeque):
        queue.scheduled = False
        if queue.kind == _OUT:
            # Messages reach the coordinator in order of arrival and wait while it is busy.
            queue.scheduled = True  # its front is now in the coordinator's queue
            self.coord_queue.append(queue)
            if len(self.coord_queue) == 1:
                if self.coord_free <= self.now:
                    self._serve_coordinator()
                else:
                    self._wake_coordinator()
            return
        if queue.kind == _IN:
            self.world.apply(("to_rank", queue.rank))
        else:
            coordinating = queue.rank == 0 and self.mode.kind != "sync"
            if coordinating:  # rank 0's completion is reported to the coordinator
                base = max(self.now, self.coord_free)
                self._send_clock = base + self.coord_cost
            self.world.apply(("complete", queue.rank))
            if coordinating:
                self.coord_busy += self._send_clock - base
                self.coord_free = self._send_clock
                self._send_clock = None
        self._touched.add(queue.rank)
        if len(queue) and not queue.scheduled:
            self._schedule_front(queue)

    def _serve_coordinator(self):
        """Serve the first message waiting at the coordinator (it is free now)."""
        queue = self.coord_queue.popleft()
        self._send_clock = self.now + self.coord_cost
        self.world.apply(("to_coordinator", queue.rank))
        self.coord_busy += self._send_clock - self.now
        self.coord_free = self._send_clock
        self._send_clock = None
        queue.scheduled = False
        if len(queue):
            self._schedule_front(queue)
        if self.coord_queue:
            if self.coord_free <= self.now:  # free communication: serve the next one at once
                self._serve_coordinator()
            else:
                self._wake_coordinator()

    def _wake_coordinator(self):
        self.seq += 1
        heapq.heappush(self.heap, (self.coord_free, _COMM, -1, _WAKE, self.seq, None))

    def _settle_now(self):
        while self.heap and self.heap[0][0] <= self.now and self.heap[0][1] == _COMM:
            _, _, _, kind, _, payload = heapq.heappop(self.heap)
            self.events += 1
            if kind == _WAKE:
                self._serve_coordinator()
            else:
                self._communicate(payload)

    def _schedule_idle(self):
        """Start the next step of every rank whose post returned, or flush it
        when it has done all its steps. Ranks go in rank order, pass after
        pass, as in :func:`~hvd_partial.sim.replay.replay`; only ranks touched
        by an event since the last call can have become idle."""
        while self._touched:
            this_pass = sorted(self._touched)
            self._touched = set()
            i = 0
            while i < len(this_pass):
                j = this_pass[i]
                i += 1
                if self.computing[j] or self.flushed[j] or not self.world.idle(j):
                    continue
                if self.done_steps[j] < self.steps[j] and (self.deadline is None or self.now < self.deadline):
                    self.computing[j] = True
                    self.seq += 1
                    busy = self.compute_seconds(j, self.done_steps[j]) + self.step_overhead
                    heapq.heappush(self.heap, (self.now + busy, _COMPUTE, j, 0, self.seq, None))
                else:
                    # Done: enter flush, so that the others are not held by the staleness bound.
                    self.finish[j] = self.now
                    self.flushed[j] = True
                    self.world.flush(j)
                    self._settle_now()
                    # ranks after j that the flush touched are visited in this pass
                    later = sorted(k for k in self._touched if k > j and k not in this_pass[i:])
                    self._touched -= set(later)
                    this_pass = this_pass[:i] + sorted(set(this_pass[i:]) | set(later))

    def _result(self) -> SimResult:
        taken = self.world.results(0)
        training = [r for r in taken if not r.flush]
        contributions = [s for r in training for s in r.staleness.values()]
        fresh = sum(1 for s in contributions if s == 0)
        initiators = [0] * self.P
        for r in training:
            if r.initiator is not None:
                initiators[r.initiator] += 1
        rounds = self.world.ranks[0].stream.started - 1
        return SimResult(
            rounds=rounds, seconds=max(self.finish), finish=list(self.finish), posts=sum(self.done_steps),
            world_size=self.P,
            contributors_mean=float(np.mean([len(r.contributors) for r in training])) if training else 0.0,
            staleness_mean=float(np.mean(contributions)) if contributions else 0.0,
            staleness_max=int(max(contributions)) if contributions else 0,
            fresh_fraction=fresh / (len(training) * self.P) if training else 0.0,
            events=self.events, coordinator_busy_s=self.coord_busy, initiators=initiators)


def simulate(world_size: int, mode: Mode, max_staleness: int, steps: int | Sequence[int],
             compute_seconds: Callable[[int, int], float], network: NetworkModel | None = None,
             nbytes: int = 4, deadline_s: float | None = None) -> SimResult:
    """Simulate ``steps`` posts per rank (an int, or one count per rank) of a
    stream of ``nbytes`` bytes; rank ``j``'s compute at its step ``s`` takes
    ``compute_seconds(j, s)``. With ``deadline_s``, a rank whose post returns
    at or after that time stops training (a time budget instead of a step
    count). Deterministic: the same arguments give the same result.

    Example::

        r = simulate(4, Solo(), 8, 100, sleeper_schedule(4, 0.02, 0.1, seed=0),
                     network=NetworkModel(reduce_base_s=1e-3))
        r.rounds_per_second, r.posts_per_second
    """
    return ClusterSimulator(world_size, mode, max_staleness, steps, compute_seconds, network, nbytes,
                            deadline_s).run()
