"""``core/carried_values.step_scale``: what an optimizer multiplies a round's
reduced gradient by before applying it (``cap_round_step``)."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_partial.core import carried_values
from hvd_partial.core.round_result import RoundResult


def round_of(posts: int, world: int, average: bool = True) -> RoundResult:
    """A round whose carried array summed ``posts`` posts (divided by ``world`` under Average)."""
    summed = sum(carried_values.encode([0.1]) for _ in range(posts))
    result = RoundResult(3, 0, contributors=list(range(min(posts, world))),
                         arrays=[np.zeros(2), summed / world if average else summed])
    result.world_size = world
    return result


@pytest.mark.parametrize("posts,world,expected", [(1, 4, 1.0), (4, 4, 1.0), (5, 4, 4 / 5), (7, 2, 2 / 7)])
def test_piled_rounds_are_divided_by_their_posts(posts, world, expected):
    result = round_of(posts, world)
    assert carried_values.posts_in(result.arrays[-1], world) == posts
    assert carried_values.step_scale(result, average=True, capped=True) == expected


def test_no_scale_when_off_or_summed():
    assert carried_values.step_scale(round_of(7, 2), average=True, capped=False) == 1.0
    assert carried_values.step_scale(round_of(7, 2, average=False), average=False, capped=True) == 1.0
