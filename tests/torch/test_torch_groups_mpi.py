"""Horovod's ``num_groups`` and ``groups`` of the torch ``DistributedOptimizer``
under mpiexec on 2 and 3 ranks (tests/workers/torch_groups.py): in sync, solo
and majority modes each group is a reduction of its own in every round of the
one stream (the engine's count of reductions per round), in sync mode with
``overlap_backward`` the groups are the buckets; replicas stay bitwise
identical and the results equal those without groups."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

GROUPS = {"none": 1, "num2": 2, "groups3": 3, "list": 4}  # the exact model's 5 parameters: groups made
MODES = ("sync", "solo", "majority")


@pytest.fixture(scope="module", params=[2, 3])
def groups_run(request):
    return request.param, run_mpi("torch_groups.py", request.param, timeout=240)


@pytest.mark.parametrize("mode", MODES)
def test_each_group_is_a_reduction_of_every_round(groups_run, mode):
    _, run = groups_run
    for rank, rep in run.results.items():
        for group, count in GROUPS.items():
            case = rep[f"exact/{mode}/{group}"]
            # the carried hyperparameters (float64, like the gradients) share the last group's buffer
            assert case["reductions_per_round"] == count, (rank, mode, group, case)
            assert case["reductions"] % count == 0 and case["reductions"] >= count * 5, (rank, mode, group, case)


@pytest.mark.parametrize("mode", MODES)
def test_groups_change_no_bit_of_the_result(groups_run, mode):
    """Integer gradients, op=Sum, lr 0.5: every sum is exact whatever the rounds and buffers,
    so each grouping gives bitwise the single-process result, on every rank."""
    _, run = groups_run
    finals = set()
    for rank, rep in run.results.items():
        for group in GROUPS:
            case = rep[f"exact/{mode}/{group}"]
            assert case["exact"], (rank, mode, group)
            finals.add(repr(case["final"]))
            if mode == "sync":
                assert case["per_step"] == rep["exact/sync/none"]["per_step"], (rank, group)
    assert len(finals) == 1


def test_sync_replicas_identical_and_equal_to_no_groups(groups_run):
    size, run = groups_run
    reps = list(run.results.values())
    for overlap in ("on", "off"):
        for group in GROUPS:
            key = f"mlp/{group}/{overlap}"
            assert len({tuple(rep[key]["per_step"]) for rep in reps}) == 1, f"{key}: replicas differ"
            for rep in reps:
                assert rep[key]["rounds"] == 5
                plain = rep[f"mlp/none/{overlap}"]
                if size == 2:  # a sum of two does not depend on how the buffers are cut: bitwise
                    assert rep[key]["per_step"] == plain["per_step"], key
                else:  # three addends: MPI may add them in another order for other buffer sizes
                    for a, b in zip(rep[key]["final"], plain["final"]):
                        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-12, key


def test_groups_are_the_overlap_buckets_and_split_the_post_without_overlap(groups_run):
    _, run = groups_run
    for rep in run.results.values():
        assert rep["mlp/none/on"]["buckets"] == [["0.weight", "0.bias", "2.weight", "2.bias"]]
        assert rep["mlp/num2/on"]["buckets"] == [["2.weight", "2.bias"], ["0.weight", "0.bias"]]
        assert rep["mlp/groups3/on"]["buckets"] == [["2.bias"], ["2.weight"], ["0.weight", "0.bias"]]
        # groups=[[b2, w0], [b0]], w2 alone: the group whose first parameter comes latest goes first
        assert rep["mlp/list/on"]["buckets"] == [["2.weight"], ["0.bias"], ["0.weight", "2.bias"]]
        for group, count in {"none": 1, "num2": 2, "groups3": 3, "list": 3}.items():
            assert rep[f"mlp/{group}/on"]["reductions_per_round"] == [1] * count  # one stream per bucket
            assert rep[f"mlp/{group}/off"]["reductions_per_round"] == [count]  # one stream, fused apart
            assert rep[f"mlp/{group}/off"]["buckets"] is None
