"""The protocol core on the loopback world, over many random arrival orders,
with each control plane: rank 0's coordinator ("central") and the
coordinator-free one ("decentral").

Each contribution is one-hot (a distinct index per post), so conservation is
checked exactly: every index must appear in exactly one round, with weight 1.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_partial.core.fusion import Layout
from hvd_partial.modes import Majority, Solo, Sum, Sync
from hvd_partial.sim.loopback import LoopbackWorld

# "decentral+held": solo rounds started in balanced training hold their flood back until a
# later event (the engine's activation delay), and drop it if the round completes first.
PLANES = ["central", "decentral", "decentral+held"]
planes = pytest.mark.parametrize("plane", PLANES)


def make_world(plane, world_size, mode, tau, layout):
    return LoopbackWorld(world_size, mode, Sum, tau, layout, control_plane=plane.split("+")[0],
                         defer_activations=plane.endswith("+held"))


def rounds_started(world, j=0) -> int:
    """Rounds of the world's stream that started on rank ``j`` (all, at quiescence)."""
    return world.ranks[j].stream.started


def run_schedule(world_size, mode, tau, posts_per_rank, seed, speeds, drain=False, plane="central", park_at=None):
    """Random schedule: compute actions of rank j happen with weight speeds[j].
    With ``park_at``, rank j enters a barrier once it has that many posts
    left, parked, and takes the rounds completed meanwhile after every rank
    came (``world.parked_takes`` counts them)."""
    rng = random.Random(seed)
    total = sum(posts_per_rank)
    layout = Layout.of([np.zeros(total, dtype=np.int64)])
    world = make_world(plane, world_size, mode, tau, layout)
    remaining = list(posts_per_rank)
    flushed = [False] * world_size
    index = 0
    owner = {}
    eager_checks = 0
    world.rounds_before_first_flush = None  # rounds completed anywhere when the first rank flushed
    barrier = [0 if park_at is not None else 3] * world_size  # 0 before, 1 in it, 2 out and to take, 3 done
    world.parked_takes = 0
    while True:
        events = [("comm", e) for e in world.communication_events()]
        if all(b >= 1 for b in barrier):
            events += [("unpark", j) for j in range(world_size) if barrier[j] == 1]
        events += [("take", j) for j in range(world_size) if barrier[j] == 2]
        for j in range(world_size):
            if barrier[j] == 0 and world.idle(j) and remaining[j] == park_at[j]:
                events.append(("park", j))
            elif barrier[j] in (1, 2):
                continue
            elif world.idle(j) and not flushed[j]:
                if remaining[j] > 0:
                    events += [("post", j)] * speeds[j]
                elif world.ranks[j].registered or posts_per_rank[j] == 0 and all(
                        r.registered for r in world.ranks if r.stream is not None):
                    events.append(("flush", j))
        if not events:
            break
        kind, what = rng.choice(events)
        if kind == "comm":
            world.apply(what)
        elif kind == "park":
            barrier[what] = 1
            world.park(what)
        elif kind == "unpark":
            barrier[what] = 2
            world.unpark(what)
        elif kind == "take":
            before = len(world.results(what))
            if world.take(what):
                barrier[what] = 3
                world.parked_takes += len(world.results(what)) - before
        elif kind == "post":
            one_hot = np.zeros(total, dtype=np.int64)
            one_hot[index] = 1
            owner[index] = (what, taken_count(world, what))
            index += 1
            remaining[what] -= 1
            world.post(what, [one_hot])
        else:
            if world.rounds_before_first_flush is None:
                world.rounds_before_first_flush = max(len(world.results(j)) for j in range(world_size))
            flushed[what] = True
            world.flush(what)
        if drain and kind != "comm":
            world.run_communication(rng)
        if not world.communication_events():
            eager_checks += check_eagerness(world, mode, tau, flushed)
    return world, total, owner, eager_checks


def taken_count(world, j) -> int:
    stream = world.ranks[j].stream
    return 0 if stream is None else stream.taken


