"""Surviving a dead rank (elastic training): what the engine thread does,
on every survivor, once an MPI call reported a process failure.

The steps, each collective over the survivors (docs/elastic.md, "The
contract across a failure"):

1. complete every round whose reduction finished here before the failure;
2. revoke the control communicator (every engine polls it, so every
   survivor comes to recover; the others are abandoned, never revoked: Open
   MPI crashes a rank still creating a communicator that another revokes),
   agree on the failed ranks and shrink the control communicator to the survivors (:meth:`MpiTransport.shrink`), then
   make the helper and factory communicators, the quorum window and the
   doorbell again on it;
3. compare what each survivor holds (:func:`~hvd_partial.core.rebase.recovery_report`): each
   acts on the agreements' outcomes it missed (a registration flooded to some
   survivors only), and every stream gets a new communicator, in id order;
4. per stream, the rounds some survivor completed are sent by it to those
   that did not (its result is the true sum of the old world, the dead rank's
   contribution whole in it); every other round in flight is redone on the
   new world, from the contributions each survivor kept, and a survivor that
   had not joined it joins it now;
5. every stream's protocol state is rebased on the new ranks from the facts
   of its last completed round, and this rank's own agreement reports that
   nothing answered begin again.

A helper collective in flight completes with the result of a survivor where
it completed (each rank keeps its latest results); one completed nowhere fails
with :class:`HorovodInternalError` on every survivor, and the engine refuses
later ones until the rank acknowledges the change. A second failure during these steps starts them again on the
communicator in hand.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..core.driver import Driver
from ..core.rebase import (adopt_world, catch_up, columns_between, plan_streams, rebase_stream, recovery_report,
                           reindex_in_flight)
from ..core.world import World
from ..errors import RecoveryError
from .. import faults
from .reductions import Reductions

log = logging.getLogger("hvd_partial.engine")

# Survivors give up after this many failures in a row during one recovery.
_MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class Recovered:
    """What one recovery did: the new world, the old ranks (of the world
    before) that failed, and how long it took."""

    world: World
    failed: tuple[int, ...]
    seconds: float
    attempts: int


def recover(transport, driver: Driver, reductions: Reductions, helpers, world: World, worlds: dict[int, World],
            dispatch) -> Recovered:
    """Run the steps of this module's docstring on this survivor; returns the new world.
    ``worlds``: every world since init by version (a stream's facts are indexed by
    the ranks of the world its last round completed on); ``dispatch``: the engine's
    :class:`~.dispatch.Dispatch`, which hands the driver the messages it sends itself;
    ``helpers``: the helper collectives' negotiator (the engine abandons what is left in it)."""
    began = time.perf_counter()
    is_failure = transport.is_process_failure
    reductions.complete_finished(is_failure)
    helpers.complete_finished(is_failure)
    failed_total: set[int] = set()
    for attempt in range(1, _MAX_ATTEMPTS + 1):
        try:
            transport.revoke_control()
            shrunk = transport.shrink()
            members = tuple(m for r, m in enumerate(world.members) if r not in set(shrunk.failed))
            failed_total |= {world.members[r] for r in shrunk.failed}
            new_world = World(world.version + 1, shrunk.comm.Get_rank(), len(members), world.original_rank, members,
                              tuple(sorted(set(world.lost) | failed_total)), world.joined, world.left)
            worlds[new_world.version] = new_world  # (before anything else can fail: a retry shrinks this world)
            faults.point("recovery_shrunk")
            if not reductions.duplicating:  # (a communicator still being made must not be revoked)
                transport.revoke_abandoned(reductions.stream_comms())
            transport.rebuild(shrunk.comm)
            _resolve(transport, driver, reductions, new_world, worlds, dispatch)
            _hand_over_helpers(transport, helpers, new_world)
        except Exception as err:  # noqa: BLE001 - MPI's error types stay in the transport
            # (a second failure during these steps may surface as any MPI error: start again)
            if not (is_failure(err) or transport.is_mpi_error(err)):
                raise
            log.warning("rank %d: another failure during recovery (%s); starting again", world.rank, err)
            world = worlds[max(worlds)]
            continue
        seconds = time.perf_counter() - began
        lost = tuple(sorted(failed_total))
        log.warning("rank %d (as numbered at init): ranks %s (numbered as at init) failed; going on as rank %d of %d "
                    "(recovered in %.1f ms)", world.original_rank, list(lost),
                    new_world.rank, new_world.size, seconds * 1e3)
        return Recovered(new_world, lost, seconds, attempt)
    raise RecoveryError(f"rank {world.original_rank} (as numbered at init): {_MAX_ATTEMPTS} failures in a row "
                        "during recovery; giving up")


def _hand_over_helpers(transport, helpers, world: World) -> None:
    """A helper collective completed at some survivor completes with its result at every
    survivor where it was in flight; the rest fail (the engine abandons them)."""
    reports = transport.gather_objects(helpers.recovery_report())
    holders: dict[int, int] = {}
    for rank, (kept, _) in enumerate(reports):
        for number in kept:
            holders.setdefault(number, rank)
    for number in sorted({n for _, running in reports for n in running}):
        holder = holders.get(number)
        if holder is not None:
            raw = transport.broadcast_object(helpers.kept_result(number) if world.rank == holder else None, holder)
            helpers.finish_from_peer(number, raw)


def _resolve(transport, driver: Driver, reductions: Reductions, world: World, worlds: dict[int, World],
             dispatch) -> None:
    """Steps 3 to 5 on the survivors' communicators."""
    reports = transport.gather_objects(recovery_report(driver))
    dispatch.rebase(world.rank)
    adopt_world(driver, world.rank, world.size, reports, transport.quorum_counters)
    dispatch.deliver_own()  # the registrations this rank missed: their streams now exist here
    reductions.remake_comms(transport.new_stream_comm_now)
    rounds = transport.gather_objects({sid: (s.completed, s.started) for sid, s in driver.by_id.items()})
    quorum_index = 0
    for sid, plan in plan_streams(rounds).items():
        stream = driver.by_id[sid]
        for r in plan.handed:
            data = stream.kept_round(r) if world.rank == plan.holder else None
            data = transport.broadcast_object(data, plan.holder)
            if stream.completed <= r:
                driver.complete(stream, reductions.pop_round(sid, r), data)
        columns = columns_between(worlds[stream.world_version].members, world.members)
        uses_quorum = driver.control.uses_quorum(sid)
        rebase_stream(driver, stream, columns, plan.started, quorum_index if uses_quorum else None, world.version)
        quorum_index += 1 if uses_quorum else 0
        reindex_in_flight(reductions.in_flight_launches(sid), columns, world.size)  # the dead ranks' columns go
        reductions.restart(sid)
        if not stream.sync:
            catch_up(driver, stream, plan.started)
    driver.begin_again()
