"""Held-back activation (the engine's ``activation_delay_us``) of solo and
majority rounds, on the loopback world: in balanced training no activation is
sent at all (with a quorum, no notice and no addition to its counter either),
and a rank that does not post is still reached once the delay ends."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_partial.core.activation import Activation, hypercube_distance
from hvd_partial.core.control import StreamMessage
from hvd_partial.core.decentral import Activate, QuorumMet, ReleaseActivation
from hvd_partial.core.fusion import Layout
from hvd_partial.modes import Majority, Solo, Sum
from hvd_partial.sim.loopback import LoopbackWorld


def world_of(P, mode=None, held=True):
    layout = Layout.of([np.zeros(4, dtype=np.int64)])
    return LoopbackWorld(P, mode or Solo(), Sum, 4, layout, control_plane="decentral", defer_activations=held)


def delivers(world, event, kind) -> bool:
    """Whether ``event`` delivers a stream message of type ``kind``."""
    if event[0] != "deliver":
        return False
    src, dest = event[1], event[2]
    queue = world.inbound[dest][(src, event[3] if len(event) > 3 else 0)]
    message = queue[0]
    return isinstance(message, StreamMessage) and isinstance(message.message, kind)


def is_release(world, event) -> bool:
    return delivers(world, event, ReleaseActivation)


def run_without_releases(world):
    """Deliver every event but the ends of activation delays (the delay is long)."""
    while True:
        events = [e for e in world.communication_events() if not is_release(world, e)]
        if not events:
            return
        world.apply(events[0])


def count_activations(world) -> list:
    """Wrap every rank's send: the list fills with (source, dest, round) per activation sent."""
    sent = []
    for rank in world.ranks:
        original = rank.send

        def send(dest, message, original=original, source=rank.rank):
            if isinstance(message, StreamMessage) and isinstance(message.message, Activate):
                sent.append((source, dest, message.message.round))
            original(dest, message)

        rank.send = send
    return sent


def post_all(world, P, value, ranks=None):
    for j in (range(P) if ranks is None else ranks):
        world.post(j, [np.full(4, value, dtype=np.int64)])


def machine(world, j):
    return world.ranks[j].driver.control.streams[0]


@pytest.mark.parametrize("P", [2, 3, 4, 7, 8])
def test_balanced_rounds_send_no_activation(P):
    world = world_of(P)
    post_all(world, P, 1)  # registration
    world.run_communication()
    post_all(world, P, 1)  # round 1: the last round before it (registration) had everyone
    world.run_communication()
    sent = count_activations(world)
    for step in range(5):
        post_all(world, P, step + 2)
        run_without_releases(world)
        assert all(world.idle(j) for j in range(P)), f"step {step}: a post is still waiting"
    world.run_communication()  # the releases come after their rounds completed: nothing to send
    assert sent == []
    for j in range(P):
        assert machine(world, j).stats.floods_dropped >= 5
        assert not machine(world, j).held.flush_made  # nobody flushed: no flush gather was built
        sums = [int(r.array[0]) for r in world.results(j)]
        assert sums[-5:] == [P * (s + 2) for s in range(5)]


@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("late", [0, -1])
def test_a_rank_that_does_not_post_is_reached_when_the_delay_ends(P, late):
    world = world_of(P)
    post_all(world, P, 1)
    world.run_communication()
    post_all(world, P, 1)
    world.run_communication()
    late = late % P
    sent = count_activations(world)
    posting = [j for j in range(P) if j != late]
    post_all(world, P, 5, posting)
    run_without_releases(world)
    # without the delay's end the round cannot complete: the late rank never joined
    assert not any(world.idle(j) for j in posting)
    assert sent == []
    world.run_communication()  # the delays end: the held floods go out
    assert all(world.idle(j) for j in posting)
    assert any(dest == late for _, dest, _ in sent)
    for j in posting:
        assert int(world.results(j)[-1].array[0]) == 5 * (P - 1)
        assert late not in world.results(j)[-1].contributors
    # the next round follows a round that lacked a rank: its flood is not held back
    before = machine(world, posting[0]).stats.floods_held
    post_all(world, P, 1, posting)
    run_without_releases(world)
    assert all(world.idle(j) for j in posting)
    assert machine(world, posting[0]).stats.floods_held == before


