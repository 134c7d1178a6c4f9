"""Cluster simulator: the protocol's own code (every rank's
:class:`~hvd_partial.core.driver.Driver` and its control policy, in a
:class:`~hvd_partial.sim.loopback.LoopbackWorld`) on a simulated clock
where communication costs what a :class:`~hvd_partial.sim.network.NetworkModel` says.

The control plane is a parameter: ``"decentral"`` (the product's: every rank
starts rounds itself) or ``"central"`` (the reference coordinator of
:mod:`hvd_partial.sim.coordinator`, rank 0 deciding every round; the
decentralized plane's hypercube
activation floods, gathers, a quorum counter; see docs/control-plane.md). The
cost model is the same for both; it models what the MPI engine does, message
by message:

- a message from one rank to another arrives ``message_seconds(n)`` after it
  is sent (a rank's messages to itself at once), in order per pair of ranks,
  where ``n`` is the per-rank entries it carries (the coordinator's messages
  are priced as its round start, which carries ``P``; the decentralized
  plane's carry none);
- every rank's engine serves the messages for its control policy one at a
  time, in order of arrival, ``handling_seconds(P, walks_ranks)`` each, where
  ``walks_ranks`` holds only for the coordinator's decisions (they look at
  every rank); it also serves its completion of a round when the completion
  feeds the policy: the coordinator's decision on it
  (``coordinator_seconds(P)``), or, decentralized, the handling of the event
  plus the next round's view derived from the facts
  (``view_seconds(P)``, vector work over every rank);
- what an engine sends while serving leaves one message after the other,
  ``send_seconds(n)`` apart (its own at once); what a rank's post or flush
  sends leaves at once, the next ones ``send_seconds(n)`` apart;
- an addition to majority's quorum counter at another rank (one-sided) holds
  its rank's engine for a round trip, ``2 * message_seconds(0)``, and costs
  the counter's rank nothing;
- a rank joins a round when the round's start reaches it (sync: when it
  posts); the round's reduction finishes ``reduce_seconds(P, nbytes)`` after
  the last rank joined (and not before the previous round's), where a solo
  or majority round's bytes include the facts every rank sends with its data;
- a rank whose post returned starts its next step at once, which takes its
  compute time plus ``step_overhead_s``; a rank done with its steps flushes,
  as in :func:`~hvd_partial.sim.replay.replay`;
- with ``activation_delay_s`` (decentralized plane), a flood held back in
  balanced training is released that long after it was held, as the
  engine's ``activation_delay_us`` does (docs/control-plane.md), and dropped
  instead if the round's facts were reduced by then (every rank joined):
  they cost a reduction of the facts alone from the last join.

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

import dataclasses
import heapq
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..core.control import StreamMessage
from ..core.decentral.messages import ReleaseActivation
from ..core.fusion import Layout
from ..core.decentral.agreement import AgreementOutcome, AgreementReport
from ..core.messages import Closed, Flush, FlushBegun, Goodbye, Post, Register, Registered, Rejected
from ..modes import Mode, Sum
from .loopback import LoopbackWorld
from .network import NetworkModel

log = logging.getLogger("hvd_partial.sim")

# event classes: communication first, then compute, at equal times (as replay does)
_COMM, _COMPUTE = 0, 1
# kinds of communication events at one rank, in the order LoopbackWorld lists them
_DELIVER, _DONE, _WAKE = 0, 1, 2  # _WAKE: a rank's engine is free again to serve its control messages


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
    coordinator_busy_s: float = 0.0  # time rank 0's engine spent serving its control policy
    initiators: list = field(default_factory=list)
    control_plane: str = "decentral"
    # the busiest engine's time serving its control policy for rounds (registration, a sync
    # flush's check and shutdown, once per stream, apart), and the mean over ranks
    busy_max_s: float = 0.0
    busy_mean_s: float = 0.0
    # control messages between ranks for rounds (a rank's own to itself, and those of registration
    # and shutdown, not counted), sent plus received: at the rank that handled the most, mean over ranks
    messages_max: int = 0
    messages_mean: float = 0.0
    setup_messages_max: int = 0  # registration and shutdown messages at the rank that handled the most
    registered_s: float = 0.0  # when the last rank completed round 0 (the stream's registration and first posts)
    quorum_additions: int = 0  # additions to majority's quorum counters, all ranks (decentral plane)

    @property
    def steady_posts_per_second(self) -> float:
        """Posts per second after registration: the posts after every rank's first
        over the time from the last rank's completion of round 0 to the end."""
        span = self.seconds - self.registered_s
        return (self.posts - self.world_size) / span if span > 0 else float("inf")

    @property
    def messages_per_round_max(self) -> float:
        """Control messages for rounds sent and received by the busiest rank, per round started."""
        return self.messages_max / max(1, self.rounds + 1)

    @property
    def messages_per_round_mean(self) -> float:
        return self.messages_mean / max(1, self.rounds + 1)

    @property
    def rounds_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds > 0 else float("inf")

    @property
    def posts_per_second(self) -> float:
        """Samples-per-second analogue: gradients computed per second, all ranks."""
        return self.posts / self.seconds if self.seconds > 0 else float("inf")


