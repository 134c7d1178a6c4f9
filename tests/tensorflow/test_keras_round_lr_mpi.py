"""The learning rate travels with the rounds of a Keras ``DistributedOptimizer``:
4 ranks, each mode, per-batch warm-up and schedule callbacks and a
``LearningRateSchedule`` under ``model.fit`` with uneven step counts and a slow
rank (tests/workers/tf_round_lr.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
SIZE = 4
MODES = ("sync", "solo", "majority")


@pytest.fixture(scope="module")
def run():
    return run_mpi("tf_round_lr.py", SIZE, ",".join(MODES), timeout=420).results


def every_rank(run, mode, case):
    return [run[rank][mode][case] for rank in sorted(run)]


def bits(x: float) -> int:
    return int(np.float64(x).view(np.uint64))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["callbacks", "schedule"])
def test_every_rank_applies_every_round_with_the_same_rate_and_ends_identical(run, mode, case):
    parts = every_rank(run, mode, case)
    assert len({p["digest"] for p in parts}) == 1, [p["digest"] for p in parts]
    rounds = parts[0]["rounds"]
    assert rounds and all(p["rounds"] == rounds for p in parts)  # same rounds, same rates, bit for bit
    assert len({p["iterations"] for p in parts}) == 1 and parts[0]["iterations"] == len(rounds)
    posted = sorted({lr for p in parts for lr in p["posted"]})
    # A float rate is carried as set; a schedule's is evaluated in the train step, which
    # can differ from the callback's eager evaluation in the last bit.
    slack = 0.0 if case == "callbacks" else 1e-6
    for _, posts, rate, contributors in rounds:
        assert posts >= len(contributors) >= 1
        assert posted[0] * (1 - slack) <= rate <= posted[-1] * (1 + slack)
        if len(contributors) == 1 and posts == 1:  # one post: its rate
            if case == "callbacks":
                assert bits(rate) in {bits(lr) for lr in posted}
            else:
                assert any(rate == pytest.approx(lr, rel=slack) for lr in posted)
    assert len({rate for _, _, rate, _ in rounds}) > 1  # the rate did change during training


@pytest.mark.parametrize("mode", MODES)
def test_callbacks_read_back_their_own_rate(run, mode):
    for part in every_rank(run, mode, "callbacks"):
        assert part["read_back"] == part["posted"]
        assert part["lr"] == part["posted"][-1]
    if mode != "sync":  # each rank's own warm-up (4 + 2 * rank steps per epoch): rates that differ
        firsts = [part["posted"][0] for part in every_rank(run, mode, "callbacks")]
        assert len(set(firsts)) == SIZE, firsts


def test_sync_rounds_get_every_ranks_common_rate_exactly(run):
    parts = every_rank(run, "sync", "callbacks")
    assert all(p["posted"] == parts[0]["posted"] for p in parts)
    assert [rate for _, _, rate, _ in parts[0]["rounds"]] == parts[0]["posted"]
    for _, posts, _, contributors in parts[0]["rounds"]:
        assert posts == SIZE and contributors == list(range(SIZE))


@pytest.mark.parametrize("mode", MODES)
def test_a_learning_rate_schedule_reads_back_its_own_value(run, mode):
    for part in every_rank(run, mode, "schedule"):
        assert part["lr"] == pytest.approx(part["own_schedule"], rel=1e-6)
    if mode == "sync":  # every rank posts the u-th update's round at update u: the schedule there, as in Horovod
        part = every_rank(run, mode, "schedule")[0]
        rates = [rate for _, _, rate, _ in part["rounds"]]
        assert rates == pytest.approx(part["schedule_at"], rel=1e-6)


@pytest.mark.parametrize("mode", ["solo", "majority"])
def test_a_round_with_a_single_contributor_applies_its_rate(run, mode):
    parts = every_rank(run, mode, "alone")
    assert len({p["digest"] for p in parts}) == 1
    steps, rates = parts[0]["steps"], parts[0]["rates"]
    assert [len(s) for s in steps] == [1, 1, 1]  # each step took one round: its own
    alone = [s[0] for s in steps]
    assert [posts for _, posts, _ in alone] == [1, 1, 1]
    assert [rate for _, _, rate in alone] == rates  # bit for bit: float32 rates carried as float64
    for part in parts:  # the others applied those rounds at the flush, with the same rates
        applied = {r: (posts, rate, contributors) for r, posts, rate, contributors in part["rounds"]}
        for r, posts, rate in alone:
            assert applied[r] == (1, rate, [0])


def test_rounds_of_piled_posts_step_no_further_than_a_synchronous_round(run):
    """``cap_round_step`` (on): a majority round that summed more posts than the
    world has ranks is divided by its posts, so each applied round steps at most 1."""
    parts = [run[rank]["piled"] for rank in sorted(run)]
    assert len({p["weight"] for p in parts}) == 1
    for part in parts:  # every rank takes every round, at calls of its own
        calls = part["calls"]
        assert sum(sum(posts) for _, posts in calls) == SIZE * part["posts"]  # every post in one round
        assert any(n > SIZE for _, posts in calls for n in posts), f"no round summed more than {SIZE} posts"
        for step, posts in calls:
            assert step == sum(n / max(SIZE, n) for n in posts), (step, posts)
