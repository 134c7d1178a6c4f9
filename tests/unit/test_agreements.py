"""Registration, sync flushes and shutdown without a coordinator
(hvd_partial.core.decentral.agreement), in random arrival orders, and the same
agreements through the protocol driver on the loopback world."""

from __future__ import annotations

import random
from collections import Counter, deque

import numpy as np
import pytest

from hvd_partial.core.activation import max_hops
from hvd_partial.core.decentral.agreement import Agreements
from hvd_partial.core.fusion import Layout
from hvd_partial.core.messages import Closed, FlushBegun, Registered, Rejected, Start, StreamSignature
from hvd_partial.core.round_result import RoundResult
from hvd_partial.engine.stats import StatsRecorder
from hvd_partial.errors import MismatchError
from hvd_partial.modes import Majority, Solo, Sum, Sync
from hvd_partial.sim.loopback import LoopbackWorld


class World:
    """P ranks' Agreements; messages delivered in random order (in order per pair)."""

    def __init__(self, size: int, seed: int):
        self.size = size
        self.rng = random.Random(seed)
        self.queues: dict[tuple, deque] = {}
        self.decisions: list[list] = [[] for _ in range(size)]
        self.sent = Counter()
        self.received = Counter()
        self.ranks = [Agreements(j, size, self._sender(j), self.decisions[j].append) for j in range(size)]

    def _sender(self, j):
        def send(dest, message):
            assert dest != j
            self.sent[j] += 1
            self.queues.setdefault((j, dest), deque()).append(message)
        return send

    def run(self):
        while True:
            ready = [key for key, q in self.queues.items() if q]
            if not ready:
                return
            src, dest = self.rng.choice(ready)
            self.received[dest] += 1
            self.ranks[dest].on_message(src, self.queues[(src, dest)].popleft())


def signature(dtype="float32"):
    return StreamSignature(((( 4,), dtype),), False, ("solo", 0, None), "average", 8)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 8, 13, 16, 40, 64])
def test_registration_assigns_the_same_ids_everywhere_with_log_messages(size):
    world = World(size, seed=size)
    order = {j: random.Random(j).sample(["a", "b", "c"], 3) for j in range(size)}
    for step in range(3):
        for j in world.rng.sample(range(size), size):
            world.ranks[j].register(order[j][step], signature())
            if world.rng.random() < 0.3:
                world.run()
    world.run()
    ids = [{d.name: d.stream for d in world.decisions[j]} for j in range(size)]
    assert all(x == ids[0] for x in ids) and sorted(ids[0].values()) == [0, 1, 2]
    assert all(len(world.decisions[j]) == 3 for j in range(size))
    # per agreement: one report up and an outcome copy to each neighbour; reports from at most
    # log P children and a copy from each neighbour
    assert max(world.sent.values(), default=0) <= 3 * (1 + max_hops(size))
    assert max(world.received.values(), default=0) <= 3 * 2 * max_hops(size)


@pytest.mark.parametrize("size,odd", [(2, 1), (3, 2), (8, 5), (13, 12), (40, 17)])
def test_a_rank_that_disagrees_is_named_on_every_rank(size, odd):
    world = World(size, seed=odd)
    for j in world.rng.sample(range(size), size):
        world.ranks[j].register("g", signature("float64" if j == odd else "float32"))
    world.run()
    for j in range(size):
        (decision,) = world.decisions[j]
        assert isinstance(decision, Rejected) and decision.name == "g"
        assert f"rank {odd} differs from rank " in decision.reason and "layout" in decision.reason
    # the name may be posted again, and registers once all agree
    for j in range(size):
        world.ranks[j].register("g", signature())
    world.run()
    assert all(world.decisions[j][-1] == Registered("g", 0) for j in range(size))


@pytest.mark.parametrize("size", [1, 2, 6, 16])
def test_shutdown_rejects_streams_some_ranks_never_posted_then_closes(size):
    world = World(size, seed=3)
    posted = {j: ["both"] + (["some"] if j % 2 == 0 else []) for j in range(size)}
    for j in range(size):
        world.ranks[j].leave(posted[j])
    world.run()
    for j in range(size):
        rejected = [d for d in world.decisions[j] if isinstance(d, Rejected)]
        if size > 1:
            assert [d.name for d in rejected] == ["some"]
            assert "never on ranks [1" in rejected[0].reason
        else:
            assert not rejected
        assert not any(isinstance(d, Closed) for d in world.decisions[j])  # nobody is done yet
    for j in world.rng.sample(range(size), size)[:-1]:
        world.ranks[j].done()
        world.run()  # while one rank is not done, nobody is closed
        assert not any(isinstance(d, Closed) for k in range(size) for d in world.decisions[k])
    for j in range(size):
        world.ranks[j].done()  # the last one (again for the others: a no-op)
    world.run()
    assert all(world.decisions[j][-1] == Closed() for j in range(size))


