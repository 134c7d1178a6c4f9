"""Growing the loopback world back (elastic training), as the MPI engine does
it (:mod:`hvd_partial.engine.growth`; docs/elastic.md, "Growing back"), with
the same core rules (:mod:`hvd_partial.core.growth`):

1. decide: every rank reports its streams (:func:`streams_at_rest`) and the
   world grows only if every rank is idle and :func:`agreed_rounds` says
   every report is the same and every stream at rest;
2. stop: every rank's driver shuts down (its final flushes carry no data; the
   results go nowhere, as the old engine's do) and the world delivers every
   event until each has left;
3. spawn and merge: the new ranks come after the current ones, numbered after
   every earlier rank (:meth:`~hvd_partial.core.world.World.grown`);
4. handshake and start: every rank, old and new, gets a new driver on the
   grown world whose streams number their rounds on from the rounds carried
   (:func:`start_carried`), and a new quorum window.
"""

from __future__ import annotations

import random

from ..core.growth import agreed_rounds, streams_at_rest
from ..core.world import World


def rounds_at_rest(world) -> dict[str, int] | None:
    """Per stream, the rounds completed, where the world may grow now (every rank
    idle, none stopped or leaving, every stream at rest on every rank); else None."""
    if not world.elastic:
        raise ValueError("grow needs an elastic world")
    for j, rank in enumerate(world.ranks):
        if not world.idle(j) or rank.failure is not None or rank.notice_due or rank.driver.leaving:
            return None
    return agreed_rounds([streams_at_rest(rank.driver) for rank in world.ranks])


def grow_world(world, count: int, rank_class, rng: random.Random | None = None) -> dict | None:
    """Grow ``world`` by ``count`` ranks (made by ``rank_class(world, rank)``) if it may
    grow now (:func:`rounds_at_rest`). Returns (and appends to ``world.grows``) what the
    grow did: ``started`` (the new ranks' numbers), ``members``, ``version`` and
    ``carried`` (stream name -> rounds completed before); None where it may not."""
    if count < 1:
        raise ValueError(f"grow by {count} ranks: at least one")
    carried = rounds_at_rest(world)
    if carried is None:
        return None
    # 2. stop
    world.stopping = True
    try:
        for j in range(world.world_size):
            world.shutdown(j)
        world.run_communication(rng)
        if not all(world.left(j) for j in range(world.world_size)):
            raise AssertionError("a rank's shutdown before the grow did not finish")
    finally:
        world.stopping = False
    # 3. spawn and merge
    lost = tuple(sorted(rank.original for rank in world.departed))
    before = World(world.version, 0, world.world_size, world.members[0], world.members, lost, world.joined)
    grown = before.grown(count)
    started = grown.joined[-count:]
    ranks = list(world.ranks)
    for number in started:
        rank = rank_class(world, len(ranks))
        rank.original = number
        ranks.append(rank)
    members = world.begin_world(ranks)
    if members != grown.members:
        raise AssertionError(f"grown world {members}, expected {grown.members}")
    world.joined = grown.joined
    # 4. handshake and start
    for rank in ranks:
        rank.restart(carried)
    done = {"started": started, "members": members, "version": world.version, "carried": carried}
    world.grows.append(done)
    return done
