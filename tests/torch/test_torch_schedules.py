"""Schedulers built on the wrapped optimizer and stepped per local step, in
every mode, on 4 ranks with injected delays (tests/workers/torch_schedules.py):
every rank applies every round with the same hyperparameters, chosen by the
contract's rule, and the replicas stay bitwise identical."""

from __future__ import annotations

import pytest

from mpi_run import run_mpi

pytest.importorskip("torch")

NP = 4


@pytest.fixture(scope="module", params=["solo", "majority", "sync"])
def run(request):
    return request.param, run_mpi("torch_schedules.py", NP, request.param, timeout=240)


def test_every_rank_applies_every_round_with_the_same_hyperparameters(run):
    mode, result = run
    reps = [result.results[r]["warmup"] for r in range(NP)]
    first = reps[0]
    assert first["rounds"] and first["updates"] == len(first["rounds"])
    for rep in reps[1:]:
        assert rep["rounds"] == first["rounds"], "the ranks applied some round with different values or states"
        assert rep["final"] == first["final"]
    lrs = [lr for rep in reps for lr in rep["schedule"]]
    decays = [rep["weight_decay"] for rep in reps]
    for key, (lr, momentum, weight_decay, _) in first["rounds"].items():
        assert min(lrs) <= lr <= max(lrs)
        assert momentum == 0.9  # every post agrees: exactly that value
        who = first["contributors"][key]
        if len(who) == 1:  # only that rank's posts: its own value, bit for bit
            assert weight_decay == decays[who[0]]
        else:
            assert min(decays[j] for j in who) <= weight_decay <= max(decays[j] for j in who)
        if mode == "sync":
            assert who == list(range(NP))
    for rep in reps:  # after each step, the scheduler reads back its own local value
        assert rep["read_back"] == [True] * len(rep["read_back"])


def test_sync_rounds_apply_the_posts_values_exactly_when_they_agree(run):
    mode, result = run
    if mode != "sync":
        pytest.skip("sync mode only: every rank's schedule is at the same step in every round")
    rep = result.results[0]["warmup"]
    applied = [v[0] for _, v in sorted(rep["rounds"].items(), key=lambda kv: int(kv[0]))]
    assert applied == rep["schedule"][:len(applied)]


def test_plateau_scheduler_on_local_losses_and_checkpoint_round_trip(run):
    _, result = run
    reps = [result.results[r]["plateau"] for r in range(NP)]
    assert len({rep["final"] for rep in reps}) == 1
    for rep in reps:
        assert rep["restored"] is True and rep["rounds_restored"] is True


def test_grad_scaler_in_sync_mode_skips_on_every_rank_and_is_refused_otherwise(run):
    mode, result = run
    reps = [result.results[r]["scaler"] for r in range(NP)]
    if mode == "sync":
        assert len({(rep["final"], rep["scale"]) for rep in reps}) == 1
        for rep in reps:
            assert rep["error"] is None and rep["finite"] is True
            assert rep["rounds"] == 4 and rep["updates"] == 3  # the round with an inf was skipped everywhere
            assert rep["scale"] == 1024.0 * 0.5  # halved once, by every rank's scaler alike
    else:
        for rep in reps:
            assert rep["error"] == "UnsupportedInputError" and "GradScaler" in rep["message"]
