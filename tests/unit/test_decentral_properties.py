"""The coordinator-free control plane over more than a thousand random
schedules in an event-driven world (hvd_partial.sim.decentral_world):
sizes 1 to 64 (most not powers of two), solo and majority with and without
a quorum, small staleness bounds with several laggards, flushes at any
point, ranks parked in a barrier at random points (each rank after its own
number of posts, as at an epoch's end), and ranks that die or are stopped
at any point.

Each post is a distinct id, so conservation is exact: every id must be
summed into exactly one round. Every guarantee is checked on the world's
record, and the per-round message counts against ceil(log2 P).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hvd_partial.core.activation import max_hops
from hvd_partial.core.decentral import QUORUM_SLOTS
from hvd_partial.core.decentral.facts import FLUSHING, KNOWN_TAKEN, STALENESS
from hvd_partial.errors import RankFailedError
from hvd_partial.modes import designated_initiator
from hvd_partial.sim.decentral_world import DecentralWorld, Fault

HEARTBEAT, TIMEOUT, TICK, DELAY = 1.0, 6.0, 0.25, 0.05
SCHEDULES_PER_GROUP = 300  # four groups of random schedules: 1,200 in all, plus the scripted ones


def random_schedule(seed: int, kind: str, quorum: bool = False) -> dict:
    rng = random.Random(seed)
    band = rng.random()
    P = rng.randint(1, 12) if band < 0.5 else rng.randint(13, 40) if band < 0.85 else rng.randint(41, 64)
    tau = rng.choice([0, 1, 1, 1, 2, 2, 3, 5])
    base = [rng.uniform(0.01, 0.1) for _ in range(P)]
    n_slow = min(P, rng.choice([0, 1, 2, 2, 3, max(1, P // 4)]))
    for j in rng.sample(range(P), n_slow):
        base[j] *= rng.uniform(5, 30)
    step_rng = random.Random(seed + 1)
    posts = [rng.randint(1, 5) for _ in range(P)]
    # half the schedules: every rank waits once in a barrier, parked, after at least one post (not with
    # tau = 0, which is synchronous: as under Horovod, every rank must post as often before the barrier)
    park_at = [rng.randint(0, n - 1) for n in posts] if rng.random() < 0.5 and tau > 0 else None
    return dict(world_size=P, kind=kind, max_staleness=tau, posts=posts,
                seed=seed, quorum=rng.randint(1, P) if quorum else None, majority_seed=rng.randint(0, 3),
                compute=lambda j, step: base[j] * step_rng.uniform(0.5, 1.5), delay_s=DELAY, park_at=park_at)


def check_counts(world: DecentralWorld, stats: dict):
    """Per round: activation at most ceil(log2 P) sent and received by each
    rank; gather reports at most one sent per gather and ceil(log2 P)
    received; quorum notices (QuorumMet) received only by the designated
    initiator, at most one per round."""
    P = world.P
    H = max_hops(P)
    for r, per_kind in world.counts.items():
        for name, (sent, recv) in per_kind.items():
            if name in ("Activate", "DesignatedParked", "Registered"):  # (hypercube floods)
                assert sent.max() <= H and recv.max() <= H, f"P={P} round {r}: {name} {sent.max()}/{recv.max()}"
            elif name.startswith(("Gathered", "AgreementReport")):  # (binomial gathers)
                assert sent.max() <= 1 and recv.max() <= H, f"P={P} round {r}: {name} {sent.max()}/{recv.max()}"
            elif name == "QuorumMet":
                designated = designated_initiator(world.streams[0].seed, "stream", r, P)
                assert recv.sum() == recv[designated], f"round {r}: quorum notices away from the designated rank"
                assert sent.sum() <= 1, f"P={P} round {r}: {sent.sum()} quorum notices"
                stats["quorum_notices"] = stats.get("quorum_notices", 0) + int(sent.sum())
            else:  # pragma: no cover
                raise AssertionError(name)
            key = name.split(":")[0]
            stats.setdefault(key, [0, 0])
            stats[key][0] = max(stats[key][0], int(max(sent.max(), recv.max())))
            stats[key][1] = max(stats[key][1], H)


def watch_quorum_counters(world: DecentralWorld) -> dict:
    """Record which round each addition to a quorum counter was for, and
    check at every zeroing that the slot holds additions for rounds its rank
    has joined only, and at every addition that its round's counter was not
    zeroed yet: zeroing too early would lose an addition (the quorum would
    then be met late, or at a flush, which the other checks cannot see)."""
    counters, streams = world.quorum_counters, world.streams
    rounds_in: dict = {}  # (owner, slot) -> rounds of the additions since its last zeroing
    zeroed_up_to: dict = {}  # (owner, slot) -> the round whose counter its last zeroing ended
    seen = {"additions": 0, "zeroings": 0, "deferred": 0}

    def added(rank, owner):
        stream = streams[rank]
        if stream.held is not None:
            held_round = stream.held.view.round
        else:  # a balanced round's addition, kept back to the end of the activation delay
            held_round = stream.tally.deferred_round
            seen["deferred"] += 1
        slot = (owner, held_round % QUORUM_SLOTS)
        assert zeroed_up_to.get(slot, -1) < held_round, \
            f"rank {rank} added for round {held_round} to a counter zeroed after it, at rank {owner}"
        rounds_in.setdefault(slot, set()).add(held_round)
        seen["additions"] += 1

    def cleared(rank, slot):
        joined = streams[rank].last_joined
        found = rounds_in.pop((rank, slot), set())
        # an addition for a round that the slot's rank has not joined yet is still needed there
        assert all(r <= joined for r in found), f"rank {rank} (joined {joined}) zeroed additions for {found}"
        zeroed_up_to[(rank, slot)] = joined - 2
        seen["zeroings"] += 1

    counters.on_add = added
    original_for_rank = counters.for_rank

    def for_rank(rank):
        make = original_for_rank(rank)

        def view(index):
            inner = make(index)

            class Checked:
                add = staticmethod(inner.add)

                @staticmethod
                def clear(slot):
                    cleared(rank, slot)
                    inner.clear(slot)
            return Checked()
        return view

    for stream in streams:
        if stream.quorum is not None:
            stream.tally.counters = for_rank(stream.rank)(0)
    return seen


def check_eagerness(world: DecentralWorld):
    """Solo, whenever nothing is in flight: a post may wait only because the
    exact staleness rule holds the next round back (some training rank has
    taken fewer than c - tau + 1 rounds and holds no data for round c)."""
    streams = world.streams
    waiting = [s for s in streams if s.data.waiter is not None and s.data.waiter.kind == "post"]
    if not waiting or not all(world.alive):
        return
    c = streams[0].completed
    assert all(s.completed == c and s.activation.latest == c - 1 for s in streams)
    if c == 0:  # registration: round 0 waits for every rank's first post
        laggards = [s.rank for s in streams if s.data.seq == 0]
    else:
        laggards = [s.rank for s in streams
                    if not s.flushing and not s.parking.parked and s.data.taken < c - s.tau + 1 and not s.data.pending]
    assert laggards, f"round {c}: ranks {[s.rank for s in waiting]} wait with nothing in flight and no laggard"
    world.eager_checks = getattr(world, "eager_checks", 0) + 1


def check_consistency(world: DecentralWorld, ranks) -> list:
    """Every rank took the same rounds, in order, with identical results
    (ranks that failed took a prefix). Returns the longest list."""
    lists = [world.taken[j] for j in ranks]
    longest = max(lists, key=len) if lists else []
    assert [r.round for r in longest] == list(range(len(longest)))
    for j, mine in zip(ranks, lists):
        for a, b in zip(mine, longest):
            assert (a.round, a.array, a.contributors, a.staleness, a.initiator, a.flush) == \
                   (b.round, b.array, b.contributors, b.staleness, b.initiator, b.flush), f"rank {j} round {a.round}"
    return longest


def check_guarantees(world: DecentralWorld, spec: dict):
    P, tau, kind = world.P, spec["max_staleness"], spec["kind"]
    for j in range(P):
        assert world.done[j], (f"deadlock: rank {j} never finished (waiter {world.ledgers[j].waiter}, "
                               f"completed {world.streams[j].completed}, heard {world.streams[j].activation.latest})")
    rounds = check_consistency(world, range(P))
    # Conservation: every post summed into exactly one round.
    summed = [p for res in rounds for p in res.array]
    assert sorted(summed) == list(range(len(world.posted))), "a post was lost or counted twice"
    # Flush: the last round is the flush round, and nothing is left pending.
    assert rounds[-1].flush and all(not ledger.pending for ledger in world.ledgers)
    assert all(not s.early for s in world.streams), "notices kept for rounds that started"
    for res in rounds:
        owners = sorted({world.posted[p][0] for p in res.array})
        assert owners == res.contributors, f"round {res.round}: facts {res.contributors} vs data {owners}"
        for j in res.contributors:
            oldest = min(world.posted[p][1] for p in res.array if world.posted[p][0] == j)
            assert res.staleness[j] == res.round - oldest
            # The staleness bound, exactly (the flush round sums what is left).
            assert 0 <= res.staleness[j] <= tau, f"round {res.round}: rank {j} staleness {res.staleness[j]} > {tau}"
        if kind == "majority" and res.round > 0 and not res.flush:
            assert res.initiator == designated_initiator(spec["majority_seed"], "stream", res.round, P)
            k = spec["quorum"]
            if k is not None:
                assert len(res.contributors) >= min(k, world.start_training[res.round]), \
                    f"round {res.round}: {len(res.contributors)} contributors < quorum {k}"
    return rounds


@pytest.mark.parametrize("kind,quorum", [("solo", False), ("majority", False), ("majority", True)])
def test_random_schedules_keep_every_guarantee(kind, quorum):
    stats: dict = {}
    sizes = set()
    held_rounds = 0
    eager_checks = 0
    parked_schedules = parked_takes = 0
    for n in range(SCHEDULES_PER_GROUP):
        spec = random_schedule(10_000 * (1 + quorum) + 1_000 * (kind == "majority") + n, kind, quorum)
        world = DecentralWorld(**spec)
        seen = watch_quorum_counters(world)
        if kind == "solo":
            world.on_quiet = check_eagerness
        world.run()
        check_guarantees(world, spec)
        check_counts(world, stats)
        parked_schedules += spec["park_at"] is not None
        parked_takes += world.parked_takes
        stats["quorum_zeroings"] = stats.get("quorum_zeroings", 0) + seen["zeroings"]
        sizes.add(world.P)
        eager_checks += getattr(world, "eager_checks", 0)
        held_rounds += sum(int((recv > 0).sum() > 0) for per_kind in world.counts.values()
                                  for name, (_, recv) in per_kind.items() if name == "Gathered:stale")
    print(f"\n{kind}{' quorum' if quorum else ''}: {SCHEDULES_PER_GROUP} schedules, sizes {min(sizes)}..{max(sizes)}; "
          f"max per rank per round vs ceil(log2 P): " +
          ", ".join(f"{k} {v[0]} (<= {v[1]})" for k, v in stats.items() if isinstance(v, list) and k != "QuorumMet") +
          (f"; quorum notices {stats['quorum_notices']} (<= 1 per round), counter zeroings checked "
           f"{stats['quorum_zeroings']}" if "quorum_notices" in stats else "") +
          f"; rounds held for laggards {held_rounds}; solo eagerness checks {eager_checks}; "
          f"schedules with a barrier {parked_schedules}, rounds taken leaving it {parked_takes}")
    assert parked_schedules > 100 and parked_takes > 100  # ranks were parked while others took rounds
    assert len([P for P in sizes if P & (P - 1)]) > 30  # most sizes are not powers of two
    assert held_rounds > 50  # the staleness gather ran often enough to mean something
    if quorum:
        assert stats.get("quorum_notices", 0) > 100  # quorums met by a notice, not only at D's own post
        assert stats["quorum_zeroings"] > 1000
    if kind == "solo":
        assert eager_checks > 1000  # quiet moments with a waiting post, checked for eagerness


def test_two_laggards_with_tau_1_at_p_3_do_not_stall():
    """P=3, tau=1, ranks 1 and 2 far slower than rank 0: both catch up while
    each still sees the other as lagging; their staleness gather lets the
    root start the held round."""
    held = 0
    for seed in range(60):
        slow = {0: 0.01, 1: 0.5, 2: 0.6}
        rng = random.Random(seed)
        spec = dict(world_size=3, kind="solo", max_staleness=1, posts=[8, 4, 4], seed=seed,
                    compute=lambda j, s: slow[j] * rng.uniform(0.5, 1.5), delay_s=DELAY, majority_seed=0,
                    quorum=None)
        world = DecentralWorld(**spec).run()
        check_guarantees(world, spec)
        for r, per_kind in world.counts.items():
            if "Gathered:stale" in per_kind:
                facts = world.round_facts[r - 1]
                laggards = [j for j in (1, 2) if facts[KNOWN_TAKEN, j] < r]  # known taken < r - tau + 1
                if len(laggards) == 2:
                    held += 1
    assert held > 10, "the two-laggard case did not come up"


def test_majority_flushing_designated_initiator_learns_of_data():
    """Majority without a quorum: the designated initiators flush early while
    others still post; rounds go on (the flushing initiator is told that
    others hold data) and the flush ends with everything summed."""
    for seed in range(40):
        rng = random.Random(seed)
        P = rng.randint(2, 12)
        posts = [1 if j % 2 else rng.randint(4, 8) for j in range(P)]  # odd ranks flush early
        spec = dict(world_size=P, kind="majority", max_staleness=2, posts=posts, seed=seed, quorum=None,
                    majority_seed=seed % 4, compute=lambda j, s: rng.uniform(0.01, 0.05), delay_s=DELAY)
        world = DecentralWorld(**spec).run()
        check_guarantees(world, spec)


@pytest.mark.parametrize("kind", ["solo", "majority"])
def test_a_flush_in_the_middle_of_training_is_one_round_for_all(kind):
    """Every rank flushes once after a random number of its posts, then goes
    on posting: the flush is one round on every rank, it sums every pending
    post, and training resumes after it with every guarantee."""
    flushes = 0
    for n in range(60):
        seed = 70_000 + n
        spec = random_schedule(seed, kind, quorum=kind == "majority" and n % 2 == 0)
        spec["park_at"] = None  # (a rank in a barrier while another flushes waits for it: a script's own deadlock)
        rng = random.Random(seed)
        flush_after = [rng.randint(0, posts - 1) for posts in spec["posts"]]  # posts left at the flush
        world = DecentralWorld(**spec, flush_after=flush_after).run()
        rounds = check_guarantees(world, spec)
        middle = [res for res in rounds[:-1] if res.flush]
        assert len(middle) == 1, f"{len(middle)} flush rounds before the last"
        # the middle flush summed every post made before it on every rank
        before = {p for res in rounds[:middle[0].round + 1] for p in res.array}
        for j in range(world.P):
            made = [p for p, (rank, _) in world.posted.items() if rank == j]
            assert set(made[:spec["posts"][j] - flush_after[j]]) <= before
        flushes += 1
    assert flushes == 60


def test_a_column_from_a_finished_flush_is_not_a_new_flush():
    """A rank can join the round after a flush round before it completed the
    flush round: its column still says flushing. Majority, fast compute, slow
    messages, some ranks flushing twice in a row and others posting between
    their flushes: the designated initiator that flushes again at once starts
    the next round while others are still in the finished flush. Only a round
    that every rank joined in the same flush is a flush round."""
    stale_columns = 0
    for n in range(400):
        rng = random.Random(n)
        P = rng.randint(2, 5)
        spec = dict(world_size=P, kind="majority", max_staleness=2, posts=[3] * P, seed=n, quorum=None,
                    majority_seed=rng.randint(0, 3), compute=lambda j, s: rng.uniform(0.0005, 0.002), delay_s=0.05)
        world = DecentralWorld(**spec, flush_after=[rng.choice([0, 2]) for _ in range(P)]).run()
        rounds = check_guarantees(world, spec)
        for res in rounds:
            facts = world.round_facts[res.round]
            epochs = set(facts[FLUSHING].tolist()) - {0}
            stale_columns += len(epochs) > 1
    assert stale_columns > 20, "columns from a finished flush did not come up"


def random_fault(rng: random.Random, P: int, horizon: float) -> tuple[Fault, str]:
    victim = rng.randrange(P)
    when = rng.uniform(0, horizon)
    what = rng.choice(["die", "die", "stop_short", "stop_long"])
    if what == "die":
        return Fault(when, victim), what
    if what == "stop_short":
        return Fault(when, victim, rng.uniform(0.1, TIMEOUT / 3)), what
    return Fault(when, victim, rng.uniform(2 * TIMEOUT, 3 * TIMEOUT)), what


def test_failures_at_any_point_are_named_on_every_rank_within_the_bound():
    """A rank dies or is stopped at a random moment: every other rank fails
    with an error naming it within failure_timeout + tick + (1 + ceil(log2 P))
    message delays (counted from the watcher's first tick if it died before
    that), and no healthy rank is ever named; a rank that was stopped and
    resumed names only itself. A short stop fails nobody and the schedule
    completes with every guarantee."""
    outcomes = {"die": 0, "stop_short": 0, "stop_long": 0}
    ring_stats = []
    for n in range(SCHEDULES_PER_GROUP):
        seed = 50_000 + n
        rng = random.Random(seed)
        kind = rng.choice(["solo", "majority"])
        spec = random_schedule(seed, kind, quorum=kind == "majority" and rng.random() < 0.5)
        spec["park_at"] = None  # (the world's barrier does not fail when a rank dies, as a collective does)
        P = spec["world_size"]
        fault, what = random_fault(rng, P, horizon=rng.choice([0.5, 2.0, 6.0]))
        if P == 1 and what != "stop_short":
            continue  # nobody to name it
        world = DecentralWorld(**spec, liveness=True, heartbeat_s=HEARTBEAT, failure_timeout_s=TIMEOUT,
                               tick_s=TICK, faults=(fault,), time_limit_s=4 * TIMEOUT,
                               run_until_s=fault.time + (fault.stop_s or 0) + 4 * TIMEOUT).run()
        outcomes[what] += 1
        # named by the watcher within a timeout and a tick of the last heartbeat (or of its own first
        # tick), then flooded: ceil(log2 P) message delays
        named_by = max(fault.time + DELAY, TICK) + TIMEOUT + TICK + max_hops(P) * DELAY
        f = fault.rank
        if what == "stop_short":
            assert all(named is None for named in world.named), f"a short stop named {world.named}"
            check_guarantees(world, spec)
        else:
            for j in range(P):
                if j == f:
                    continue
                assert world.named[j] is not None, f"P={P} {what}: rank {j} never learned that rank {f} failed"
                named, at = world.named[j]
                assert named == f, f"rank {j} named healthy rank {named} (rank {f} {what})"
                assert at <= named_by + 1e-9, f"rank {j} named rank {f} {at - fault.time:.2f} s late"
                assert world.done[j] or isinstance(world.errors[j], RankFailedError) and world.errors[j].rank == f
            if what == "stop_long":
                assert world.named[f] is None or world.named[f][0] == f, f"resumed rank blamed {world.named[f]}"
            check_consistency(world, [j for j in range(P) if j != f])
        check_counts(world, {})
        duration = max(world.now, 1e-9)
        ring_stats.append(world.heartbeats_sent / (P * duration / HEARTBEAT) if P > 1 else 0.0)
        for j in range(P):  # O(1) heartbeats per rank per period; O(log P) notices per rank per failure
            assert world.heartbeats_received[j] <= duration / HEARTBEAT + 2, (j, world.heartbeats_received[j])
            assert world.notices_sent[j] <= 2 * max_hops(P) + 2, (j, world.notices_sent[j])
            assert world.notices_received[j] <= 2 * max_hops(P) + 2, (j, world.notices_received[j])
        if what != "stop_short":
            assert sum(world.notices_sent) > 0
    print(f"\nfaults: {outcomes}; heartbeats per rank per period, max {max(ring_stats):.2f}")
    assert min(outcomes.values()) > 40
