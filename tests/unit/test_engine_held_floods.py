"""The engine's timer of held-back floods (Engine._release_held_floods), on
stand-ins for the driver and the reductions: a flood the stream dropped
already (its round completed) leaves the timer at once and counts as no work,
so the engine does not stay awake for it; a flood still held is released
when its delay is over, and not before."""

import time
from collections import deque
from types import SimpleNamespace

from hvd_partial.engine.engine import Engine


class _Control:
    def __init__(self, held):
        self.held = held  # {(stream id, round)} still held back

    def holds_flood(self, sid, round_number):
        return (sid, round_number) in self.held


def _engine(entries, held, joined=()):
    released = []
    driver = SimpleNamespace(control=_Control(set(held)),
                             release_message=lambda sid, r, everyone: ("release", sid, r, everyone),
                             on_message=lambda source, message: released.append(message))
    reductions = SimpleNamespace(everyone_joined=lambda sid, r: (sid, r) in set(joined))
    engine = SimpleNamespace(_held_floods=deque(entries), _driver=driver, _reductions=reductions, rank=0)
    return engine, released


def test_a_dropped_flood_leaves_the_timer_at_once_and_is_no_work():
    later = time.perf_counter() + 60
    engine, released = _engine([(later, 1, 5), (later, 1, 6)], held=[(1, 6)])
    assert Engine._release_held_floods(engine) is False
    assert released == []
    assert list(engine._held_floods) == [(later, 1, 6)]  # still held, its delay not over


def test_an_expired_dropped_flood_is_no_work_either():
    past = time.perf_counter() - 1
    engine, released = _engine([(past, 2, 3)], held=[])
    assert Engine._release_held_floods(engine) is False
    assert released == [] and not engine._held_floods


def test_a_held_flood_is_released_when_its_delay_is_over_and_says_who_joined():
    past = time.perf_counter() - 1
    later = time.perf_counter() + 60
    engine, released = _engine([(past, 1, 4), (past, 2, 9), (later, 1, 5)], held=[(1, 4), (2, 9), (1, 5)],
                               joined=[(2, 9)])
    assert Engine._release_held_floods(engine) is True
    assert released == [("release", 1, 4, False), ("release", 2, 9, True)]
    assert list(engine._held_floods) == [(later, 1, 5)]