class _TimedDeque(deque):
    """A deque that keeps each item's ready time beside it and tells the
    simulator about every append: a channel between two ranks, or a rank's
    reductions joined."""

    def __init__(self, sim: "ClusterSimulator", kind: int, src: int, dest: int, lane: int = 0):
        super().__init__()
        self.lane = lane
        self.key = 2 * src + lane  # deliveries at one rank and time go by source, as LoopbackWorld lists them
        self.times: deque = deque()
        self.kind = kind
        self.src = src
        self.rank = dest
        self.scheduled = False
        self._sim = sim

    def append(self, item):
        ready = self._sim._ready_time(self, item)
        super().append(item)
        self.times.append(ready)
        self._sim._appended(self)

    def popleft(self):
        self.times.popleft()
        return super().popleft()

    def clear(self):  # pragma: no cover - no rank fails in a simulation
        super().clear()
        self.times.clear()


class _TimedWorld(LoopbackWorld):
    def __init__(self, sim: "ClusterSimulator", *args, **kwargs):
        self._sim = sim
        super().__init__(*args, **kwargs)
        self.quorum_counters.on_add = sim.quorum_added

    def make_queue(self, kind: str, src: int, dest: int, lane: int = 0) -> deque:
        return _TimedDeque(self._sim, _DELIVER if kind == "channel" else _DONE, src, dest, lane)

    def everyone_joined(self, name: str, round_number: int) -> bool:
        # as the engine learns it: the round's facts, reduced first, have completed by now
        done = self._sim.facts_done.get((name, round_number))
        return done is not None and done <= self._sim.now


CONTROL_PLANES = ("central", "decentral")
# the reports the coordinator decides on (its decision code walks every rank)
_COORDINATOR_REPORTS = (Register, Post, Flush, Goodbye)
# messages once per stream or per shutdown, not per round (registration, a sync flush, goodbye; the
# decentral plane's agreements on them)
_SETUP = (Register, Registered, Rejected, FlushBegun, Goodbye, Closed, AgreementReport, AgreementOutcome)


_FIELDS: dict[type, tuple] = {}


def ranks_carried(message) -> int:
    """How many per-rank entries ``message`` carries (the longest sequence or
    array among its fields, also inside a message it wraps): what its pickling
    and unpickling grow with."""
    kind = type(message)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = (tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind)
                                 else None)
    if names is not None:
        values = [getattr(message, name) for name in names]
    else:
        values = list(getattr(message, "__dict__", {}).values())
    n = 0
    for value in values:
        if isinstance(value, (tuple, list, np.ndarray)):
            n = max(n, len(value))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            n = max(n, ranks_carried(value))
    return n