def test_an_activation_that_arrives_releases_a_held_flood_at_once():
    P = 4
    world = world_of(P)
    post_all(world, P, 1)
    world.run_communication()
    post_all(world, P, 1)
    world.run_communication()
    sent = count_activations(world)
    post_all(world, P, 2, [0, 1])  # ranks 0 and 1 hold their floods back
    assert machine(world, 0).floods.held_back == machine(world, 1).floods.held_back == 2
    # rank 0's delay ends: it floods to 1 and 2; rank 1, hearing it, floods on to 3 at once
    world.apply(next(e for e in world.communication_events() if e[:3] == ("deliver", 0, 0) and is_release(world, e)))
    assert sorted(d for s, d, _ in sent if s == 0) == [1, 2]
    world.apply(("deliver", 0, 1))
    assert sorted(d for s, d, _ in sent if s == 1) == [3]  # not back to 0, which it heard from
    assert machine(world, 1).floods.held_back is None
    run_without_releases(world)
    assert world.idle(0) and world.idle(1)
    assert len(sent) <= 2 * P


def test_still_to_tell_skips_neighbours_heard_from():
    a = Activation(rank=0, world_size=8)
    assert a.start(0) == [1, 2, 4]
    assert a.receive(0, 2) == []  # a duplicate: rank 2 knows the round
    assert a.still_to_tell(0) == [1, 4]
    assert a.still_to_tell(1) == []  # not the latest round


def test_without_an_activation_delay_nothing_is_held_back():
    P = 4
    for mode in (Solo(), Majority(seed=3), Majority(seed=3, quorum=3)):
        world = world_of(P, mode, held=False)
        for value in (1, 1, 2, 3):
            post_all(world, P, value)
            world.run_communication()
        assert all(machine(world, j).stats.floods_held == 0 for j in range(P))
        assert all(machine(world, j).stats.joined_early == 0 for j in range(P))