def check_eagerness(world, mode, tau, flushed) -> int:
    """At quiescence, a solo post may wait only because of the staleness bound."""
    if mode.kind != "solo":
        return 0
    if world.control_plane == "decentral":
        return check_eagerness_decentral(world)
    coord_state = world.coordinator.streams[0] if world.coordinator.streams else None
    if coord_state is None:
        return 0
    waiting = [j for j, r in enumerate(world.ranks) if r.waiter is not None and r.waiter.kind == "post"]
    if not waiting:
        return 0
    r = coord_state.started
    laggards = [j for j, v in enumerate(coord_state.views)
                if not v.flushing and not (v.taken >= r - tau + 1 or v.pending)]
    assert laggards, f"solo ranks {waiting} wait at quiescence with no laggard (round {r})"
    return 1


def check_eagerness_decentral(world) -> int:
    """At quiescence, a solo post waits only where the view of the next round
    names blockers: ranks that by the shared facts may lag by the bound."""
    waiting = [j for j, r in enumerate(world.ranks) if r.waiter is not None and r.waiter.kind == "post"
               and r.registered]
    for j in waiting:
        held = world.ranks[j].driver.control.streams[0].held
        assert held is not None and len(held.view.blockers), \
            f"solo rank {j} waits at quiescence with no blocker in its view"
    return 1 if waiting else 0


def check_invariants(world, total, owner, tau, mode, parked=False):
    P = world.world_size
    reference = world.results(0)
    # Consistency: every rank took every round, in order, with identical results.
    for j in range(P):
        mine = world.results(j)
        assert [r.round for r in mine] == list(range(len(mine))), f"rank {j} took rounds out of order"
        assert len(mine) == len(reference), f"rank {j} took {len(mine)} rounds, rank 0 took {len(reference)}"
        for a, b in zip(mine, reference):
            assert np.array_equal(a.array, b.array)
            assert a.contributors == b.contributors and a.staleness == b.staleness
            assert a.initiator == b.initiator
    # Conservation: every post summed exactly once, nothing invented.
    summed = np.sum([r.array for r in reference], axis=0) if reference else np.zeros(total, np.int64)
    assert np.array_equal(summed, np.ones(total, dtype=np.int64)), "a contribution was lost or counted twice"
    # Facts match the data: contributors are exactly the owners of the summed indices.
    for res in reference:
        owners = sorted({owner[i][0] for i in np.flatnonzero(res.array)})
        assert owners == res.contributors, f"round {res.round}: contributors {res.contributors} vs data {owners}"
        for i in np.flatnonzero(res.array):
            rank, computed_for = owner[i]
            assert res.round >= computed_for, f"post computed for round {computed_for} summed in {res.round}"
        # Staleness bound.
        for rank, s in res.staleness.items():
            assert 0 <= s <= max(tau, 0) or mode.kind == "sync" and s == 0, \
                f"round {res.round}: rank {rank} staleness {s} > {tau}"
    # Each contribution's staleness: the oldest pending post of a rank defines it.
    for res in reference:
        for rank in res.contributors:
            oldest = min(owner[i][1] for i in np.flatnonzero(res.array) if owner[i][0] == rank)
            assert res.staleness[rank] == res.round - oldest
    # Quorum: a round made up before anyone flushed has at least k contributors.
    if getattr(mode, "quorum", None) is not None:
        # (parked ranks count out of the quorum: with them, a round has at least one holder)
        floor = 1 if parked else min(mode.quorum, P)
        for res in reference[1:getattr(world, "rounds_before_first_flush", None) or 0]:
            assert len(res.contributors) >= floor, \
                f"round {res.round}: {res.contributors} contributed, quorum {mode.quorum}"
    # Majority: initiators are the designated ones, identical on every rank.
    if mode.kind == "majority":
        for res in reference:
            if res.round > 0 and not res.flush:
                assert res.initiator == mode.initiator("stream", res.round, P)
    if mode.kind == "sync":
        for res in reference:
            if not res.flush:
                assert res.contributors == list(range(P))


