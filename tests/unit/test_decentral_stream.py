"""DecentralStream, step by step: what a driver sees (actions) for scripted
events, including the P=3, tau=1 case where two laggards catch up while each
still sees the other as lagging."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest

from hvd_partial.core.activation import max_hops
from hvd_partial.core.decentral import (QUORUM_SLOTS, Activate, Complete, DecentralStream, Gathered, Join, QuorumMet,
                                        ReleaseActivation, Send, SharedQuorumCounters)
from hvd_partial.core.messages import StreamSignature
from hvd_partial.core.round_result import RoundResult
from hvd_partial.errors import MismatchError, StreamConflictError
from hvd_partial.sim.decentral_world import DecentralWorld
from hvd_partial.sim.post_ledger import PostLedger


@dataclass
class Joined:
    """What a rank summed into a round it joined, and its facts."""

    contributions: list
    facts: np.ndarray


class Script:
    """A driver that delivers every message and completes every round at once,
    in order; each rank's posts are in a PostLedger, which hears of each event
    first (as the engine's rank stream does)."""

    def __init__(self, P, kind="solo", tau=1, **kw):
        self.counters = SharedQuorumCounters()
        self.ledgers = [PostLedger() for _ in range(P)]
        self.streams = [DecentralStream(j, P, kind, tau, self.ledgers[j], counters=self.counters.for_rank(j)(0),
                                        **kw) for j in range(P)]
        self.queue: deque = deque()
        self.joins: dict = {}
        self.done: dict = {}  # rank -> list of Complete
        self.sent: list = []  # (source, dest, message)

    def act(self, j, actions):
        for a in actions:
            if isinstance(a, Send):
                self.sent.append((j, a.dest, a.message))
                self.queue.append((j, a.dest, a.message))
            elif isinstance(a, Join):
                part = self.joins.setdefault(a.round, {})
                part[j] = Joined(self.ledgers[j].join(), a.facts)
                if len(part) == len(self.streams):
                    value = sorted(p for x in part.values() for p in x.contributions)
                    facts = np.sum([x.facts for x in part.values()], axis=0)
                    for k, s in enumerate(self.streams):
                        self.queue.append((None, k, ("reduced", a.round, value, facts)))
            elif isinstance(a, Complete):
                self.done.setdefault(j, []).append(a)
        return actions

    def settle(self, hold_completions_of=None) -> list:
        """Deliver everything; completions at rank ``hold_completions_of`` are
        kept back instead, and returned (hand them to ``deliver`` later, in order)."""
        kept = []
        while self.queue:
            item = self.queue.popleft()
            if item[0] is None and item[1] == hold_completions_of:
                kept.append(item)
            else:
                self.deliver(item)
        return kept

    def deliver(self, item) -> list:
        src, dest, msg = item
        if src is None:
            _, r, value, facts = msg
            stream = self.streams[dest]
            row, initiator, flush = stream.read_facts(facts)
            result = RoundResult(r, initiator, array=value, flush=flush, staleness_row=row)
            done = self.ledgers[dest].complete(result)
            return self.act(dest, ([] if done is None else [done]) + stream.on_reduced(r, facts, result))
        if type(msg) is ReleaseActivation:  # the host's timer
            return self.act(dest, self.streams[dest].release_flood(msg.round, msg.everyone_joined))
        return self.act(dest, self.streams[dest].on_message(src, msg))

    def post(self, j, payload):
        done = self.ledgers[j].post(payload)
        return self.act(j, ([] if done is None else [done]) + self.streams[j].post())

    def register(self):
        """Every rank's first post, registration agreed (as Agreements would), and round 0 completed everywhere."""
        for j in range(len(self.streams)):
            assert self.post(j, f"reg{j}") == []  # the first post waits for registration
        for j, s in enumerate(self.streams):
            self.act(j, s.registered())
        self.settle()

    def flush(self, j):
        self.ledgers[j].flush()
        return self.act(j, self.streams[j].flush())


def test_one_rank_posts_reduces_and_takes():
    w = Script(1, "solo", tau=2)
    assert w.post(0, "g0") == []  # the first post waits for registration
    (join,) = w.act(0, w.streams[0].registered())
    assert isinstance(join, Join) and join.round == 0 and w.joins[0][0].contributions == ["g0"]
    (done,) = w.deliver(w.queue.popleft())  # round 0 completes
    assert done.kind == "post" and done.seq == 1
    (result,) = done.results
    assert (result.round, result.contributors, result.staleness, result.initiator) == (0, [0], {0: 0}, None)
    (flush_join,) = w.flush(0)  # the only rank is flushing: it starts the flush round
    assert flush_join.round == 1 and w.joins[1][0].contributions == []
    with pytest.raises(StreamConflictError):
        w.post(0, "g1")  # the flush is still in progress
    (done,) = w.deliver(w.queue.popleft())
    assert done.kind == "flush" and done.results[-1].flush and done.results[-1].contributors == []
    assert not w.queue


def test_two_laggards_at_p3_tau1_are_gathered_to_one_root():
    w = Script(3, "solo", tau=1)
    w.register()  # registration: round 0 with everyone
    assert [s.completed for s in w.streams] == [1, 1, 1]
    w.post(0, "a1")
    w.settle()  # rank 0 alone starts and fills round 1 (no blockers yet)
    assert w.streams[0].completed == 2 and w.done[0][-1].results[0].contributors == [0]
    # Round 2's view, identical on every rank: ranks 1 and 2 took 1 round and posted nothing since.
    for s in w.streams:
        assert s.held.view.round == 2 and s.held.view.blockers.tolist() == [1, 2]
    w.post(0, "a2")
    w.settle()
    waiter = w.ledgers[0].waiter
    assert (waiter.kind, waiter.seq) == ("post", 3)  # held by the laggards
    w.post(1, "b1")  # laggard 1 catches up (takes round 1 at once): it still sees rank 2 lagging
    w.settle()
    assert w.streams[1].completed == 2 and not any(isinstance(m, Activate) and m.round == 2 for _, _, m in w.sent)
    w.post(2, "c1")  # laggard 2 catches up: its report lets the root (rank 1) start round 2
    w.settle()
    assert (2, 1, Gathered(2, "stale", 1)) in w.sent
    result = w.done[0][-1].results[-1]
    assert (result.round, result.initiator, result.contributors, result.staleness) == \
           (2, 1, [0, 1, 2], {0: 0, 1: 1, 2: 1})
    assert sorted(result.array) == ["a2", "b1", "c1"]
    for j in range(3):
        w.flush(j)
    w.settle()
    for j in range(3):
        final = w.done[j][-1]
        assert final.kind == "flush" and final.results[-1].flush and final.results[-1].round == 3


def test_majority_round_waits_for_its_designated_initiator_and_quorum():
    P = 4
    w = Script(P, "majority", tau=3, seed=5, quorum=3)
    w.register()
    d = w.streams[0].held.designated
    assert all(s.held.designated == d for s in w.streams)
    w.post(d, "d1")
    w.settle()
    assert all(s.completed == 1 for s in w.streams)  # one holder: below the quorum of 3
    others = [j for j in range(P) if j != d]
    w.post(others[0], "x1")
    w.settle()
    assert all(s.completed == 1 for s in w.streams)  # two holders
    w.post(others[1], "y1")
    w.settle()
    result = w.done[d][-1].results[-1]
    assert result.round == 1 and result.initiator == d and len(result.contributors) == 3
    # one notice, from the rank whose addition made the quorum
    assert [(src, dest, m) for src, dest, m in w.sent if type(m) is QuorumMet] == [(others[1], d, QuorumMet(1))]


def test_a_quorum_met_by_the_designated_initiators_own_post_sends_no_notice_and_counters_are_reused():
    P = 5
    w = Script(P, "majority", tau=8, seed=3, quorum=2)
    w.register()
    designated = {}
    for r in range(1, 7):  # rounds 1..6: three slots per rank, each reused
        d = designated[r] = w.streams[0].held.designated
        other = (d + 1) % P
        w.post(other, f"x{r}")
        w.settle()
        assert all(s.completed == r for s in w.streams)  # one holder, quorum 2
        w.post(d, f"d{r}")
        w.settle()
        assert all(s.completed == r + 1 for s in w.streams)
        contributed = {j: join.contributions for j, join in w.joins[r].items() if join.contributions}
        assert contributed == {d: [f"d{r}"], other: [f"x{r}"]}
    assert not [m for _, _, m in w.sent if type(m) is QuorumMet]  # each quorum was met by D's own addition
    # every round's counter was zeroed by its designated rank when it joined the round after next,
    # but the last two's (5 and 6): round 7 has not started
    nonzero = {key: v for key, v in w.counters.values.items() if v}
    assert nonzero == {(0, designated[5], 5 % QUORUM_SLOTS): 2, (0, designated[6], 6 % QUORUM_SLOTS): 2}
    assert w.counters.additions == 12


def test_a_quorum_counter_is_zeroed_only_when_no_addition_for_its_round_can_come():
    """Balanced rounds with a quorum: a rank adds to the counter only when its
    activation delay ends before the round completes there, which may be after
    the designated rank went on to the next round. Rank 1 designates rounds 2
    and 5 (seed 0, P=4), which share its counter slot; rank 0's delay of round
    2 ends after rank 1 joined round 3. Zeroing the slot when rank 1 joins
    round 3 would keep that addition for round 5, whose quorum of three would
    then be met with two holders."""
    P = 4
    w = Script(P, "majority", tau=8, seed=0, quorum=3, defer_activations=True)
    assert [w.streams[0].designated(r) for r in (1, 2, 3, 4, 5)] == [3, 1, 3, 0, 1]
    w.register()
    for j in range(P):  # round 1, balanced: everyone joins by itself, nobody adds
        w.post(j, f"a{j}")
    w.settle()
    assert all(s.completed == 2 for s in w.streams) and w.counters.additions == 0
    for j in range(P):  # round 2: completes everywhere but at rank 0, whose delay has not ended
        w.post(j, f"b{j}")
    late = w.settle(hold_completions_of=0)
    for j in (1, 2, 3):  # round 3: they join; it waits for rank 0
        w.post(j, f"c{j}")
    w.settle()
    assert w.streams[1].last_joined == 3 and w.streams[0].floods.held_back == 2
    w.deliver((0, 0, ReleaseActivation(2)))  # rank 0's delay of round 2 ends: it adds at rank 1
    assert w.counters.values[(0, 1, 2 % QUORUM_SLOTS)] == 1
    for item in late:
        w.deliver(item)
    w.post(0, "c0")
    w.settle()
    assert all(s.completed == 4 for s in w.streams)
    # round 4 (designated rank 0), balanced; rank 3 does not post, so the delays end and the
    # additions of ranks 0, 1 and 2 make the quorum: rank 0 floods, rank 3 joins with nothing
    for j in (0, 1, 2):
        w.post(j, f"d{j}")
    w.settle()
    w.deliver((0, 0, ReleaseActivation(4)))
    assert w.streams[0].floods.flood_awaits_quorum == 4  # one holder counted, three needed
    for j in (1, 2):
        w.deliver((j, j, ReleaseActivation(4)))
    w.settle()
    assert all(s.completed == 5 for s in w.streams)
    assert sorted(j for j, join in w.joins[4].items() if join.contributions) == [0, 1, 2]
    assert [(src, m) for src, dest, m in w.sent if type(m) is QuorumMet] == [(2, QuorumMet(4))]
    # round 5 (designated rank 1) follows a round without rank 3: not balanced, holders add at once
    w.post(2, "e2")
    w.post(1, "e1")
    w.settle()
    assert all(s.completed == 5 for s in w.streams), "round 5 started with two holders"
    w.post(0, "e0")
    w.settle()
    assert all(s.completed == 6 for s in w.streams)
    assert sorted(j for j, join in w.joins[5].items() if join.contributions) == [0, 1, 2]


def test_a_rank_that_joins_the_next_round_drops_what_it_held_back_for_the_last():
    """Someone completed round c to start c + 1, so every rank joined c: a rank
    that joins c + 1 before c completes there (c + 1's activation came first)
    neither floods c nor adds to c's quorum counter when its delay ends."""
    P = 4
    w = Script(P, "majority", tau=8, seed=0, quorum=3, defer_activations=True)
    w.register()
    for j in range(P):  # round 1 (designated rank 3), balanced: rank 0 joins early
        w.post(j, f"a{j}")
    late = w.settle(hold_completions_of=0)
    assert w.streams[0].floods.held_back == 1 and w.streams[0].tally.deferred is not None
    w.act(0, w.streams[0].on_message(1, Activate(2)))
    assert w.streams[0].floods.held_back is None and w.streams[0].tally.deferred is None
    sent = len(w.sent)
    w.deliver((0, 0, ReleaseActivation(1)))  # its delay of round 1 ends: nothing to do
    assert w.counters.additions == 0 and len(w.sent) == sent
    for item in late:
        w.deliver(item)
    w.settle()
    assert [s.completed for s in w.streams] == [3] * P  # (round 2, on that activation, with no data)


def signature(shape=(4,), dtype="float32", tau=2):
    return StreamSignature(((shape, dtype),), False, ("solo",), "average", tau)


@pytest.mark.parametrize("P,odd", [(1, None), (2, 1), (5, 3), (7, 0), (13, 12), (40, 17)])
def test_registration_compares_signatures_and_rejects_on_every_rank(P, odd):
    sigs = [signature() for _ in range(P)]
    if odd is not None:
        sigs[odd] = signature(shape=(5,))
    world = DecentralWorld(P, "solo", 2, [2] * P, seed=P, signatures=sigs).run()
    if odd is None:
        assert all(world.done) and world.taken[0][0].round == 0
        return
    for j in range(P):
        err = world.errors[j]
        assert isinstance(err, MismatchError), f"rank {j}: {err!r}"
        assert f"rank {odd} " in str(err) and "layout" in str(err)  # one of the two ranks it names
        assert not world.taken[j], "no round may run on a rejected stream"
    assert 0 < world.max_per_round("Rejected") <= max_hops(P)  # flooded like an activation
