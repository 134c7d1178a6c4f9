"""The hypercube flood that activates a round, for every world size up to 128
and random sets of concurrent initiators; and the binomial-tree scheme that
fails with concurrent initiators."""

from __future__ import annotations

import heapq
import random

import pytest

from hvd_partial.core.activation import (Activation, binomial_children, hypercube_distance, hypercube_neighbours,
                                         max_hops)
from hvd_partial.errors import EngineError


def flood(P, starts, delay, round_number=0):
    """Run one round's flood. ``starts`` maps initiator -> start time (an
    initiator that hears the round before its start time does not start it);
    ``delay(src, dst)`` gives each message's delay. Returns per rank the time
    it first heard, the hops of that first activation, and messages sent and
    received."""
    ranks = [Activation(j, P) for j in range(P)]
    heard = [None] * P
    hops = [None] * P
    sent = [0] * P
    received = [0] * P
    queue = []
    seq = 0
    for j, t in starts.items():
        heapq.heappush(queue, (t, seq, "start", j, None, 0))
        seq += 1
    while queue:
        t, _, kind, j, src, h = heapq.heappop(queue)
        first = not ranks[j].heard(round_number)
        if kind == "start":
            out = ranks[j].start(round_number)
        else:
            received[j] += 1
            out = ranks[j].receive(round_number, src)
        if first:
            heard[j], hops[j] = t, h
        for dst in out:
            sent[j] += 1
            heapq.heappush(queue, (t + delay(j, dst), seq, "msg", dst, j, h + 1))
            seq += 1
    return heard, hops, sent, received


def test_neighbours_and_distance_bounds():
    for P in range(1, 129):
        H = max_hops(P)
        assert H == (0 if P == 1 else (P - 1).bit_length())
        for a in range(P):
            nb = hypercube_neighbours(a, P)
            assert len(nb) <= H and all(0 <= n < P and hypercube_distance(a, n) == 1 for n in nb)
            for b in range(P):
                assert hypercube_distance(a, b) <= H


@pytest.mark.parametrize("P", list(range(1, 129)))
def test_flood_reaches_every_rank_within_log_hops(P):
    rng = random.Random(P)
    H = max_hops(P)
    for trial in range(12):
        initiators = rng.sample(range(P), rng.randint(1, min(P, 6 if trial % 2 else P)))
        # Synchronous model (every message takes one step): the first start is
        # at step 0, later initiators start at a random step if not reached yet.
        starts = {j: (0 if i == 0 else rng.randint(0, H)) for i, j in enumerate(initiators)}
        heard, hops, sent, received = flood(P, starts, lambda s, d: 1)
        assert all(t is not None for t in heard), f"P={P}: ranks {[j for j in range(P) if heard[j] is None]} unreached"
        assert max(heard) <= H, f"P={P}: reached at step {max(heard)} > ceil(log2 P) = {H}"
        assert max(sent) <= H and max(received) <= H
        # Asynchronous model: random delays in (0, 1]; every rank hears no later
        # than ceil(log2 P) maximal delays after the first start.
        delays = {}

        def delay(s, d):
            delays[(s, d)] = rng.uniform(1e-3, 1.0)
            return delays[(s, d)]

        starts = {j: (0.0 if i == 0 else rng.uniform(0, H)) for i, j in enumerate(initiators)}
        heard, hops, sent, received = flood(P, starts, delay)
        assert all(t is not None for t in heard)
        assert max(heard) <= H * 1.0 + 1e-9
        assert max(sent) <= H and max(received) <= H, (P, max(sent), max(received))
        # each rank's first activation came along a path no shorter than its distance to some initiator
        for j in range(P):
            assert hops[j] >= min(hypercube_distance(j, i) for i in starts)


def test_duplicates_and_order_are_checked():
    a = Activation(5, 7)
    assert sorted(a.start(0)) == [1, 4]
    assert a.receive(0, 4) == [] and a.start(0) == []
    assert sorted(a.receive(1, 4)) == [1]  # forwards to every neighbour but the sender
    with pytest.raises(EngineError):
        a.receive(3, 1)  # round 2 was never heard


def test_a_held_start_sends_nothing_until_released():
    a = Activation(5, 7)
    assert a.start_held(0) is None and a.heard(0)
    assert a.receive(0, 4) == []  # a duplicate: the round is this rank's already
    assert a.still_to_tell(0) == [1]  # the released flood skips the neighbour heard from
    with pytest.raises(EngineError):
        a.start_held(2)  # round 1 was never started here


def binomial_flood(P, starts, delay):
    """Each initiator broadcasts along the binomial tree rooted at itself; a
    rank forwards only along the tree of the first activation it hears."""
    heard = [None] * P
    queue = []
    seq = 0
    for j, t in starts.items():
        heapq.heappush(queue, (t, seq, j, j, None))
        seq += 1
    while queue:
        t, _, j, root, src = heapq.heappop(queue)
        if heard[j] is not None:
            continue
        heard[j] = t
        for dst in binomial_children(j, root, P):
            heapq.heappush(queue, (t + delay(j, dst), seq, dst, root, j))
            seq += 1
    return heard


def test_binomial_forward_first_misses_a_rank_with_two_initiators():
    """P=7, initiators 0 and 3: rank 2 hears 3's tree first (3 -> 5 -> 2, a
    leaf there) and rank 4 hears 0's tree first (a leaf there): rank 6, whose
    parents are 2 in 0's tree and 4 in 3's tree, is never reached."""
    P = 7
    assert binomial_children(0, 0, P) == [1, 2, 4] and binomial_children(2, 0, P) == [6]
    assert binomial_children(3, 3, P) == [4, 5, 0] and binomial_children(4, 3, P) == [6, 1]
    fast = {(3, 5), (5, 2), (0, 4)}
    heard = binomial_flood(P, {0: 0.0, 3: 0.0}, lambda s, d: 0.1 if (s, d) in fast else 1.0)
    assert heard[6] is None and all(heard[j] is not None for j in range(P) if j != 6)
    # The hypercube flood reaches rank 6 under the same delays, and under every
    # assignment of fast and slow links tried.
    rng = random.Random(0)
    for _ in range(2000):
        slow = {(s, d): rng.choice([0.1, 1.0]) for s in range(P) for d in range(P)}
        got, _, _, _ = flood(P, {0: 0.0, 3: 0.0}, lambda s, d: slow[(s, d)])
        assert all(t is not None for t in got)