def balanced_majority_world(P, seed=3, quorum=None):
    mode = Majority(seed=seed, quorum=None if quorum is None else (P + 1) // 2)
    world = world_of(P, mode)
    post_all(world, P, 1)  # registration
    world.run_communication()
    post_all(world, P, 1)  # round 1: the last round before it (registration) had everyone
    world.run_communication()
    return world, mode


QUORUM = pytest.mark.parametrize("quorum", [None, "half"])


@QUORUM
@pytest.mark.parametrize("P", [2, 3, 4, 7, 8])
def test_balanced_majority_rounds_send_no_activation(P, quorum):
    world, mode = balanced_majority_world(P, quorum=quorum)
    sent = count_messages(world)
    additions = sum(machine(world, j).stats.quorum_additions for j in range(P))
    for step in range(5):
        post_all(world, P, step + 2)
        run_without_releases(world)
        assert all(world.idle(j) for j in range(P)), f"step {step}: a post is still waiting"
    world.run_communication()
    assert sent == []  # no activation, and with a quorum no notice
    assert sum(machine(world, j).stats.quorum_additions for j in range(P)) == additions
    for j in range(P):
        results = world.results(j)[-5:]
        assert [int(r.array[0]) for r in results] == [P * (s + 2) for s in range(5)]
        assert all(r.initiator == mode.initiator("stream", r.round, P) for r in results)
        assert all(r.contributors == list(range(P)) for r in results)
    # each round: its designated rank held its flood back and dropped it, every other rank joined early
    assert sum(machine(world, j).stats.floods_dropped for j in range(P)) >= 5
    assert sum(machine(world, j).stats.joined_early for j in range(P)) >= 5 * (P - 1)
    assert all(machine(world, j).floods.awaiting_start is None for j in range(P))


@QUORUM
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_early_joiners_wait_for_the_designated_rank(P, quorum):
    world, mode = balanced_majority_world(P, quorum=quorum)
    sent = count_activations(world)
    c = machine(world, 0).completed
    d = mode.initiator("stream", c, P)
    others = [j for j in range(P) if j != d]
    post_all(world, P, 2, others)
    world.run_communication()
    # joined, yet the round cannot complete without the designated rank's post
    assert not any(world.idle(j) for j in others)
    assert all(machine(world, j).floods.awaiting_start == c for j in others)
    post_all(world, P, 3, [d])
    run_without_releases(world)
    assert all(world.idle(j) for j in range(P))
    assert sent == []
    res = world.results(0)[-1]
    assert (res.round, res.initiator, res.contributors) == (c, d, list(range(P)))
    assert int(res.array[0]) == 2 * (P - 1) + 3
    assert all(machine(world, j).floods.awaiting_start is None for j in range(P))


@QUORUM
@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_majority_rank_that_does_not_post_is_reached_through_early_joiners(P, quorum):
    world, mode = balanced_majority_world(P, quorum=quorum)
    c = machine(world, 0).completed
    d = mode.initiator("stream", c, P)
    others = [j for j in range(P) if j != d]
    late = max(others, key=lambda j: hypercube_distance(j, d))  # the flood must pass early joiners
    posting = [j for j in range(P) if j != late]
    sent = count_activations(world)
    post_all(world, P, 5, posting)
    run_without_releases(world)
    assert not any(world.idle(j) for j in posting)
    assert sent == []
    world.run_communication()  # the designated rank's delay ends: its flood reaches the late rank
    assert all(world.idle(j) for j in posting)
    assert any(dest == late for _, dest, _ in sent)
    for j in posting:
        res = world.results(j)[-1]
        assert int(res.array[0]) == 5 * (P - 1) and late not in res.contributors and res.initiator == d
    # no rank sent the round to more neighbours than it has
    for j in range(P):
        assert len([1 for s, _, r in sent if s == j and r == c]) <= len(machine(world, j).activation.neighbours)


def count_messages(world) -> list:
    """Wrap every rank's send: the list fills with every stream message sent to
    another rank (not the host timer's ends of activation delays)."""
    sent = []
    for rank in world.ranks:
        original = rank.send

        def send(dest, message, original=original, source=rank.rank):
            if isinstance(message, StreamMessage) and dest != source:
                sent.append(message.message)
            original(dest, message)

        rank.send = send
    return sent


def balanced_world(P, mode):
    world = world_of(P, mode)
    for value in (1, 1, 2):  # registration, then rounds that every rank joined
        post_all(world, P, value)
        world.run_communication()
    return world


@pytest.mark.parametrize("mode", [Solo(), Majority(seed=3), Majority(seed=3, quorum=2)],
                         ids=["solo", "majority", "majority_quorum"])
@pytest.mark.parametrize("P", [2, 3, 4, 7, 8])
def test_a_balanced_flush_is_one_round_and_sends_nothing(P, mode):
    world = balanced_world(P, mode)
    sent = count_messages(world)
    c = machine(world, 0).completed
    for j in range(P):
        world.flush(j)
    run_without_releases(world)
    assert all(world.idle(j) for j in range(P)), "a flush still waits"
    world.run_communication()
    # no gather, no activation (with a quorum, the one notice that nobody trains any more, at most)
    assert [m for m in sent if type(m) is not QuorumMet] == [] and len(sent) <= 1
    sent.clear()
    for j in range(P):
        last = world.results(j)[-1]
        assert (last.round, last.flush, last.contributors) == (c, True, [])
        assert machine(world, j).completed == c + 1
    # training goes on after the flush round, still balanced: every rank trains again at once
    post_all(world, P, 4)
    run_without_releases(world)
    assert all(world.idle(j) for j in range(P))
    assert [int(world.results(j)[-1].array[0]) for j in range(P)] == [4 * P] * P
    world.run_communication()
    assert [m for m in sent if type(m) is not QuorumMet] == [] and len(sent) <= 1


@pytest.mark.parametrize("mode", [Solo(), Majority(seed=3), Majority(seed=3, quorum=2)],
                         ids=["solo", "majority", "majority_quorum"])
@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("trainer", [0, -1])
def test_a_rank_still_training_at_a_balanced_flush_loses_nothing(P, mode, trainer):
    world = balanced_world(P, mode)
    trainer %= P
    flushers = [j for j in range(P) if j != trainer]
    c = machine(world, 0).completed
    for j in flushers:
        world.flush(j)
    world.run_communication()  # delays end: any held flood reaches the trainer, which joins with nothing
    assert not any(world.idle(j) for j in flushers)
    world.post(trainer, [np.full(4, 7, dtype=np.int64)])
    world.run_communication()
    world.flush(trainer)
    world.run_communication()
    assert all(world.idle(j) for j in range(P))
    results = [world.results(j) for j in range(P)]
    for j in range(P):  # every rank took the same rounds
        assert [(r.round, r.flush, r.contributors, int(r.array[0])) for r in results[j]] == \
               [(r.round, r.flush, r.contributors, int(r.array[0])) for r in results[0]]
    since = [r for r in results[0] if r.round >= c]
    assert since[-1].flush and not any(r.flush for r in since[:-1])
    assert sum(int(r.array[0]) for r in since) == 7  # the trainer's post, exactly once
    assert len(since) <= 3  # at most one round with nobody's data besides the trainer's and the flush round


@pytest.mark.parametrize("mode", [Solo(), Majority(seed=3), Majority(seed=3, quorum=2)],
                         ids=["solo", "majority", "majority_quorum"])
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_a_delay_that_ends_after_everyone_joined_drops_the_flood_before_the_round_completes(P, mode):
    """The host tells the end of a delay whether every rank joined (the engine
    learns it from the round's facts, reduced before the data)."""
    world = balanced_world(P, mode)
    sent = count_messages(world)
    post_all(world, P, 3)  # in balanced training every post joins its round at once
    releases = [e for e in world.communication_events() if is_release(world, e)]
    assert releases and not any(world.idle(j) for j in range(P))
    # every solo rank, or majority's designated rank, holds its flood back; with a quorum, majority's
    # early joiners hold their additions back
    starters = [e for e in releases if machine(world, e[2]).floods.awaiting_start is None]
    solo, quorum = isinstance(mode, Solo), getattr(mode, "quorum", None)
    assert len(starters) == (P if solo else 1) and len(releases) == (P if solo or quorum else 1)
    dropped = sum(machine(world, j).stats.floods_dropped for j in range(P))
    for event in releases:
        world.apply(event)
    assert sent == []
    assert sum(machine(world, j).stats.floods_dropped for j in range(P)) == dropped + len(starters)
    assert not any(world.idle(j) for j in range(P))  # no round completed yet
    world.run_communication()
    assert all(world.idle(j) for j in range(P)) and sent == []
    assert all(machine(world, j).floods.awaiting_start is None for j in range(P))
    assert sum(machine(world, j).stats.quorum_additions for j in range(P)) == 0


@pytest.mark.parametrize("held", [True, False], ids=["delay", "no_delay"])
@pytest.mark.parametrize("P", [3, 4, 8])
def test_a_designated_rank_parked_again_starts_nothing(P, held):
    """Majority's designated initiator of the next balanced round waits in
    collectives twice with nothing to post (an epoch's flushes of other
    streams): it tells once and starts nothing either time, so the round the
    others post to next holds their data (found by benchmarks/waiting_cpu.py
    under load: the second park started an empty round)."""
    mode = Majority(seed=3)
    world = world_of(P, mode, held=held)
    for _ in range(2):  # registration, then a round with every rank: the next one is balanced
        post_all(world, P, 1)
        world.run_communication()
    c = machine(world, 0).completed
    d = mode.initiator("stream", c, P)
    for _ in range(2):
        world.park(d)
        world.run_communication()
        world.unpark(d)
    assert [machine(world, j).completed for j in range(P)] == [c] * P  # nothing started
    others = [j for j in range(P) if j != d]
    post_all(world, P, 2, others)
    world.run_communication()
    assert all(world.idle(j) for j in others)  # the designated rank is not needed: it told them
    res = world.results(others[0])[-1]
    assert (res.round, res.contributors) == (c, others)
    assert int(res.array[0]) == 2 * (P - 1)