class ClusterSimulator:
    """One simulated run (see :func:`simulate`)."""

    def __init__(self, world_size: int, mode: Mode, max_staleness: int, steps: int | Sequence[int],
                 compute_seconds: Callable[[int, int], float], network: NetworkModel | None = None,
                 nbytes: int = 4, deadline_s: float | None = None, control_plane: str = "decentral",
                 activation_delay_s: float = 0.0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if control_plane not in CONTROL_PLANES:
            raise ValueError(f"control_plane must be one of {CONTROL_PLANES}, got {control_plane!r}")
        self.control_plane = control_plane
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
        # The reduction runs over a one-element buffer; its cost is the model's
        # for ``nbytes``. Only rank 0's results are kept (all would cost O(P^2) memory).
        if activation_delay_s < 0:
            raise ValueError(f"activation_delay_s must be >= 0, got {activation_delay_s}")
        self.activation_delay = float(activation_delay_s)
        self.world = _TimedWorld(self, world_size, mode, Sum, tau, Layout.of([np.zeros(1)]), keep_results=(0,),
                                 control_plane=control_plane, defer_activations=self.activation_delay > 0)
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.done_steps = [0] * world_size
        self.computing = [False] * world_size
        self.flushed = [False] * world_size
        self.finish = [0.0] * world_size
        # Each rank's engine serves its control messages one at a time: busy until,
        # and the channels whose front waits for it.
        self.serve_free = [0.0] * world_size
        self.serving: list[deque] = [deque() for _ in range(world_size)]
        self.busy = [0.0] * world_size
        self.send_clock: float | None = None  # while a rank serves: when its last send left
        self.serving_rank: int | None = None
        self._first_send_free = False  # a post's or flush's first send leaves at once
        self._setup = False  # serving a message of registration or shutdown
        self.registered_at = 0.0  # when the last rank completed round 0
        self.messages = [0] * world_size  # control messages for rounds to or from other ranks
        self.setup_messages = [0] * world_size  # and those of registration and shutdown
        self.round_busy = [0.0] * world_size  # busy, less the handling of registration and shutdown
        # reductions: per round, joins so far and the last join time; when each finished
        self.joins: dict = {}
        self.round_done: dict = {}
        self.facts_done: dict = {}  # (stream, round) -> when its facts' reduction completed
        self.last_reduce_done = 0.0
        self._reduce_cost: dict[int, float] = {}  # the model's cost of a reduction, by its bytes
        # what a message costs, by the per-rank entries it carries (the coordinator's: as its round start)
        self._costs: dict[int, tuple[float, float]] = {}
        self._walks_all = control_plane == "central"
        self.coord_cost = self.net.coordinator_seconds(world_size)
        self.handle_cost = self.net.handling_seconds(world_size, walks_ranks=False)
        self.view_cost = self.handle_cost + self.net.view_seconds(world_size)
        self.step_overhead = self.net.step_overhead_s
        self.events = 0
        self._one = [np.ones(1)]
        self._touched: set = set(range(world_size))

    # -- ready times of communication --------------------------------------------------

    def _message_costs(self, message) -> tuple[float, float]:
        """(one-way latency, the sender's time) of ``message``."""
        n = self.P if self._walks_all else ranks_carried(message)
        costs = self._costs.get(n)
        if costs is None:
            costs = self._costs[n] = (self.net.message_seconds(n), self.net.send_seconds(n))
        return costs

    def _ready_time(self, queue: _TimedDeque, item) -> float:
        if queue.kind == _DONE:
            return self.now  # a launch: the rank joins the round now
        if queue.src == queue.rank:
            if type(item) is StreamMessage and type(item.message) is ReleaseActivation:
                return (self.now if self.send_clock is None else self.send_clock) + self.activation_delay
            if queue.lane or self.serving_rank != queue.src:
                return self.now
            return self.send_clock  # the serving engine hands it over locally
        counts = self.setup_messages if isinstance(item, _SETUP) else self.messages
        counts[queue.src] += 1
        counts[queue.rank] += 1
        latency, send_cost = self._message_costs(item)
        if self.serving_rank != queue.src:
            return self.now + latency
        if self._first_send_free:
            self._first_send_free = False
        else:
            self.send_clock += send_cost
        return self.send_clock + latency

    def quorum_added(self, rank: int, owner: int):
        """Rank ``rank`` added to a quorum counter at ``owner``: a one-sided
        round trip that its engine waits for (and ``owner``'s does not serve)."""
        if owner != rank and self.serving_rank == rank and self.send_clock is not None:
            self.send_clock += 2 * self.net.message_seconds(0)

    def _appended(self, queue: _TimedDeque):
        if queue.kind == _DONE:
            self._joined(queue[-1])
        if not queue.scheduled and len(queue) == 1:
            self._schedule_front(queue)

    def _joined(self, item):
        stream, launch = item
        if launch.send is None:
            return
        key = (stream.name, launch.round)
        count, last = self.joins.get(key, (0, 0.0))
        count, last = count + 1, max(last, self.now)
        if count < self.P:
            self.joins[key] = (count, last)
            return
        self.joins.pop(key, None)
        if launch.with_facts:
            self.facts_done[key] = last + self._facts_seconds(launch)
        start = max(last, self.last_reduce_done)
        self.round_done[key] = self.last_reduce_done = start + self._reduce_seconds(launch)
        for rank in self.world.ranks:
            q = rank.launches
            if q and not q.scheduled and (q[0][0].name, q[0][1].round) == key:
                self._schedule_front(q)

    def _facts_seconds(self, launch) -> float:
        # the facts alone, started first by every rank at its join
        return self._reduction_seconds(launch.send[-1].nbytes)

    def _reduce_seconds(self, launch) -> float:
        # a solo/majority round carries every rank's facts in its last buffer, with the data
        return self._reduction_seconds(self.nbytes + (launch.send[-1].nbytes if launch.with_facts else 0))

    def _reduction_seconds(self, nbytes: int) -> float:
        cost = self._reduce_cost.get(nbytes)
        if cost is None:
            cost = self._reduce_cost[nbytes] = self.net.reduce_seconds(self.P, nbytes)
        return cost

    def _schedule_front(self, queue: _TimedDeque):
        if queue.kind == _DONE:
            stream, launch = queue[0]
            ready = queue.times[0] if launch.send is None else self.round_done.get((stream.name, launch.round))
            if ready is None:
                return  # not every rank has joined yet: scheduled when the last one does
        else:
            ready = queue.times[0]
        queue.scheduled = True
        self._push(max(ready, self.now), queue.rank, queue.kind, queue.key, queue)

    def _push(self, time: float, rank: int, kind: int, key: int, payload):
        self.seq += 1
        heapq.heappush(self.heap, (time, _COMM, rank, kind, key, self.seq, payload))

    # -- running -----------------------------------------------------------------------

    def run(self) -> SimResult:
        self._schedule_idle()
        while self.heap:
            time, cls, j, kind, _, _, payload = heapq.heappop(self.heap)
            self.now = time
            self.events += 1
            if cls == _COMPUTE:
                self.computing[j] = False
                self.done_steps[j] += 1
                self._call(j, self.world.post, self._one)
                self._touched.add(j)
            else:
                self._communicate(kind, payload)
            if not (self.heap and self.heap[0][0] <= self.now and self.heap[0][1] == _COMM):
                self._schedule_idle()
        if any(not self.world.idle(j) for j in range(self.P)):  # pragma: no cover - a protocol bug
            raise RuntimeError("simulation ended with ranks still waiting")
        result = self._result()
        log.debug("simulated %d ranks, %s: %d rounds in %.3f s of simulated time (%d events)",
                  self.P, self.mode, result.rounds, result.seconds, self.events)
        return result

    def _communicate(self, kind: int, payload):
        if kind == _WAKE:
            self._serve(payload)
            return
        queue = payload
        queue.scheduled = False
        j = queue.rank
        if kind == _DELIVER:
            if self.world.ranks[j].driver.for_control(queue[0]):
                # Control messages wait, in order of arrival, while the engine serves others.
                queue.scheduled = True  # its front is now in the rank's serving queue
                self.serving[j].append(queue)
                if len(self.serving[j]) == 1:
                    if self.serve_free[j] <= self.now:
                        self._serve(j)
                    else:
                        self._wake(j)
                return
            self.world.apply(("deliver", queue.src, j, queue.lane))
        else:
            if queue[0][1].round == 0:
                self.registered_at = self.now
            cost = self._completion_seconds(j, queue[0][0])
            if cost is not None:  # the completion feeds the control policy: the engine serves it
                base = max(self.now, self.serve_free[j])
                self._begin_serving(j, base, cost)
            self.world.complete(j)
            if cost is not None:
                self._end_serving(j, base)
        self._touched.add(j)
        if len(queue) and not queue.scheduled:
            self._schedule_front(queue)

    def _completion_seconds(self, j: int, stream) -> float | None:
        """The engine's time to feed rank j's completion of a round of
        ``stream`` to its control policy (None: it does not feed it)."""
        if self.world.ranks[j].driver.control.decides_completion(stream):
            return self.coord_cost  # the coordinator decides: its code walks every rank
        if self.control_plane == "decentral" and not stream.sync:
            return self.view_cost  # every rank derives the next round's view from the facts
        return None

    def _handling_seconds(self, j: int, message) -> float:
        """The engine's time to handle a control message that reached rank j."""
        control = self.world.ranks[j].driver.control
        if getattr(control, "coordinator", None) is not None and isinstance(message, _COORDINATOR_REPORTS):
            return self.coord_cost
        return self.handle_cost

    def _begin_serving(self, j: int, start: float, cost: float, setup: bool = False):
        self._setup = setup
        self.serving_rank = j
        self.send_clock = start + cost

    def _end_serving(self, j: int, start: float):
        self.busy[j] += self.send_clock - start
        if not self._setup:
            self.round_busy[j] += self.send_clock - start
        self.serve_free[j] = self.send_clock
        self.send_clock = self.serving_rank = None

    def _serve(self, j: int):
        """Serve the first control message waiting at rank j (its engine is free now)."""
        queue = self.serving[j].popleft()
        self._begin_serving(j, self.now, self._handling_seconds(j, queue[0]), isinstance(queue[0], _SETUP))
        self.world.apply(("deliver", queue.src, j, queue.lane))
        self._end_serving(j, self.now)
        self._touched.add(j)
        queue.scheduled = False
        if len(queue):
            self._schedule_front(queue)
        if self.serving[j]:
            if self.serve_free[j] <= self.now:  # free communication: serve the next one at once
                self._serve(j)
            else:
                self._wake(j)

    def _call(self, j: int, call, *args):
        """Rank j's compute thread posts or flushes: what its engine sends for
        it leaves at once, the next messages ``send_seconds`` apart."""
        self.serving_rank, self.send_clock, self._first_send_free = j, self.now, True
        try:
            call(j, *args)
        finally:
            self.serving_rank = self.send_clock = None
            self._first_send_free = False

    def _wake(self, j: int):
        self._push(self.serve_free[j], j, _WAKE, 0, j)

    def _settle_now(self):
        while self.heap and self.heap[0][0] <= self.now and self.heap[0][1] == _COMM:
            _, _, _, kind, _, _, payload = heapq.heappop(self.heap)
            self.events += 1
            self._communicate(kind, payload)

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
                    heapq.heappush(self.heap, (self.now + busy, _COMPUTE, j, 0, 0, self.seq, None))
                else:
                    # Done: enter flush, so that the others are not held by the staleness bound.
                    self.finish[j] = self.now
                    self.flushed[j] = True
                    self._call(j, self.world.flush)
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
            events=self.events, coordinator_busy_s=self.busy[0], initiators=initiators,
            control_plane=self.control_plane, busy_max_s=max(self.round_busy),
            busy_mean_s=float(np.mean(self.round_busy)), messages_max=max(self.messages),
            messages_mean=float(np.mean(self.messages)), setup_messages_max=max(self.setup_messages),
            registered_s=self.registered_at, quorum_additions=self.world.quorum_counters.additions)


