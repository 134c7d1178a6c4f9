"""The engine's timer of held-back floods (hvd_partial.engine.held_floods),
on stand-ins for the driver and the reductions: a flood the stream dropped
already (its round completed) leaves the timer at once and counts as no work,
so the engine does not stay awake for it; a flood still held is released
when its delay is over, and not before, saying whether every rank joined."""

import time

from hvd_partial.engine.held_floods import HeldFloods


def _timer(delay, held, joined=()):
    """A timer whose driver still holds the floods ``held`` ({(stream id, round)})
    and whose reductions know that every rank joined the rounds ``joined``."""
    released = []
    still_held = set(held)
    floods = HeldFloods(delay, holds=lambda sid, r: (sid, r) in still_held,
                        release=lambda sid, r, everyone: released.append((sid, r, everyone)),
                        everyone_joined=lambda sid, r: (sid, r) in set(joined))
    return floods, released


def test_a_dropped_flood_leaves_the_timer_at_once_and_is_no_work():
    floods, released = _timer(60.0, held=[(1, 6)])
    floods.hold(1, 5)
    floods.hold(1, 6)
    assert floods.release_due() is False
    assert released == []
    assert [(sid, r) for _, sid, r in floods.held] == [(1, 6)]  # still held, its delay not over
    assert floods.deadline is not None and floods.deadline > time.perf_counter() + 30


def test_an_expired_dropped_flood_is_no_work_either():
    floods, released = _timer(0.0, held=[])
    floods.hold(2, 3)
    assert floods.release_due() is False
    assert released == [] and not floods.held and floods.deadline is None


def test_a_held_flood_is_released_when_its_delay_is_over_and_says_who_joined():
    floods, released = _timer(0.0, held=[(1, 4), (2, 9), (1, 5)], joined=[(2, 9)])
    floods.hold(1, 4)
    floods.hold(2, 9)
    floods.delay = 60.0  # the next one is held for a minute
    floods.hold(1, 5)
    assert floods.release_due() is True
    assert released == [(1, 4, False), (2, 9, True)]
    assert [(sid, r) for _, sid, r in floods.held] == [(1, 5)]


def test_floods_are_timed_oldest_first_from_when_they_were_held():
    floods, _ = _timer(0.5, held=[(1, 1), (1, 2)])
    before = time.perf_counter()
    floods.hold(1, 1)
    floods.hold(1, 2)
    after = time.perf_counter()
    first, second = (deadline for deadline, _, _ in floods.held)
    assert before + 0.5 <= first <= second <= after + 0.5
    assert floods.deadline == first
