"""Growing the world back (elastic training): the rules every host of the
protocol driver applies alike, the MPI engine (:mod:`hvd_partial.engine.growth`)
and the loopback world (:mod:`hvd_partial.sim.growing`); docs/elastic.md,
"Growing back".

The world grows only where every stream is at rest on every rank
(:func:`streams_at_rest` on each, :func:`agreed_rounds` over all of them);
then every rank's driver is replaced by one on the bigger world whose
:attr:`~hvd_partial.core.driver.Driver.carried` holds, per stream, the rounds
completed before (:func:`start_carried`): a stream registers again at its
first post and numbers its rounds on from there, and a flush of it before that
post has nothing to do (:func:`rests_carried`).
"""

from __future__ import annotations

from .driver import Driver


def streams_at_rest(driver: Driver) -> dict[str, int | None] | None:
    """Per stream, the rounds it completed (numbered on across earlier grows) if it
    is at rest on this rank (registered, no post or flush in progress, nothing
    pending, every round started here completed and taken), else None for it;
    None altogether while a stream is still registering."""
    if any(s.id is None for s in driver.streams.values()):
        return None
    out: dict[str, int | None] = {}
    for name, s in driver.streams.items():
        rest = s.waiter is None and not s.pending and s.started == s.completed == s.taken
        out[name] = s.completed + s.round_offset if rest else None
    for name, rounds in driver.carried.items():
        out.setdefault(name, rounds)  # carried over an earlier grow, not posted to since
    return out


def agreed_rounds(reports: list) -> dict[str, int] | None:
    """From every rank's :func:`streams_at_rest`, in rank order: per stream the rounds
    to carry over when every report is the same and every stream is at rest, else
    None (the grow waits). Every rank decides alike from the same reports."""
    carried = reports[0]
    if carried is None or None in carried.values() or any(r != carried for r in reports):
        return None
    return dict(carried)


def start_carried(driver: Driver, carried: dict[str, int]) -> None:
    """A new driver on the grown world: its streams number their rounds on from ``carried``."""
    driver.carried = dict(carried)


def rests_carried(driver: Driver, name: str) -> bool:
    """Stream ``name`` was carried over a grow and not posted to since: a flush of it
    returns no rounds on every rank (none can exist)."""
    return name in driver.carried and name not in driver.streams
