"""The engine's liveness (hvd_partial.engine.liveness, the I/O driver of
hvd_partial.core.liveness) on a fake transport: ring heartbeats (one per rank
per period), the failure flood reaching every live rank within
ceil(log2 P) + 1 hops, the accused told, and a frozen rank that blames
nobody. No MPI, no threads: a simulated clock and message queues. The last
tests drive the pure core alone (times passed in); the simulator's property
tests (test_decentral_properties.py) run the same core over random faults."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from hvd_partial.config import Config
from hvd_partial.core.activation import max_hops
from hvd_partial.core import liveness as core_liveness
from hvd_partial.core.liveness import flood_targets
from hvd_partial.core.messages import Declared, Failure, Heartbeat, Send
from hvd_partial.engine import liveness as liveness_mod
from hvd_partial.engine.liveness import CHECK_SECONDS, Liveness
from hvd_partial.errors import EngineError, RankFailedError
from hvd_partial.transport.tags import TAG_FAILURE, TAG_HEARTBEAT


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class _Transport:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def send(self, dest, tag, message):
        self.world.sent[self.rank][tag] += 1
        self.world.dests[self.rank][tag].add(dest)
        self.world.queues[dest].append((self.rank, tag, message))


class _World:
    """P engines' liveness parts. ``dead``: ranks that neither tick nor
    receive; ``failed[r]``: the first error of rank r (its engine then stops,
    as a real one does after draining its notices)."""

    def __init__(self, monkeypatch, size, heartbeat=1.0, timeout=3.0, configs=None):
        self.clock = _Clock()
        monkeypatch.setattr(liveness_mod.time, "monotonic", self.clock)
        self.size = size
        self.config = Config(heartbeat_seconds=heartbeat, failure_timeout_seconds=timeout)
        self.sent = [Counter() for _ in range(size)]
        self.dests = [{TAG_HEARTBEAT: set(), TAG_FAILURE: set()} for _ in range(size)]
        self.queues = [deque() for _ in range(size)]
        configs = configs or {}  # rank -> its own Config
        self.ranks = [Liveness(_Transport(self, r), r, size, configs.get(r, self.config)) for r in range(size)]
        self.dead: set[int] = set()
        self.frozen: set[int] = set()
        self.failed: dict[int, RankFailedError] = {}
        self.failed_at: dict[int, float] = {}

    def _fail(self, rank, error, notify):
        if rank in self.failed:
            return
        self.failed[rank] = error
        self.failed_at[rank] = self.clock.now
        if notify:
            self.ranks[rank].notify(error)

    def deliver(self) -> bool:
        """One hop: every rank handles what had arrived before this call."""
        batches = [list(q) for q in self.queues]
        for q, batch in zip(self.queues, batches):
            for _ in batch:
                q.popleft()
        moved = False
        for rank, batch in enumerate(batches):
            if rank in self.dead or rank in self.frozen:
                self.queues[rank].extendleft(reversed(batch))  # waits for it (or forever)
                continue
            for source, tag, message in batch:
                moved = True
                if rank in self.failed:
                    continue  # its engine has stopped
                self.ranks[rank].heard(source)
                if tag == TAG_FAILURE:
                    self._fail(rank, self.ranks[rank].failure_notice(source, message), notify=False)
        return moved

    def step(self, dt=CHECK_SECONDS):
        """One engine step on every running rank: deliver, then check."""
        self.clock.now += dt
        self.deliver()
        for rank, part in enumerate(self.ranks):
            if rank in self.dead or rank in self.frozen or rank in self.failed:
                continue
            if part.due(self.clock.now):
                error = part.check(self.clock.now)
                if error is not None:
                    self._fail(rank, error, notify=True)

    def run(self, seconds):
        for _ in range(int(round(seconds / CHECK_SECONDS))):
            self.step()


@pytest.mark.parametrize("size", [2, 3, 8, 33])
def test_each_rank_sends_one_heartbeat_per_period_to_its_successor_only(monkeypatch, size):
    world = _World(monkeypatch, size, heartbeat=1.0, timeout=3.0)
    seconds = 20.0
    world.run(seconds)
    assert world.failed == {}  # healthy ranks are never named
    periods = seconds / world.config.heartbeat_seconds
    for rank in range(size):
        beats = world.sent[rank][TAG_HEARTBEAT]
        assert periods <= beats <= periods + 1, (rank, beats)  # O(1) per period, whatever P is
        assert world.dests[rank][TAG_HEARTBEAT] == {(rank + 1) % size}
        assert world.sent[rank][TAG_FAILURE] == 0


def _named_by_every_live_rank(world, accused, started):
    for rank in range(world.size):
        if rank in world.dead or rank == accused:
            continue
        error = world.failed.get(rank)
        assert error is not None, (world.size, accused, rank)
        assert error.rank == accused, (rank, error)
        assert "no message from it" in str(error)
        # failure_timeout_seconds + a check + a heartbeat in flight, then the flood's hops
        bound = world.config.failure_timeout_seconds + world.config.heartbeat_seconds \
            + (max_hops(world.size) + 3) * CHECK_SECONDS
        assert world.failed_at[rank] - started <= bound, (rank, world.failed_at[rank] - started)


@pytest.mark.parametrize("size", list(range(2, 20)) + [32, 33, 64])
def test_a_dead_ranks_failure_floods_to_every_live_rank_in_log_p_hops(monkeypatch, size):
    for accused in sorted({0, 1, size // 2, size - 1}):
        world = _World(monkeypatch, size)
        world.run(2.0)
        world.dead.add(accused)
        started = world.clock.now
        reporter = (accused + 1) % size
        while reporter not in world.failed:
            world.step()
            assert world.clock.now - started < 10
        # the flood alone, one hop per delivery
        hops = 0
        while world.deliver():
            hops += 1
        assert hops <= max_hops(size) + 1, (size, accused, hops)
        world.step()
        _named_by_every_live_rank(world, accused, started)
        for rank in range(size):
            assert world.sent[rank][TAG_FAILURE] <= 2 * max_hops(size) + 2, (rank, world.sent[rank])


@pytest.mark.parametrize("size", [3, 5, 8, 13])
def test_a_local_error_floods_to_every_rank(monkeypatch, size):
    for origin in range(size):
        world = _World(monkeypatch, size)
        world.run(0.5)
        world._fail(origin, RankFailedError(origin, "raised ValueError"), notify=True)
        while world.deliver():
            pass
        for rank in range(size):
            assert world.failed[rank].rank == origin and "ValueError" in str(world.failed[rank])
            assert world.sent[rank][TAG_FAILURE] <= 2 * max_hops(size) + 2


def test_a_stopped_rank_is_told_and_names_itself_on_resuming(monkeypatch):
    world = _World(monkeypatch, 5)
    world.run(1.0)
    world.frozen.add(2)
    world.run(5.0)
    assert {r: e.rank for r, e in world.failed.items()} == {0: 2, 1: 2, 3: 2, 4: 2}
    world.frozen.discard(2)
    world.step(dt=5.0)  # resumed: what came while it was stopped is delivered first
    error = world.failed[2]
    assert error.rank == 2 and "declared failed by rank 3" in str(error) and "no message from it" in str(error)


def test_a_rank_frozen_past_its_own_timeout_blames_nobody(monkeypatch):
    # As in the MPI test: rank 1 times out after 1.5 s, the others after 60 s;
    # rank 1 is stopped for 3 s while the others run on.
    world = _World(monkeypatch, 4, heartbeat=0.2, timeout=60.0,
                   configs={1: Config(heartbeat_seconds=0.2, failure_timeout_seconds=1.5)})
    world.run(1.0)
    world.frozen.add(1)
    world.run(3.0)
    world.frozen.discard(1)
    world.run(3.0)
    assert world.failed == {}


def test_two_adjacent_dead_ranks_are_named_by_every_live_rank(monkeypatch):
    # The flood may have no path; the notice then also goes around the ring.
    for size in (4, 6, 9):
        world = _World(monkeypatch, size)
        world.run(1.0)
        world.dead.update({1, 2})
        world.run(6.0)
        for rank in range(size):
            if rank not in world.dead:
                assert world.failed[rank].rank in (1, 2), (size, rank, world.failed.get(rank))


def test_flood_targets_route_around_the_failed_rank_and_skip_it_on_the_ring():
    assert flood_targets(0, 8, 1, None) == [2, 3, 4, 5]  # 0's neighbours 1, 2, 4 and 1's: 3, 5
    assert flood_targets(0, 2, 1, None) == []
    assert 2 not in flood_targets(1, 8, 2, None) and 3 in flood_targets(1, 8, 2, None)


# -- the pure core, times passed in ------------------------------------------------------


def _ticks(live, start, stop, step=CHECK_SECONDS):
    """Tick ``live`` every ``step`` from ``start`` to ``stop``; every action made."""
    out = []
    for i in range(int(round((stop - start) / step)) + 1):
        out += live.tick(start + i * step)
    return out


def test_the_engine_and_the_simulator_run_the_same_core(monkeypatch):
    from hvd_partial.sim.decentral_world import DecentralWorld
    engine_part = _World(monkeypatch, 3).ranks[0]
    world = DecentralWorld(3, "solo", max_staleness=1, posts=[1] * 3, liveness=True)
    assert type(engine_part.core) is core_liveness.Liveness
    assert all(type(ring) is core_liveness.Liveness for ring in world.rings)


def test_core_heartbeats_then_declares_its_silent_predecessor_and_stops():
    live = core_liveness.Liveness(rank=2, size=8, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0)
    assert live.tick(0.0) == [Send(3, Heartbeat(2))]
    assert live.tick(0.5) == []  # not due yet
    live.heard(4, 0.9)  # not the predecessor: no life
    live.heard(1, 1.0)
    actions = _ticks(live, 0.51, 3.95)
    beats = [a for a in actions if isinstance(a, Send) and isinstance(a.message, Heartbeat)]
    assert [a.dest for a in beats] == [3, 3, 3]  # at about 1, 2 and 3 s: to its successor only
    assert not any(isinstance(a, Declared) for a in actions)  # 3 s after 1.0 is not reached yet
    actions = _ticks(live, 3.96, 4.1)
    notices = [a for a in actions if isinstance(a, Send) and isinstance(a.message, Failure)]
    declared = [a for a in actions if isinstance(a, Declared)]
    assert len(declared) == 1 and actions[-1] is declared[0]
    error = declared[0].error
    assert isinstance(error, RankFailedError) and error.rank == 1
    assert str(error).startswith("rank 1 failed: no message from it for 3.0 s (failure_timeout_seconds=3)")
    # the flood from here (2's neighbours 3, 6 and 0; 1 is not one; ring successor 3), and the accused told
    assert sorted(a.dest for a in notices) == [0, 1, 3, 6]
    assert all(a.message == Failure(1, error.reason) for a in notices)
    assert live.failure is error
    assert _ticks(live, 4.2, 10.0) == []  # stopped: no heartbeat, nothing declared
    assert live.notify(error) == []  # the engine's fail(notify=True) after the check floods nothing twice


def test_core_passes_a_notice_on_once_and_declares_only_its_first_failure():
    live = core_liveness.Liveness(rank=0, size=8, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0)
    first = live.on_notice(4, Failure(5, "raised ValueError"))
    assert [a.dest for a in first if isinstance(a, Send)] == flood_targets(0, 8, 5, 4) == [1, 2]
    assert isinstance(first[-1], Declared) and first[-1].error.rank == 5 and "ValueError" in str(first[-1].error)
    assert live.on_notice(1, Failure(5, "raised ValueError")) == []  # a copy: nothing
    second = live.on_notice(2, Failure(6, "hung"))  # another failure: passed on, not declared
    assert second and all(isinstance(a, Send) and a.message == Failure(6, "hung") for a in second)
    assert live.failure.rank == 5


def test_core_names_itself_when_told_it_was_declared_failed():
    live = core_liveness.Liveness(rank=3, size=5, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0)
    actions = live.on_notice(4, Failure(3, "no message from it for 3.1 s"))
    assert len(actions) == 1 and isinstance(actions[0], Declared)  # nothing to pass on about itself
    assert actions[0].error.rank == 3 and "declared failed by rank 4: no message from it" in str(actions[0].error)


def test_core_floods_a_local_error_from_where_it_arose():
    live = core_liveness.Liveness(rank=1, size=6, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0)
    sends = live.notify(EngineError("engine of rank 1 crashed"))
    assert all(isinstance(a, Send) for a in sends)
    assert sorted(a.dest for a in sends) == flood_targets(1, 6, 1, None) == [0, 2, 3, 5]
    assert all(a.message == Failure(1, "engine of rank 1 crashed") for a in sends)
    assert live.tick(0.1) == []  # it has stopped
    assert core_liveness.Liveness(0, 1, 1.0, 3.0, now=0.0).notify(EngineError("x")) == []  # alone: nobody to tell


@pytest.mark.parametrize("frozen_for", [0.5, 10.0, 100.0])
def test_core_does_not_count_its_own_frozen_time_against_its_predecessor(frozen_for):
    live = core_liveness.Liveness(rank=1, size=4, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0)
    _ticks(live, 0.0, 2.0)
    live.heard(0, 2.0)
    _ticks(live, 2.01, 3.0)  # 1 s of silence while it ran
    resumed = 3.0 + frozen_for  # stopped in between: that time is not counted
    actions = _ticks(live, resumed, resumed + 1.95)
    assert not any(isinstance(a, Declared) for a in actions)  # 2.95 s of silence while running
    actions = _ticks(live, resumed + 2.05, resumed + 2.2)
    assert [a.error.rank for a in actions if isinstance(a, Declared)] == [0]  # past 3 s while running


def test_core_counts_a_short_gap_between_ticks_as_silence():
    live = core_liveness.Liveness(rank=1, size=4, heartbeat_s=1.0, failure_timeout_s=3.0, now=0.0, frozen_s=5.0)
    actions = live.tick(3.5)  # a gap under frozen_s: it ran, so the predecessor was silent
    assert [a.error.rank for a in actions if isinstance(a, Declared)] == [0]
