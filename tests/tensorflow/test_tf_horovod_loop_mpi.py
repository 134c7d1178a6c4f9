"""Horovod's TF2 loop with only the import changed, in the default mode (solo)
and in majority, on 3 ranks with a straggler (tests/workers/tf_horovod_loop.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", params=["default", "majority"])
def loop_run(request, tmp_path_factory):
    env = {"HVD_PARTIAL_MODE": "solo"} if request.param == "default" else {}
    return run_mpi("tf_horovod_loop.py", 3, request.param, timeout=240, env=env).results


def test_every_post_is_applied_exactly_once_with_catch_ups(loop_run):
    size = len(loop_run)
    posts = sum(res["conservation"]["posts"] for res in loop_run.values())
    for rank, res in loop_run.items():
        w = res["conservation"]["w"]
        # Each post is one one-hot row, SGD(lr=1), op=Sum: minus one at every row, exactly.
        assert w == [-1.0] * posts, (rank, w)
        assert res["conservation"]["iterations"] == res["conservation"]["updates_in_steps"] + \
            res["conservation"]["flushed"]
    # In solo, rank 1 lags by construction: its posts took several rounds.
    lagging = loop_run[1]["conservation"]
    if lagging["lagged"]:
        assert lagging["updates_in_steps"] > lagging["posts"], loop_run
    assert size == 3


@pytest.mark.parametrize("scenario", ["adam", "eager"])
def test_replicas_and_optimizer_state_are_bitwise_identical(loop_run, scenario):
    digests = {res[scenario]["digest"] for res in loop_run.values()}
    iterations = {res[scenario]["iterations"] for res in loop_run.values()}
    assert len(digests) == 1 and len(iterations) == 1, loop_run


def test_changed_gradients_fail_clearly_on_every_rank(loop_run):
    for rank, res in loop_run.items():
        assert "ConfigError" in res["changed"]["message"] or res["changed"]["error"] == "ConfigError", res
        assert f"rank {rank}" in res["changed"]["message"]
        assert "unchanged to apply_gradients()" in res["changed"]["message"]


def test_tape_and_keras_streams_survive_shutdown_and_init(loop_run):
    generations = [res["reinit"]["generations"] for res in loop_run.values()]
    assert all(g == generations[0] for g in generations), generations
    assert generations[0][1][2] > generations[0][0][2]  # training went on after init()
    for rank, res in loop_run.items():
        assert res["reinit"]["fresh_after_init"], rank  # shutdown() dropped the adapter's state
        assert res["reinit"]["reentered"], rank  # the traced tape's exchange is the new session's
