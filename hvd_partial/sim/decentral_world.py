"""An event-driven world of P ranks running the coordinator-free control
plane (:mod:`hvd_partial.core.decentral`), with no MPI and no threads.

Every message takes a random delay; a round's reduction completes on each
rank a random moment after the last rank joined it (its value is the list of
every post summed into it, sorted, and its facts the sum of every rank's);
a rank's compute takes the time its schedule says, then it posts, or
flushes once it has no posts left. A rank's first post registers the
stream through :class:`~hvd_partial.core.decentral.agreement.Agreements`, as
in the engine (``signatures``: each rank's, compared there). Each rank's
posts and results are kept by a :class:`~.post_ledger.PostLedger`, as the
engine's rank stream keeps them, which the rank's stream machine reads. Ranks
can die or be stopped (and resumed) at given times; with ``liveness`` every
rank also runs the engine's liveness (:class:`hvd_partial.core.liveness.Liveness`:
ring heartbeats, the failure flood) on a periodic tick, and stops handling
liveness at its first failure, as an engine stops. With ``park_at``, each rank waits once in a call that needs
every rank (a barrier, as ``hvd.allreduce`` of a metric at an epoch's end)
after that many posts, parked, and takes the rounds completed meanwhile
when every rank has come. The tests check the protocol's guarantees on the
record the world keeps; the benchmark counts its messages.

Example::

    world = DecentralWorld(8, "solo", max_staleness=2, posts=[3] * 8, seed=1)
    world.run()
    world.taken[0][-1].flush   # -> True
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.decentral import (AgreementOutcome, AgreementReport, Agreements, Complete, DecentralStream, Join,
                              Send, SharedQuorumCounters)
from ..core.decentral.facts import INITIATED, PARKED
from ..core.decentral.messages import ReleaseActivation
from ..core.liveness import Liveness
from ..core.messages import Declared, Failure, Heartbeat, Registered
from ..core.round_result import RoundResult
from ..errors import MismatchError
from .post_ledger import PostLedger

_LIVENESS = (Heartbeat, Failure)
_AGREEMENT = (AgreementReport, AgreementOutcome)


@dataclass
class Fault:
    """Rank ``rank`` dies at ``time`` (``stop_s`` None) or is stopped for ``stop_s``."""

    time: float
    rank: int
    stop_s: float | None = None


class DecentralWorld:
    def __init__(self, world_size: int, kind: str, max_staleness: int, posts: list[int], seed: int = 0,
                 quorum: int | None = None, majority_seed: int = 0,
                 compute: Callable[[int, int], float] | None = None, delay_s: float = 0.05,
                 liveness: bool = False, heartbeat_s: float = 1.0, failure_timeout_s: float = 6.0,
                 tick_s: float = 0.25, faults: tuple = (), time_limit_s: float = 1e6, keep_results: bool = True,
                 run_until_s: float | None = None, flush_after: list | None = None, signatures: list | None = None,
                 park_at: list | None = None):
        P = world_size
        self.P = P
        self.kind = kind
        self.tau = max_staleness
        self.quorum = quorum
        self.rng = random.Random(seed)
        self.delay_s = delay_s
        self.compute = compute or (lambda j, step: self.rng.uniform(0.01, 0.2))
        self.quorum_counters = SharedQuorumCounters()
        self.ledgers = [PostLedger() for _ in range(P)]  # each rank's posts and results
        self.streams = [DecentralStream(j, P, kind, max_staleness, self.ledgers[j], seed=majority_seed,
                                        quorum=quorum, counters=self.quorum_counters.for_rank(j)(0))
                        for j in range(P)]
        self.signatures = signatures
        self.agreements = [Agreements(j, P, lambda dest, msg, j=j: self._act(j, [Send(dest, msg)]),
                                      lambda decision, j=j: self._on_agreed(j, decision)) for j in range(P)]
        self.liveness = liveness
        self.tick_s = tick_s
        # (every rank starts its clock at 0, as engines do after init's barrier; a rank whose
        # ticks are more than two apart did not run)
        self.rings = [Liveness(j, P, heartbeat_s, failure_timeout_s, now=0.0, frozen_s=2 * tick_s)
                      for j in range(P)] if liveness else None
        self.posts_left = list(posts)
        # per rank: flush once after this many posts left (None: only at the end), then go on posting
        self.flush_after = list(flush_after) if flush_after is not None else [None] * P
        self.flushes_left = [1] * P  # the final flush, plus one for each flush in the middle begun
        # per rank: posts left when it enters the barrier, parked (None: it never does)
        self.park_at = list(park_at) if park_at is not None else [None] * P
        self.in_barrier: set[int] = set()
        self.to_take: set[int] = set()  # ranks out of the barrier waiting for rounds they joined parked
        self.parked_takes = 0  # rounds taken at the end of a barrier
        self.keep_results = keep_results
        self.time_limit_s = time_limit_s  # with liveness: stop after this long with only ticks left
        self.run_until_s = run_until_s  # with liveness: keep ticking at least until then
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.busy = 0  # events other than ticks in the heap
        self.in_flight = 0  # protocol messages and reductions in the heap
        self.on_quiet: Callable | None = None  # called whenever no protocol message or reduction is in flight
        # record
        self.taken: list[list] = [[] for _ in range(P)]
        self.posted: dict[int, tuple] = {}  # post id -> (rank, computed_for)
        self.done = [False] * P
        self.errors: list = [None] * P  # the first error a rank's waiter got
        self.named: list = [None] * P  # the first failed rank a rank learned of, and when
        self.alive = [True] * P
        self.died_at: dict[int, float] = {}
        self.stopped_until = [0.0] * P
        self.joins: dict[int, dict] = {}
        self.last_reduced = [0.0] * P
        self.round_facts: dict[int, np.ndarray] = {}  # round -> its reduced facts
        # round -> ranks not flushing nor parked when its first initiator started it, or fewer while some
        # rank parked before it started (majority's quorum may count that moment)
        self.start_training: dict[int, int] = {}
        self._fewest_training: dict[int, int] = {}
        # message counts: round -> kind -> (sent per rank, received per rank)
        self.counts: dict[int, dict] = defaultdict(dict)
        self.heartbeats_sent = 0
        # liveness messages per rank: heartbeats and failure notices received (handled or not), notices sent
        self.heartbeats_received = [0] * P
        self.notices_received = [0] * P
        self.notices_sent = [0] * P
        self.events = 0
        for j in range(P):
            self._push(self.compute(j, 0), "compute", j, None)
            if liveness:
                self._push(self.rng.uniform(0, tick_s), "tick", j, None, busy=False)
        for fault in faults:
            self._push(fault.time, "fault", fault.rank, fault)

    # -- running ----------------------------------------------------------------------

    def _push(self, time, kind, rank, payload, busy=True, seq=None):
        if seq is None:
            self.seq += 1
            seq = self.seq
        self.busy += busy
        self.in_flight += kind in ("deliver", "reduced") and busy
        heapq.heappush(self.heap, (time, seq, kind, rank, payload, busy))

    def finished(self) -> bool:
        return all(self.done[j] or self.streams[j].failure is not None or not self.alive[j] for j in range(self.P))

    def run(self) -> "DecentralWorld":
        last_busy = 0.0
        while self.heap:
            if self.busy == 0 and (not self.liveness or self.finished() and self.now >= (self.run_until_s or 0)):
                break
            time, seq, kind, j, payload, busy = heapq.heappop(self.heap)
            self.busy -= busy
            self.in_flight -= kind in ("deliver", "reduced") and busy
            if busy:
                last_busy = time
            elif self.liveness and time - last_busy > self.time_limit_s and time >= (self.run_until_s or 0):
                break  # only ticks for too long: a deadlock (the checks name who waits)
            self.now = time
            if not self.alive[j] and kind != "fault":
                continue
            if time < self.stopped_until[j]:  # a stopped rank does nothing until it resumes
                self._push(self.stopped_until[j], kind, j, payload, busy=busy, seq=seq)
                continue
            self.events += 1
            getattr(self, "_on_" + kind)(j, payload)
            if self.on_quiet is not None and self.in_flight == 0:
                self.on_quiet(self)
        return self

    def _on_compute(self, j, _):
        stream, ledger = self.streams[j], self.ledgers[j]
        if stream.failure is not None:
            return
        if self.park_at[j] is not None and self.posts_left[j] == self.park_at[j]:
            self.park_at[j] = None
            self.in_barrier.add(j)
            self._act(j, stream.park())
            training = sum(1 for s in self.streams if not s.stands_in)
            for r in range(min(s.completed for s in self.streams), max(s.completed for s in self.streams) + 1):
                self._fewest_training[r] = min(training, self._fewest_training.get(r, training))
            if len(self.in_barrier) == self.P:  # the last rank came: every rank leaves, a moment apart
                for k in sorted(self.in_barrier):
                    self._push(self.now + self.rng.uniform(1e-3, self.delay_s), "unpark", k, None)
                self.in_barrier.clear()
        elif self.flush_after[j] is not None and self.posts_left[j] == self.flush_after[j]:
            self.flush_after[j] = None  # a flush in the middle of training
            self.flushes_left[j] += 1
            ledger.flush()
            self._act(j, stream.flush())
        elif self.posts_left[j] > 0:
            self.posts_left[j] -= 1
            post_id = len(self.posted)
            self.posted[post_id] = (j, ledger.taken)
            done = ledger.post(post_id)  # (the ledger first, as the engine's rank stream: the machine reads it)
            self._act(j, ([] if done is None else [done]) + stream.post())
            if ledger.seq == 1:  # the first post registers the stream, as in the engine
                self.agreements[j].register(stream.name, None if self.signatures is None else self.signatures[j])
        else:
            ledger.flush()
            self._act(j, stream.flush(final=True))

    def _on_unpark(self, j, _):
        """Rank ``j`` leaves the barrier: it trains again once it took (and
        applied) every round completed meanwhile."""
        stream = self.streams[j]
        self._act(j, stream.unpark())
        if not stream.take_ready:
            self.to_take.add(j)
            return
        self._take_after_barrier(j)

    def _take_after_barrier(self, j):
        self.to_take.discard(j)
        taken = self.ledgers[j].take()
        if taken:  # (as the engine's driver: the machine hears of a take that took something)
            self._act(j, self.streams[j].took())
        self.parked_takes += len(taken)
        if self.keep_results or j == 0:
            self.taken[j].extend(taken)
        self._push(self.now + self.compute(j, len(self.taken[j]) if self.keep_results else 0), "compute", j, None)

    def _on_deliver(self, j, item):
        source, msg = item
        if isinstance(msg, Heartbeat):
            self.heartbeats_received[j] += 1
        elif isinstance(msg, Failure):
            self.notices_received[j] += 1
        if self.liveness and self.rings[j].failure is None:  # (an engine stops at its first failure)
            self.rings[j].heard(source, self.now)  # any message is life
            if isinstance(msg, Failure):
                self._act(j, self.rings[j].on_notice(source, msg))
        if isinstance(msg, _LIVENESS):
            return
        self._count(msg, "recv", j)
        if isinstance(msg, _AGREEMENT):
            self.agreements[j].on_message(source, msg)
        elif type(msg) is ReleaseActivation:  # the host's timer, modelled as a message to itself
            self._act(j, self.streams[j].release_flood(msg.round, msg.everyone_joined))
        else:
            self._act(j, self.streams[j].on_message(source, msg))

    def _on_agreed(self, j, decision):
        """Rank ``j`` learned the outcome of the stream's registration."""
        if type(decision) is Registered:
            self._act(j, self.streams[j].registered())
        else:
            self._fail(j, MismatchError(decision.reason))

    def _fail(self, j, error):
        self.streams[j].fail(error)
        done = self.ledgers[j].fail(error)
        if done is not None:
            self._act(j, [done])

    def _on_reduced(self, j, item):
        r, value, facts = item
        stream = self.streams[j]
        row, initiator, flush = stream.read_facts(facts)
        result = RoundResult(r, initiator, array=value, flush=flush, staleness_row=row)
        done = self.ledgers[j].complete(result)  # (the ledger first, as the engine's rank stream)
        self._act(j, ([] if done is None else [done]) + stream.on_reduced(r, facts, result))
        if j in self.to_take and self.streams[j].take_ready:
            self._take_after_barrier(j)

    def _on_tick(self, j, _):
        self._act(j, self.rings[j].tick(self.now))
        self._push(self.now + self.tick_s, "tick", j, None, busy=False)

    def _on_fault(self, j, fault: Fault):
        if fault.stop_s is None:
            self.alive[j] = False
            self.died_at[j] = self.now
        else:
            self.stopped_until[j] = self.now + fault.stop_s

    # -- actions ----------------------------------------------------------------------

    def _act(self, j: int, actions: list):
        for action in actions:
            if isinstance(action, Send):
                msg = action.message
                if isinstance(msg, Heartbeat):
                    self.heartbeats_sent += 1
                elif isinstance(msg, Failure):
                    self.notices_sent[j] += 1
                else:
                    self._count(msg, "sent", j)
                self._push(self.now + self.rng.uniform(1e-3, self.delay_s), "deliver", action.dest, (j, msg),
                           busy=not isinstance(msg, _LIVENESS))
            elif isinstance(action, Join):
                self._join(j, action)
            elif isinstance(action, Complete):
                self._complete(j, action)
            elif isinstance(action, Declared):
                if self.named[j] is None:
                    self.named[j] = (action.error.rank, self.now)
                self._fail(j, action.error)
            else:  # pragma: no cover
                raise TypeError(action)

    def _join(self, j: int, join: Join):
        if join.facts[INITIATED, j] and join.round not in self.start_training:
            before = self.round_facts.get(join.round - 1)
            parked = before[PARKED] if before is not None else np.zeros(self.P, np.int64)
            # (a rank parked in the round's view counts out of the quorum even if it trains again now)
            training = sum(1 for s in self.streams if not s.stands_in and not parked[s.rank])
            self.start_training[join.round] = min(training, self._fewest_training.pop(join.round, training))
        part = self.joins.get(join.round)
        if part is None:  # [ranks joined, posts summed, facts summed]
            part = self.joins[join.round] = [0, [], np.zeros_like(join.facts)]
        part[0] += 1
        part[1].extend(self.ledgers[j].join())
        np.add(part[2], join.facts, out=part[2])
        if part[0] < self.P:
            return
        del self.joins[join.round]
        value, facts = sorted(part[1]), part[2]
        self.round_facts[join.round] = facts
        for k in range(self.P):  # a rank's engine completes its rounds in order
            at = self.last_reduced[k] = max(self.last_reduced[k], self.now + self.rng.uniform(1e-3, self.delay_s))
            self._push(at, "reduced", k, (join.round, value, facts))

    def _complete(self, j: int, done: Complete):
        if done.error is not None:
            if self.errors[j] is None:
                self.errors[j] = done.error
            return
        if self.keep_results or j == 0:
            self.taken[j].extend(done.results)
        if done.kind == "flush":
            self.flushes_left[j] -= 1
            if self.flushes_left[j] == 0:
                self.done[j] = True
                return
        step = len(self.taken[j]) if self.keep_results else 0
        self._push(self.now + self.compute(j, step), "compute", j, None)

    def _count(self, msg, direction: str, j: int):
        per_kind = self.counts[getattr(msg, "round", 0)]  # registration's messages belong to round 0
        name = type(msg).__name__
        if name == "Gathered":
            name += ":" + msg.kind
        elif name == "AgreementReport":
            name += ":" + msg.key[0]
        elif name == "AgreementOutcome":  # named by what it says: Registered or Rejected
            name = type(msg.message).__name__
        if name not in per_kind:
            per_kind[name] = (np.zeros(self.P, np.int64), np.zeros(self.P, np.int64))
        per_kind[name][0 if direction == "sent" else 1][j] += 1

    # -- summaries --------------------------------------------------------------------

    def max_per_round(self, name: str, direction: str = "both") -> int:
        """The most ``name`` messages one rank sent or received in one round."""
        best = 0
        for per_kind in self.counts.values():
            if name in per_kind:
                sent, recv = per_kind[name]
                arrays = {"sent": [sent], "recv": [recv], "both": [sent, recv]}[direction]
                best = max(best, *(int(a.max()) for a in arrays))
        return best
