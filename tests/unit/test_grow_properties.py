"""Elastic training's grow on the loopback world, over random schedules that
also kill ranks (hvd_partial.sim.loopback, hvd_partial.sim.growing).

``LoopbackWorld.grow`` does what the MPI engine's grow does
(engine/growth.py) with the same core rules (core/growth.py:
streams_at_rest, agreed_rounds, start_carried): where every rank is idle and
every stream at rest on every rank, every rank's driver shuts down, the new
ranks join after the current ones (numbered after every earlier rank), and
every rank gets a new driver on the grown world whose streams number their
rounds on. A schedule tries a grow at random events (refused, changing
nothing, unless everything is at rest) and grows at the end of each phase (a
phase: every rank posts, then flushes; after a grow every rank, old and new,
posts again). Kills come between any two events, as in
test_shrink_properties.py, whose checks this file reuses.

After every change (a kill or a grow), and at the end:

- consistency: every member took the same rounds, in round order, with
  identical results; a rank that joined took every round from its grow on;
- conservation: at a grow (everything at rest) every post of a living rank
  so far is summed exactly once; at the end every survivor's and every new
  rank's posts, and no post is ever summed twice;
- a dead rank's contributions all or nothing per round;
- the staleness bound; results' world_size and world_version name the world
  each round completed on, its contributors its members;
- majority: every result names the initiator drawn for its world's size
  (numbered from the restart: an engine started by a grow counts its rounds
  from 0), and after a kill the survivors' views and designated initiators
  are those of the new P (check_after_change).
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shrink_properties import Schedule, check_after_change, make_mode, posts_in, victim_of

from hvd_partial.core.decentral.facts import FLUSHING, INITIATED
from hvd_partial.sim.loopback import STREAM

MAX_P = 16
STEPS_PER_RANK = 25
MAX_POSTS = 2  # a rank posts 1 to MAX_POSTS times per phase
RUNS = {"schedules": 0, "kills": 0, "grows": 0, "grows_mid_phase": 0, "refused": 0, "joined_ranks": 0,
        "designated_checked": 0, "seconds": 0.0}
SIZES: set = set()


class GrowSchedule(Schedule):
    """A random schedule with kills and grows: ``grows`` is a list of (step, count)."""

    def __init__(self, P, mode, tau, posts, speeds, seed, kills, grows, average=False):
        # room for the one-hot posts of every phase: the first, and one per grow
        reserve = [MAX_POSTS] * (MAX_P * (len(grows) + 1))
        super().__init__(P, mode, tau, list(posts) + reserve, speeds + [1] * len(reserve), seed, kills, average)
        self.remaining = {j: n for j, n in enumerate(posts)}
        self.grows = sorted(grows)
        self.tried = False  # the next grow was tried at its event
        self.facts: dict[int, np.ndarray] = {}
        self.first_round: dict[int, int] = {}  # rank number -> the first round it could take
        for rank in self.world.ranks:
            self.first_round[rank.original] = 0
            rank.reduced = self._reduced

    # -- what the schedule records ------------------------------------------------------

    def _joined(self, rank, stream, launch):
        if stream.name == STREAM and launch.send is not None and not self.world.stopping:
            self.joined[(rank.original, launch.round + stream.round_offset)] = set(
                np.flatnonzero(launch.send[0]).tolist())

    def _reduced(self, stream, launch, result):
        if stream.name == STREAM and stream.last_facts is not None and launch.with_facts and not self.world.stopping:
            self.facts[launch.round + stream.round_offset] = stream.last_facts.copy()

    def offset(self, version: int) -> int:
        """How many rounds came before the engine that the world of ``version`` runs on."""
        carried = [g["carried"].get(STREAM, 0) for g in self.world.grows if g["version"] <= version]
        return carried[-1] if carried else 0

    # -- the schedule -------------------------------------------------------------------

    def run(self):
        while True:
            self.kill_due()
            if self.grows and self.grows[0][0] <= self.steps and not self.tried:
                # one try at its event (refused unless everything is at rest), else at the phase's end
                self.tried = True
                if self.grow(self.grows[0][1]):
                    RUNS["grows_mid_phase"] += 1
            events = self.events()
            if not events:
                if self.kill_after_end():
                    continue
                if self.grows:  # a grow at the end of a phase: everything is at rest
                    full = self.world.world_size >= MAX_P
                    assert self.grow(self.grows[0][1]) or full, "the world did not grow with every stream at rest"
                    continue
                return self
            self.step(*self.rng.choice(events))

    def taken_now(self, rank) -> int:
        stream = rank.stream  # (numbered on across grows)
        return rank.driver.carried.get(STREAM, 0) if stream is None else stream.taken + stream.round_offset

    def grow(self, count) -> bool:
        world = self.world
        count = max(1, min(count, MAX_P - world.world_size))
        if world.world_size >= MAX_P:
            self.grows.pop(0)
            self.tried = False
            return False
        done = world.grow(count, self.rng)
        if done is None:
            RUNS["refused"] += 1
            return False
        self.grows.pop(0)
        self.tried = False
        self.changes.append(done)
        RUNS["grows"] += 1
        RUNS["joined_ranks"] += count
        # the next phase: every rank, old and new, posts again (to a sync stream equally often)
        same = self.rng.randint(1, MAX_POSTS)
        before = self.remaining[world.ranks[0].original]  # (a sync stream: every old rank has as many left)
        for rank in world.ranks:
            o = rank.original
            if o in done["started"]:
                self.first_round[o] = done["carried"].get(STREAM, 0)
                self.speeds[o] = self.rng.randint(1, 8)
                self.remaining[o] = before if self.mode.kind == "sync" else 0
                rank.reduced = self._reduced
            self.remaining[o] += same if self.mode.kind == "sync" else self.rng.randint(1, MAX_POSTS)
        self.flushed.clear()
        check_after_grow(self, done)
        return True

    def kill(self, j):
        done = self.world.kill(j)
        self.changes.append(done)
        RUNS["kills"] += 1
        check_after_change(self, done)
        check_results(self, at_rest=False)


def check_after_grow(schedule: GrowSchedule, done: dict):
    """Right after a grow: the members, every driver new on the grown world and numbering on
    from the rounds carried; the results so far consistent and conserved (all at rest)."""
    world = schedule.world
    P = world.world_size
    assert done["members"] == tuple(r.original for r in world.ranks) == world.worlds[world.version]
    assert world.joined[-len(done["started"]):] == done["started"]
    assert min(done["started"]) > max(o for v in range(world.version) for o in world.worlds[v])
    for j, rank in enumerate(world.ranks):
        assert rank.rank == j and rank.driver.size == P and not rank.driver.streams
        assert rank.driver.carried == done["carried"]
    check_results(schedule, at_rest=True)


def check_results(schedule: GrowSchedule, at_rest: bool, final: bool = False):
    """Consistency and conservation over the results taken so far (see the module docstring)."""
    world, mode, tau = schedule.world, schedule.mode, schedule.tau
    members = world.ranks
    dead = {o for change in schedule.changes for o in change.get("failed", ())}
    first = {rank.original: schedule.first_round[rank.original] for rank in members}
    start = min(first.values())
    by_round: dict = {}  # round -> its result, as the first member to take it took it
    ends = set()
    for rank in members:
        mine = world.results(rank.rank)
        f = first[rank.original]
        assert [r.round for r in mine] == list(range(f, f + len(mine))), f"rank {rank.original}: rounds out of order"
        ends.add(f + len(mine))
        for a in mine:
            b = by_round.setdefault(a.round, a)
            assert np.array_equal(a.array, b.array), f"rank {rank.original} round {a.round}"
            assert (a.contributors, a.staleness, a.initiator, a.flush, a.world_size, a.world_version) == \
                   (b.contributors, b.staleness, b.initiator, b.flush, b.world_size, b.world_version)
    if at_rest or final:
        assert len(ends) == 1, f"members took rounds up to {sorted(ends)}"
    reference = [by_round[r] for r in sorted(by_round)]
    assert [r.round for r in reference] == list(range(start, start + len(reference))), "a round missing"
    end = start + len(reference)
    counts = {res.round: posts_in(res, schedule.average) for res in reference}
    summed = np.sum(list(counts.values()), axis=0) if reference else np.zeros(schedule.total, np.int64)
    assert summed.min(initial=0) >= 0 and summed.max(initial=0) <= 1, "a post summed twice"
    if at_rest or final:  # conservation: every living rank's post (within the reference's rounds) summed once
        for i, (o, taken) in schedule.owner.items():
            if o not in dead and taken >= start:
                assert summed[i] == 1, f"post {i} of living rank {o} summed {summed[i]} times"
    # A dead rank's contributions: all or nothing per round.
    where = {i: r for r, c in counts.items() for i in np.flatnonzero(c).tolist()}
    for (jo, r), posts in schedule.joined.items():
        if jo in dead and posts and start <= r < end:
            landed = {i for i in posts if i in where}
            assert not landed or landed == posts and {where[i] for i in posts} == {r}, \
                f"dead rank {jo}: round {r} joined with {sorted(posts)}, results hold {sorted(landed)}"
    # Facts match the data; the staleness bound; majority's initiators for the world of each round.
    for res in reference:
        in_round = np.flatnonzero(counts[res.round]).tolist()
        owners = sorted({schedule.owner[i][0] for i in in_round})
        ranks_then = world.worlds[res.world_version]
        assert res.world_size == len(ranks_then)
        assert [ranks_then[c] for c in res.contributors] == sorted(owners, key=ranks_then.index), \
            f"round {res.round}: contributors {res.contributors} of {ranks_then} vs data {owners}"
        for c in res.contributors:
            oldest = min(schedule.owner[i][1] for i in in_round if schedule.owner[i][0] == ranks_then[c])
            assert res.staleness[c] == res.round - oldest
        for c, s in res.staleness.items():
            assert 0 <= s <= tau or mode.kind == "sync" and s == 0, f"round {res.round}: staleness {s} > {tau}"
        local = res.round - schedule.offset(res.world_version)
        if mode.kind == "majority" and local > 0 and not res.flush:
            assert res.initiator == mode.initiator(STREAM, local, res.world_size)
        if mode.kind == "sync" and not res.flush:
            assert res.contributors == list(range(res.world_size)) or res.world_version < world.version
    # Majority: a round started after the last change is started by the designated initiator of the new P.
    last = schedule.changes[-1] if schedule.changes else None
    if final and mode.kind == "majority" and last is not None:
        offset = schedule.offset(world.version)
        if "plans" in last:
            if STREAM not in last["plans"]:
                return
            first_new = last["plans"][STREAM].started + offset
        else:
            first_new = last["carried"].get(STREAM, 0)
        P = world.world_size
        for r, facts in schedule.facts.items():
            if r >= first_new and r - offset > 0 and facts.shape[1] == P and start <= r < end:
                started_by = np.flatnonzero(facts[INITIATED]).tolist()
                d = mode.initiator(STREAM, r - offset, P)
                stands_in = mode.quorum is None and facts[FLUSHING, d] != 0
                if not reference[r - start].flush and not stands_in:
                    assert started_by in ([], [d]), f"round {r} started by {started_by} on {P} ranks, designated {d}"
                    RUNS["designated_checked"] += 1


def run_one(P, mode_name, tau, seed, mseed, kills, grows, average=False):
    began = time.perf_counter()
    rng = random.Random(seed)
    posts = [rng.randint(1, MAX_POSTS) for _ in range(P)]
    speeds = [rng.randint(1, 8) for _ in range(P)]
    mode = make_mode(mode_name, P, mseed)
    if mode.kind == "sync":
        posts = [posts[0]] * P
    kills = [(when * STEPS_PER_RANK * P // 100, how, pick) for when, how, pick in kills] if P > 1 else []
    grows = [(when * STEPS_PER_RANK * P // 100, count) for when, count in grows]
    schedule = GrowSchedule(P, mode, tau, posts, speeds, seed, kills, grows, average)
    schedule.run()
    world = schedule.world
    for rank in world.ranks:
        assert rank.waiter is None, f"rank {rank.original} still waits at the end (deadlock)"
        assert not rank.errors, f"rank {rank.original}: {rank.errors}"
        assert rank.stream is None or not rank.stream.pending, f"rank {rank.original} kept pending data"
    check_results(schedule, at_rest=False, final=True)
    RUNS["schedules"] += 1
    RUNS["seconds"] += time.perf_counter() - began
    SIZES.add(P)
    return schedule


sizes = st.one_of(st.integers(1, 4), st.integers(1, 5), st.integers(2, MAX_P))  # (most small: time)
modes = st.sampled_from(["solo", "majority", "majority_quorum", "sync"])
kill = st.tuples(st.integers(0, 150), st.sampled_from(["any", "any", "rank0", "designated"]), st.integers(0, 63))
grow = st.tuples(st.integers(0, 150), st.integers(1, 3))


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(P=sizes, mode_name=modes, tau=st.integers(0, 3), seed=st.integers(0, 2**32 - 1), mseed=st.integers(0, 3),
       kills=st.lists(kill, max_size=2), grows=st.lists(grow, min_size=1, max_size=2), average=st.booleans())
def test_kills_and_grows_at_any_event_keep_every_guarantee(P, mode_name, tau, seed, mseed, kills, grows, average):
    run_one(P, mode_name, tau, seed, mseed, kills, grows, average)


@pytest.mark.parametrize("P", range(1, MAX_P + 1))
def test_every_size_kills_and_grows(P):
    # every size at least once whatever hypothesis draws above: a kill, then a grow, each mode in turn
    mode_name = ["solo", "majority", "majority_quorum", "sync"][P % 4]
    run_one(P, mode_name, 2, P, 0, [(30, "any", P)] if P > 1 else [], [(60, 1)], False)


def test_the_grow_properties_ran_often_enough():
    """(Runs last in the file) more than 1,000 schedules, of every size from 1 to 16, that grew."""
    if not RUNS["schedules"]:
        pytest.skip("selected alone: the counts are those of the test above in this file")
    print(f"\ngrow schedules: {RUNS}; sizes {sorted(SIZES)}")
    assert RUNS["schedules"] >= 1000 and SIZES == set(range(1, MAX_P + 1))
    assert RUNS["grows"] > 500 and RUNS["kills"] > 300 and RUNS["grows_mid_phase"] > 0
