"""A round's result read lazily from its staleness row, and the statistics
that count those rows in batches: both must say exactly what explicit
per-rank lists say."""

import random

import numpy as np
import pytest

from hvd_partial.core.round_result import RoundResult, all_fresh, any_data
from hvd_partial.engine.stats import StatsRecorder


def test_a_result_read_from_its_row_equals_the_explicit_one():
    row = np.array([0, 1, 3, 0, 2])
    lazy = RoundResult(7, 1, staleness_row=row)
    explicit = RoundResult(7, 1, [1, 2, 4], {1: 0, 2: 2, 4: 1})
    assert lazy == explicit
    assert (lazy.contributors, lazy.staleness) == ([1, 2, 4], {1: 0, 2: 2, 4: 1})
    assert lazy.contributor_count == 3 and lazy.has_data
    assert explicit.staleness_row(5).tolist() == row.tolist()
    facts = lazy.facts_only()
    assert facts == lazy and facts.array is None and facts.arrays is None


def test_a_round_nobody_contributed_to_has_no_data():
    empty = RoundResult(2, None, staleness_row=np.zeros(3, np.int64))
    assert not empty.has_data and empty.contributors == [] and empty.staleness == {}
    assert not any_data([empty]) and any_data([empty, RoundResult(3, None, staleness_row=all_fresh(3))])
    assert any_data([RoundResult(4, None, staleness_row=np.zeros(3, np.int64), flush=True)])


def test_a_result_needs_its_facts():
    with pytest.raises(TypeError):
        RoundResult(0, None)


@pytest.mark.parametrize("rounds", [1, 63, 64, 65, 300])
def test_stats_count_every_row_whatever_the_batch(rounds):
    P = 5
    rng = random.Random(rounds)
    stats = StatsRecorder(P)
    fresh, stale, initiated, worst = [0] * P, [0] * P, [0] * P, 0
    for r in range(rounds):
        row = np.array([rng.choice([0, 1, 1, 2, 4]) for _ in range(P)])
        initiator = rng.choice([None, rng.randrange(P)])
        stats.round_completed("g", RoundResult(r, initiator, staleness_row=row))
        for j, v in enumerate(row.tolist()):
            fresh[j] += v == 1
            stale[j] += v > 1
            worst = max(worst, v - 1)
        if initiator is not None:
            initiated[initiator] += 1
    snap = stats.snapshot()["g"]
    assert (snap["rounds"], snap["fresh"], snap["stale"], snap["initiated"], snap["max_staleness_seen"]) == \
           (rounds, fresh, stale, initiated, worst)
