"""``cap_round_step``: a solo or majority round that sums more posts than the
world has ranks steps no further than a synchronous round (its sum divided by
its posts); with the setting off, as the eager-SGD paper has it (divided by
the world size). tests/workers/torch_round_step.py: majority rounds on 2
ranks of unequal speed, every post's gradient 1, lr 1."""

from __future__ import annotations

import pytest

from mpi_run import run_mpi

pytest.importorskip("torch")

WORLD = 2


@pytest.mark.parametrize("capped", [True, False])
def test_rounds_of_piled_posts_step_by_the_rule(capped):
    result = run_mpi("torch_round_step.py", WORLD, timeout=120,
                     env={"HVD_PARTIAL_CAP_ROUND_STEP": "1" if capped else "0"})
    reps = [result.results[r] for r in range(WORLD)]
    assert reps[0]["fingerprint"] == reps[1]["fingerprint"]
    assert reps[0]["rounds"] == reps[1]["rounds"]  # the same rounds, posts and steps on every rank
    rounds = reps[0]["rounds"]
    assert sum(r["posts"] for r in rounds) == WORLD * reps[0]["posts"]  # every post in exactly one round
    piled = [r for r in rounds if r["posts"] > WORLD]
    assert piled, f"no round summed more than {WORLD} posts: the test saw nothing to cap ({rounds})"
    for r in rounds:
        divisor = max(WORLD, r["posts"]) if capped else WORLD
        assert r["step"] == r["posts"] / divisor, r