def test_a_sync_flush_is_announced_once_and_its_round_starts_when_all_flush():
    world = World(5, seed=1)
    world.ranks[3].sync_flush(0, 4)
    world.ranks[1].sync_flush(0, 4)
    world.run()
    for j in range(5):
        assert [type(d) for d in world.decisions[j]] == [FlushBegun]  # one notice, whoever flushed first
    for j in (0, 2, 4):
        world.ranks[j].sync_flush(0, 4)
    world.run()
    for j in range(5):
        assert world.decisions[j][-1] == Start(0, None, None, flush=True)
        assert sum(isinstance(d, Start) for d in world.decisions[j]) == 1


# -- through the driver ---------------------------------------------------------------------------------


@pytest.mark.parametrize("plane", ["central", "decentral"])
def test_a_stream_posted_on_some_ranks_only_is_refused_there_at_shutdown(plane):
    layout = Layout.of([np.zeros(2)])
    world = LoopbackWorld(4, Solo(), Sum, 4, layout, control_plane=plane)
    for j in range(4):
        world.post(j, [np.ones(2)])
    world.run_communication()
    world.post(1, [np.ones(2)], name="lonely")
    world.ranks[1].waiter = None  # the caller did not wait for it
    for j in range(4):
        world.shutdown(j)
    world.run_communication()
    assert all(world.left(j) for j in range(4))
    (error,) = world.ranks[1].errors
    assert isinstance(error, MismatchError)
    assert "'lonely' was posted on ranks [1] but never on ranks [0, 2, 3] before shutdown" in str(error)
    assert all(world.results(j)[-1].flush for j in range(4))
    for j in range(4):  # plain Python values in every result (callers serialize them)
        assert all(type(r.flush) is bool and (r.initiator is None or type(r.initiator) is int)
                   for r in world.results(j)), plane


@pytest.mark.parametrize("plane", ["central", "decentral"])
@pytest.mark.parametrize("mode", [Sync(), Solo(), Majority(seed=2, quorum=2)])
def test_many_streams_register_and_shut_down_in_any_order(plane, mode):
    P = 6
    layout = Layout.of([np.zeros(1)])
    rng = random.Random(7)
    world = LoopbackWorld(P, mode, Sum, 2, layout, control_plane=plane)
    names = ["s0", "s1", "s2", "s3"]
    for name in names:
        for j in rng.sample(range(P), P):
            world.post(j, [np.full(1, j + 1.0)], name=name)
            world.ranks[j].waiter = None
        world.run_communication(rng)
    for j in rng.sample(range(P), P):
        world.shutdown(j)
    world.run_communication(rng)
    ids = [{name: world.ranks[j].driver.streams[name].id for name in names} for j in range(P)]
    assert all(x == ids[0] for x in ids) and sorted(ids[0].values()) == [0, 1, 2, 3]
    assert all(world.left(j) for j in range(P))
    for name in names:
        total = sum(float(r.array.sum()) for r in world.results(0, name))
        assert total == sum(range(1, P + 1)), f"{name}: a contribution was lost or counted twice"


def test_the_lag_of_each_rank_is_read_from_the_round_facts():
    """Decentralized plane: the slow-rank report's lag comes from the facts each round carries."""
    layout = Layout.of([np.zeros(1)])
    world = LoopbackWorld(3, Solo(), Sum, 4, layout, control_plane="decentral")

    def lags_seen_by_rank_0():
        stats = StatsRecorder(3)
        stream = world.ranks[0].stream
        latest = RoundResult(stream.completed - 1, None, staleness_row=np.ones(3, np.int64))
        stats.round_completed(stream.name, latest, stream.last_known_taken())
        return stats.snapshot()[stream.name]["lag"]

    for j in range(3):
        world.post(j, [np.ones(1)])
    world.run_communication()
    assert lags_seen_by_rank_0() == [0, 0, 0]
    for _ in range(3):  # rank 0 runs ahead; ranks 1 and 2 take nothing
        world.post(0, [np.ones(1)])
        world.run_communication()
    assert lags_seen_by_rank_0() == [0, 2, 2]  # at the start of round 3 they had taken round 0 only
    central = LoopbackWorld(2, Solo(), Sum, 4, layout, control_plane="central")
    for j in range(2):
        central.post(j, [np.ones(1)])
    central.run_communication()
    assert central.ranks[0].stream.last_known_taken() is None  # there the coordinator's Start carries the lags
