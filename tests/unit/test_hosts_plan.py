"""The rules by which every rank follows a host discovery script's list
(hvd_partial/core/hosts.py): parsing the script's output, and the plan of
which ranks drain and how many start where."""

import pytest

from hvd_partial.core.hosts import DiscoveryError, parse_discovery_output, plan_world, same_host
from hvd_partial.core.world import World


def test_parse_host_and_host_slots_lines():
    assert parse_discovery_output("node1:2\n\n node2 \nnode1:1\nnode3:0\n", 4) == [("node1", 3), ("node2", 4)]
    for bad in ("node1:x", ":2", "node1:-1"):
        with pytest.raises(DiscoveryError, match="line 1"):
            parse_discovery_output(bad, 1)


def test_local_names_mean_the_launchers_host_and_short_names_match():
    assert same_host("localhost", "m1", "m1") and not same_host("localhost", "m2", "m1")
    assert same_host("m1.example.org", "m1", "x") and same_host("m1", "m1.example.org", "x")
    assert not same_host("m10", "m1", "x")


def test_a_host_no_longer_listed_drains_its_ranks_and_free_slots_get_new_ones():
    plan = plan_world([("a", 2), ("b", 4)], ["a", "a", "b", "c", "a"], "a", min_np=1, max_np=0)
    assert plan.leave == (3, 4)  # host c is gone; host a has 2 slots, its third rank drains
    assert plan.spawn == (("b", 3),) and plan.target == 6


def test_nothing_changes_when_every_slot_is_used_as_listed():
    plan = plan_world([("localhost", 3)], ["m"] * 3, "m", min_np=1, max_np=0)
    assert not plan.changes and plan.target == 3


def test_min_np_keeps_the_lowest_ranks_and_max_np_bounds_the_grow():
    assert plan_world([("localhost", 1)], ["m"] * 4, "m", min_np=3, max_np=0).leave == (3,)
    plan = plan_world([("localhost", 8)], ["m"] * 2, "m", min_np=1, max_np=5)
    assert plan.spawn == (("localhost", 3),) and plan.target == 5
    assert plan_world([("x", 4)], ["m"], "m", min_np=1, max_np=0).leave == ()  # never below one rank


def test_a_drained_world_numbers_new_ranks_after_the_ranks_that_left():
    world = World.initial(rank=1, size=4)
    drained = world.drained((3,), new_rank=1)
    assert drained.members == (0, 1, 2) and drained.left == (3,) and drained.version == 1 and drained.size == 3
    grown = drained.grown(2)
    assert grown.members == (0, 1, 2, 4, 5) and grown.joined == (4, 5) and grown.left == (3,)
    assert grown.shrunk((0,), new_rank=0).left == (3,)  # a later failure keeps the ranks that left
    with pytest.raises(ValueError):
        world.drained((1,), new_rank=1)
