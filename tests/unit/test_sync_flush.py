"""Sync streams posted unequally often: the first rank to flush tells the
others how many rounds it took (FlushBegun), so that a rank which posted, or
posts, once more fails at once instead of waiting for a round nobody joins.
Pure core, on the loopback world."""

import numpy as np
import pytest

from hvd_partial.core.fusion import Layout
from hvd_partial.core.messages import FlushBegun
from hvd_partial.errors import MismatchError
from hvd_partial.modes import Solo, Sum, Sync
from hvd_partial.sim.loopback import LoopbackWorld


def _world(mode, size=3, plane="central"):
    return LoopbackWorld(size, mode, Sum, 4, Layout.of([np.zeros(2)]), control_plane=plane)


def _post_all(world, times=1):
    for _ in range(times):
        for j in range(world.world_size):
            world.post(j, [np.ones(2)])
        world.run_communication()


def _record_decisions(world):
    """Every message rank 0 sends (its control policy's decisions among them), as (dest, message)."""
    sent = []
    rank = world.ranks[0]
    send = rank.send  # the host's send: every message of rank 0's driver leaves through it
    rank.send = lambda dest, message: (sent.append((dest, message)), send(dest, message))
    return sent


@pytest.mark.parametrize("plane", ["central", "decentral"])
def test_a_post_after_another_rank_began_flushing_is_refused_and_flushing_recovers(plane):
    world = _world(Sync(), plane=plane)
    _post_all(world, times=2)
    world.flush(0)
    world.run_communication()
    with pytest.raises(MismatchError, match=r"rank 0 began flushing it after 2 rounds, but rank 1 posted round 2"):
        world.post(1, [np.ones(2)])
    world.flush(1)
    world.flush(2)
    world.run_communication()
    for j in range(3):
        rounds = world.results(j)
        assert [r.round for r in rounds] == [0, 1, 2] and rounds[-1].flush
        assert sum(r.array.sum() for r in rounds) == 2 * 3 * 2  # the refused post added nothing
    # The next flush epoch starts clean: equal posts, then a flush, work again.
    _post_all(world)
    for j in (2, 0, 1):
        world.flush(j)
    world.run_communication()
    assert [r.round for r in world.results(1)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("plane", ["central", "decentral"])
def test_a_round_already_started_that_the_flushing_rank_will_not_join_is_reported(plane):
    world = _world(Sync(), plane=plane)
    _post_all(world)
    world.post(1, [np.ones(2)])  # round 1 starts on rank 1 ...
    world.flush(0)  # ... and rank 0 flushes after 1 round
    with pytest.raises(MismatchError, match=r"rank 0 began flushing it after 1 rounds, but rank 1 posted round 1"):
        world.run_communication()


def test_the_coordinator_announces_each_sync_flush_once_and_partial_flushes_never():
    sync = _world(Sync())
    _post_all(sync)
    sent = _record_decisions(sync)
    sync.flush(2)
    sync.apply(("deliver", 2, 0))
    notices = [(d, m) for d, m in sent if isinstance(m, FlushBegun)]
    assert notices == [(j, FlushBegun(0, 2, 1)) for j in range(3)]
    sync.flush(0)
    sync.run_communication()
    assert sum(isinstance(m, FlushBegun) for _, m in sent) == 3  # only the first flush of an epoch is announced
    solo = _world(Solo())
    sent = _record_decisions(solo)
    _post_all(solo)
    for j in range(3):
        solo.flush(j)
    solo.run_communication()
    assert all(solo.results(j)[-1].flush for j in range(3))
    assert sent and not any(isinstance(m, FlushBegun) for _, m in sent)