def simulate(world_size: int, mode: Mode, max_staleness: int, steps: int | Sequence[int],
             compute_seconds: Callable[[int, int], float], network: NetworkModel | None = None,
             nbytes: int = 4, deadline_s: float | None = None, control_plane: str = "decentral",
             activation_delay_s: float = 0.0) -> SimResult:
    """Simulate ``steps`` posts per rank (an int, or one count per rank) of a
    stream of ``nbytes`` bytes; rank ``j``'s compute at its step ``s`` takes
    ``compute_seconds(j, s)``. With ``deadline_s``, a rank whose post returns
    at or after that time stops training (a time budget instead of a step
    count). ``control_plane``: ``"central"`` (rank 0's coordinator) or
    ``"decentral"`` (no coordinator; see the module docstring);
    ``activation_delay_s``: the decentralized plane's activation delay (0:
    floods go out at once, no early joins). Deterministic: the same
    arguments give the same result.

    Example::

        r = simulate(4, Solo(), 8, 100, sleeper_schedule(4, 0.02, 0.1, seed=0),
                     network=NetworkModel(reduce_base_s=1e-3))
        r.rounds_per_second, r.posts_per_second
    """
    return ClusterSimulator(world_size, mode, max_staleness, steps, compute_seconds, network, nbytes,
                            deadline_s, control_plane, activation_delay_s).run()