modes = st.sampled_from(["sync", "solo", "majority", "majority_quorum"])


@planes
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_size=st.integers(1, 5), mode_name=modes, tau=st.integers(0, 3),
       posts=st.lists(st.integers(1, 6), min_size=5, max_size=5),
       speeds=st.lists(st.integers(1, 8), min_size=5, max_size=5),
       seed=st.integers(0, 2**32 - 1), mseed=st.integers(0, 3))
def test_random_schedules_conserve_and_agree(plane, world_size, mode_name, tau, posts, speeds, seed, mseed):
    if mode_name == "sync":
        mode = Sync()
        posts = [posts[0]] * 5  # sync: every rank posts every round
    elif mode_name == "solo":
        mode = Solo()
    elif mode_name == "majority":
        mode = Majority(seed=mseed)
    else:
        mode = Majority(seed=mseed, quorum=(world_size + 1) // 2)
    world, total, owner, _ = run_schedule(world_size, mode, tau, posts[:world_size], seed, speeds[:world_size],
                                          plane=plane)
    check_invariants(world, total, owner, tau, mode)
    for j, rank in enumerate(world.ranks):
        assert rank.waiter is None, f"rank {j} still waiting after the final flush"
        assert not rank.stream.pending, f"rank {j} kept pending data after the flush"
    assert world.results(0)[-1].flush


@planes
def test_solo_eagerness_is_checked_over_many_schedules(plane):
    checks = 0
    for seed in range(200):
        rng = random.Random(seed)
        P = rng.randint(2, 4)
        _, _, _, eager = run_schedule(P, Solo(), rng.randint(1, 3), [rng.randint(2, 6) for _ in range(P)], seed,
                                      [rng.randint(1, 8) for _ in range(P)], drain=True, plane=plane)
        checks += eager
    assert checks > 50  # the quiescent-wait check ran often enough to mean something


def test_held_back_paths_run_in_random_schedules():
    """The "decentral+held" plane is more than "decentral" under another name:
    over random schedules of near-equal speeds, floods are held back and
    dropped (solo, and majority's designated ranks), majority's other
    ranks join early, ranks that flush in balanced training join the round
    without the flush gather, and every invariant still holds."""
    counts = {"solo": [0, 0, 0, 0], "majority": [0, 0, 0, 0], "majority_quorum": [0, 0, 0, 0]}
    deferred_additions = notices = 0
    for seed in range(300):
        rng = random.Random(seed)
        P = rng.randint(2, 6)
        mode = [Solo(), Majority(seed=seed % 5), Majority(seed=seed % 5, quorum=rng.randint(2, P))][seed % 3]
        tau = rng.randint(1, 3)
        world, total, owner, _ = run_schedule(P, mode, tau, [rng.randint(3, 8) for _ in range(P)], seed,
                                              [rng.randint(6, 8) for _ in range(P)], plane="decentral+held")
        check_invariants(world, total, owner, tau, mode)
        for rank in world.ranks:
            machine = rank.driver.control.streams[0]
            tally = counts[mode.kind + ("_quorum" if getattr(mode, "quorum", None) else "")]
            deferred_additions += machine.stats.deferred_additions
            notices += machine.stats.quorum_notices
            tally[0] += machine.stats.floods_held
            tally[1] += machine.stats.floods_dropped
            tally[2] += machine.stats.joined_early
            tally[3] += machine.stats.joined_at_flush
    solo, majority, quorum = counts["solo"], counts["majority"], counts["majority_quorum"]
    assert solo[0] > 100 and solo[1] > 10 and solo[2] == 0 and solo[3] > 20, counts
    assert majority[0] > 50 and majority[1] > 10 and majority[2] > 50 and majority[3] > 20, counts
    assert quorum[0] > 50 and quorum[1] > 10 and quorum[2] > 50 and quorum[3] > 20, counts
    # balanced rounds whose delays ended first: the additions kept back, and quorums met by a notice
    assert deferred_additions > 20 and notices > 5, (deferred_additions, notices)


@pytest.mark.parametrize("plane", ["decentral", "decentral+held"])
def test_parked_ranks_in_random_schedules(plane):
    """Every rank waits once in a barrier after its own number of posts
    (as at an epoch's end), parked, and takes what completed meanwhile once
    every rank came: nothing hangs, every invariant holds, and a parked
    designated rank starts no round of its own (it tells the others)."""
    taken_after = {"solo": 0, "majority": 0, "majority_quorum": 0}
    notices = 0
    for seed in range(300):
        rng = random.Random(seed)
        P = rng.randint(2, 6)
        mode = [Solo(), Majority(seed=seed % 5), Majority(seed=seed % 5, quorum=rng.randint(1, P))][seed % 3]
        tau = rng.randint(1, 3)
        posts = [rng.randint(2, 8) for _ in range(P)]
        park_at = [rng.randint(0, n - 1) for n in posts]
        world, total, owner, _ = run_schedule(P, mode, tau, posts, seed, [rng.randint(1, 8) for _ in range(P)],
                                              plane=plane, park_at=park_at)
        check_invariants(world, total, owner, tau, mode, parked=True)
        assert all(world.left(j) or world.ranks[j].waiter is None for j in range(P))
        taken_after[mode.kind + ("_quorum" if getattr(mode, "quorum", None) else "")] += world.parked_takes
        notices += sum(1 for r in world.ranks for m in [r.driver.control.streams[0]]
                       if m.parking.notice >= 0)
    assert all(n > 100 for n in taken_after.values()), taken_after
    assert notices > 10, notices


@planes
def test_solo_fast_rank_does_not_wait_for_slow_one(plane):
    """Rank 1 never computes; rank 0 keeps going until it is tau rounds ahead."""
    layout = Layout.of([np.zeros(2)])
    tau = 3
    world = make_world(plane, 2, Solo(), tau, layout)
    world.post(0, [np.array([1.0, 0.0])])
    world.post(1, [np.array([0.0, 1.0])])
    world.run_communication()
    assert world.idle(0) and world.idle(1)
    for step in range(10):
        if not world.idle(0):
            break
        world.post(0, [np.array([1.0, 0.0])])
        world.run_communication()
    # rank 1 took round 0; rounds 1..tau may start without it (a gradient it
    # computes now, for round 1, is then reduced no later than round 1 + tau)
    assert rounds_started(world) == 1 + tau
    assert not world.idle(0)  # now rank 0 waits for the laggard
    world.post(1, [np.array([0.0, 1.0])])  # the laggard posts: it takes all rounds at once
    assert world.idle(1)
    assert [r.round for r in world.results(1)] == list(range(1 + tau))
    world.run_communication()
    assert world.idle(0)
    last = world.results(0)[-1]
    assert last.initiator == 1 and last.contributors == [0, 1]
    assert last.round == 1 + tau and last.staleness == {0: 0, 1: tau}


@planes
@pytest.mark.parametrize("P", [2, 3, 4])
def test_majority_waits_for_designated_initiator(plane, P):
    layout = Layout.of([np.zeros(1)])
    mode = Majority(seed=5)
    world = make_world(plane, P, mode, 8, layout)
    for j in range(P):
        world.post(j, [np.ones(1)])
    world.run_communication()
    designated = mode.initiator("stream", 1, P)
    others = [j for j in range(P) if j != designated]
    for j in others:
        world.post(j, [np.ones(1)])
    world.run_communication()
    assert all(not world.idle(j) for j in others)  # waiting for the designated rank
    world.post(designated, [np.ones(1)])
    world.run_communication()
    assert all(world.idle(j) for j in range(P))
    assert world.results(0)[-1].initiator == designated


@planes
def test_quorum_holds_round_until_k_ranks_have_data(plane):
    P = 4
    layout = Layout.of([np.zeros(1)])
    mode = Majority(seed=1, quorum=3)
    world = make_world(plane, P, mode, 8, layout)
    for j in range(P):
        world.post(j, [np.ones(1)])
    world.run_communication()
    designated = mode.initiator("stream", 1, P)
    others = [j for j in range(P) if j != designated]
    completed = len(world.results(designated))
    # (with held-back activation the designated rank joins at its post and floods once the quorum is met)
    for j in [designated, others[0]]:
        world.post(j, [np.ones(1)])
        world.run_communication()
        assert not world.idle(designated) and len(world.results(designated)) == completed
    world.post(others[1], [np.ones(1)])
    world.run_communication()
    assert all(world.idle(j) for j in range(P)) and len(world.results(designated)) == completed + 1
    assert world.results(designated)[-1].contributors == sorted([designated] + others[:2])


@planes
def test_pending_data_is_owned_once_the_post_returns(plane):
    """The caller may reuse its arrays after synchronize; data still pending
    must not change with them (views are copied, concatenations are not)."""
    mine = [np.ones(3, np.float32), np.ones(2, np.float32), np.ones(4, np.float64)]
    layout = Layout.of(mine)
    world = make_world(plane, 2, Solo(), 4, layout)
    for j in range(2):
        world.post(j, [a.copy() for a in mine])
    world.run_communication()
    world.post(0, [a.copy() for a in mine])
    world.run_communication()  # round 1: rank 0 only
    late = [a.copy() for a in mine]
    world.post(1, late)  # takes round 1 at once; its data stays pending
    assert world.idle(1) and world.ranks[1].stream.pending
    for a in late:
        a[:] = 999  # the caller reuses its arrays
    for j in range(2):
        world.flush(j)
    world.run_communication()
    flush_round = world.results(0)[-1]
    assert flush_round.flush and flush_round.contributors == [1]
    assert all(np.array_equal(b, np.ones_like(b)) for b in flush_round.buffers)


# -- flushes mid-stream, shutdowns and rank failures at arbitrary points -------------------------------

def run_lifecycle(world_size, mode, tau, posts_per_rank, seed, speeds, flushes=0, fail_after=None,
                  plane="central"):
    """A random schedule in which ranks flush between posts (``flushes`` times
    each: a sync stream's ranks at the same post counts, as it requires) and end
    with ``shutdown``; with ``fail_after``, one random rank dies after that many
    events. Returns the world, the number of posts and each post's owner."""
    rng = random.Random(seed)
    total = sum(posts_per_rank)
    layout = Layout.of([np.zeros(total, dtype=np.int64)])
    world = make_world(plane, world_size, mode, tau, layout)
    remaining = list(posts_per_rank)
    if mode.kind == "sync":
        common = list(range(1, posts_per_rank[0]))
        marks = sorted(rng.sample(common, min(flushes, len(common))))
        flush_at = [list(marks) for _ in range(world_size)]
    else:
        flush_at = [sorted(rng.randint(1, max(1, n)) for _ in range(flushes)) for n in posts_per_rank]
    posted = [0] * world_size
    shut = [False] * world_size
    index, owner, events = 0, {}, 0
    while True:
        if fail_after is not None and events == fail_after:
            world.fail(rng.randrange(world_size))
        choices = [("comm", e) for e in world.communication_events()]
        for j in range(world_size):
            rank = world.ranks[j]
            if not world.idle(j) or shut[j] or rank.failure is not None:
                continue
            if flush_at[j] and flush_at[j][0] <= posted[j] and rank.registered:
                choices.append(("flush", j))
            elif remaining[j] > 0:
                choices += [("post", j)] * speeds[j]
            elif rank.registered or all(r.stream is not None for r in world.ranks):
                choices.append(("shutdown", j))
        if not choices:
            break
        events += 1
        kind, what = rng.choice(choices)
        if kind == "comm":
            world.apply(what)
        elif kind == "post":
            one_hot = np.zeros(total, dtype=np.int64)
            one_hot[index] = 1
            owner[index] = (what, taken_count(world, what))
            index += 1
            remaining[what] -= 1
            posted[what] += 1
            world.post(what, [one_hot])
        elif kind == "flush":
            flush_at[what].pop(0)
            world.flush(what)
        else:
            shut[what] = True
            world.shutdown(what)
    return world, total, owner


def check_failed_world(world, total, owner, tau):
    """After a rank died: every rank stopped, with no call left waiting; what
    ranks took before is one sequence (each rank a prefix of it), every post
    in it summed at most once, and the facts and the bound hold."""
    P = world.world_size
    assert all(rank.failure is not None for rank in world.ranks), "a live rank never noticed the failure"
    assert all(world.idle(j) for j in range(P)), "a call still waits after the failure"
    longest = max((world.results(j) for j in range(P)), key=len)
    for j in range(P):
        mine = world.results(j)
        for a, b in zip(mine, longest):
            assert a.round == b.round and np.array_equal(a.array, b.array) and a.contributors == b.contributors
    summed = np.sum([r.array for r in longest], axis=0) if longest else np.zeros(total, np.int64)
    assert summed.max(initial=0) <= 1, "a contribution was counted twice"
    for res in longest:
        assert sorted({owner[i][0] for i in np.flatnonzero(res.array)}) == res.contributors
        assert all(0 <= s <= tau for s in res.staleness.values())


def make_mode(mode_name, world_size, mseed):
    return {"sync": Sync(), "solo": Solo(), "majority": Majority(seed=mseed),
            "majority_quorum": Majority(seed=mseed, quorum=(world_size + 1) // 2)}[mode_name]


@planes
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_size=st.integers(1, 5), mode_name=modes, tau=st.integers(0, 3),
       posts=st.lists(st.integers(1, 6), min_size=5, max_size=5),
       speeds=st.lists(st.integers(1, 8), min_size=5, max_size=5), flushes=st.integers(0, 2),
       seed=st.integers(0, 2**32 - 1), mseed=st.integers(0, 3))
def test_random_schedules_with_flushes_and_shutdown(plane, world_size, mode_name, tau, posts, speeds, flushes, seed,
                                                    mseed):
    mode = make_mode(mode_name, world_size, mseed)
    if mode.kind == "sync":
        posts = [posts[0]] * 5
    world, total, owner = run_lifecycle(world_size, mode, tau, posts[:world_size], seed, speeds[:world_size], flushes,
                                        plane=plane)
    check_invariants(world, total, owner, tau, mode)
    if plane.startswith("decentral") and mode.kind != "sync":
        # that plane may start a round nobody contributed to; it never answers a post alone
        for rank in world.ranks:
            assert all(any(r.contributors or r.flush for r in answer) for answer in rank.answers)
    for j in range(world_size):
        assert world.left(j), f"rank {j} did not finish its shutdown"
        assert not world.ranks[j].errors
        assert not world.ranks[j].stream.pending, f"rank {j} kept pending data after shutdown"
    flush_rounds = sum(r.flush for r in world.results(0))
    assert flush_rounds >= 1 + (flushes if mode.kind == "sync" and posts[0] > flushes else 0)


@planes
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world_size=st.integers(2, 5), mode_name=modes, tau=st.integers(0, 3),
       posts=st.lists(st.integers(1, 6), min_size=5, max_size=5),
       speeds=st.lists(st.integers(1, 8), min_size=5, max_size=5), flushes=st.integers(0, 1),
       fail_after=st.integers(0, 80), seed=st.integers(0, 2**32 - 1), mseed=st.integers(0, 3))
def test_random_schedules_with_a_rank_failure(plane, world_size, mode_name, tau, posts, speeds, flushes, fail_after,
                                              seed, mseed):
    mode = make_mode(mode_name, world_size, mseed)
    if mode.kind == "sync":
        posts = [posts[0]] * 5
    world, total, owner = run_lifecycle(world_size, mode, tau, posts[:world_size], seed, speeds[:world_size],
                                        flushes, fail_after=fail_after, plane=plane)
    if not any(world.dead):  # the schedule ended before the failure point: it must be complete
        check_invariants(world, total, owner, tau, mode)
        assert all(world.left(j) for j in range(world_size))
        return
    check_failed_world(world, total, owner, tau)
