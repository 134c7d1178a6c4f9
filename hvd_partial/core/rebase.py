"""A rank's protocol after a failure (elastic training): the pure steps by
which the survivors of a dead rank go on in a smaller world. The host (the
engine's :mod:`hvd_partial.engine.recovery`) runs them on every survivor,
between exchanges of what each holds (docs/elastic.md):

1. :func:`recovery_report`, gathered from every survivor;
2. :func:`adopt_world`: the rank's new place, and the agreements' outcomes it missed;
3. per stream, the rounds some survivor completed are completed here with
   its result (``Driver.complete``), then :func:`rebase_stream`,
   :func:`reindex_in_flight` (the rounds still in flight are redone) and, for
   solo and majority streams, :func:`catch_up`;
4. ``Driver.begin_again``: this rank's own agreement reports that nothing answered.

Example::

    reports = [recovery_report(d) for d in drivers]           # an allgather in the engine
    adopt_world(driver, new_rank, new_size, reports)
"""

from __future__ import annotations

from dataclasses import dataclass

from .driver import Driver
from .rank_stream import RankStream


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the survivors do with one stream's rounds in flight, the same on
    every survivor: ``holder`` (a new rank) completed the most rounds and hands
    rounds ``handed`` to every survivor that did not complete them; the rounds
    after those, up to ``started - 1``, completed nowhere and are redone on the
    new world, every survivor joining them."""

    holder: int
    handed: range
    started: int


def plan_streams(rounds: list[dict]) -> dict[int, StreamPlan]:
    """Per stream, from every survivor's ``{stream id: (completed, started)}``
    (in new rank order), who hands which rounds over and how many are started."""
    plans = {}
    for sid in sorted(rounds[0]):
        completed = [r[sid][0] for r in rounds]
        top = max(completed)
        plans[sid] = StreamPlan(completed.index(top), range(min(completed), top),
                                max(r[sid][1] for r in rounds))
    return plans


def columns_between(before_members, after_members) -> list[int]:
    """The ranks of the world before that survive, in their order in the world after
    (members are numbered as at init): how facts are re-indexed."""
    return [list(before_members).index(m) for m in after_members]


def recovery_report(driver: Driver) -> dict:
    """What this rank holds, for the survivors to compare: its registered
    streams, per stream the rounds it completed and started, and the agreements' outcomes."""
    return {"registered": {sid: s.name for sid, s in driver.by_id.items()},
            "rounds": {sid: (s.completed, s.started) for sid, s in driver.by_id.items()},
            "heard": dict(driver.control.agreements.outcomes)}


def adopt_world(driver: Driver, rank: int, size: int, reports: list[dict], quorum_counters=None) -> None:
    """This rank is ``rank`` of ``size`` now; ``reports``: every survivor's
    :func:`recovery_report`. Acts on the agreements' outcomes it missed (a
    registration some survivor heard: every survivor posted first, so this one
    holds that post), as messages to itself that the host delivers next."""
    heard: dict = {}
    for report in reports:
        heard.update(report["heard"])
    next_id = 1 + max((sid for report in reports for sid in report["registered"]), default=-1)
    driver.rank, driver.size = rank, size
    for stream in driver.streams.values():
        if stream.id is None:  # still registering: its rounds run on the new world (none ran on the old)
            stream.rank, stream.world_size = rank, size
    control = driver.control
    for key, message in control.rebase(rank, size, heard, next_id, quorum_counters):
        control.agreements.act_on(key, message)


def rebase_stream(driver: Driver, stream: RankStream, columns, started: int, quorum_index: int | None,
                  world_version: int) -> None:
    """Every survivor has completed the same rounds of ``stream``; rounds up to
    ``started - 1`` were started by some survivor and are redone on the new
    world. ``columns``: the old ranks that survive, in their new order."""
    stream.rebase(driver.rank, driver.size, columns, world_version)
    driver.control.rebase_stream(stream, started, quorum_index)


def reindex_in_flight(launches, columns, size: int) -> None:
    """The facts of this rank's rounds of a stream still in flight (to be redone on
    the new world of ``size`` ranks) keep only the columns of the survivors, in their
    new order (``columns``, from :func:`columns_between`). A launch whose facts
    already have ``size`` columns was joined on the new world and is left as it is."""
    for launch in launches:
        if launch.with_facts and launch.send[-1].shape[1] != size:
            launch.send[-1] = launch.send[-1][:, columns]


def catch_up(driver: Driver, stream: RankStream, started: int) -> None:
    """After :func:`rebase_stream`: join the rounds others started (solo and majority)."""
    driver.control.catch_up(stream, started)
