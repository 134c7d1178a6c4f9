"""The cluster simulator and its network model: pure, fast, no MPI."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_partial.modes import Majority, Solo, Sync
from hvd_partial.sim import NetworkModel, persistent_straggler, random_delays, replay, simulate, sleeper_schedule
from hvd_partial.sim.network import fit_linear, fit_reduce, nonnegative_least_squares

NET = NetworkModel(reduce_base_s=1e-3, reduce_alpha_s=2e-4, reduce_beta_s_per_byte=1e-9, message_latency_s=3e-4,
                   message_per_rank_s=1e-7, send_overhead_s=2e-5, send_per_rank_s=1e-8, coordinator_s=5e-5,
                   coordinator_per_rank_s=1e-7)


def modes_for(p):
    return [Sync(), Solo(), Majority(seed=3), Majority(seed=1, quorum=math.ceil(p / 2))]


# -- free network: the simulator is replay() ------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("tau", [0, 1, 4])
def test_free_network_equals_replay(p, tau):
    for mode in modes_for(p):
        for delay in (0.0, 0.07):
            compute = sleeper_schedule(p, 0.02, delay, seed=p + tau)
            a = replay(p, mode, tau, 25, compute)
            b = simulate(p, mode, tau, 25, compute, NetworkModel.free())
            assert (b.rounds, b.seconds, b.finish) == (a.rounds, a.seconds, a.finish), (p, mode, tau, delay)


def test_free_network_equals_replay_with_a_straggler():
    compute = persistent_straggler(4, 0.01, 5.0)
    for mode in modes_for(4):
        a = replay(4, mode, 2, 30, compute)
        b = simulate(4, mode, 2, 30, compute)
        assert (b.rounds, b.seconds, b.finish) == (a.rounds, a.seconds, a.finish)


# -- timing --------------------------------------------------------------------------------------

def test_sync_pays_registration_then_one_reduction_per_step():
    p, steps, step_s, nbytes = 4, 10, 0.02, 1 << 20
    r = simulate(p, Sync(), 0, steps, lambda j, s: step_s, NET, nbytes=nbytes)
    # the first post registers the stream: ranks 1..P-1's Registers reach the coordinator one
    # message later, together, and are served one after the other; its answer reaches the last
    # rank after P-1 sends and one more message
    registration = (2 * NET.message_seconds(p) + (p - 1) * NET.coordinator_seconds(p)
                    + (p - 1) * NET.send_seconds(p))
    expected = steps * (step_s + NET.reduce_seconds(p, nbytes)) + registration
    assert r.seconds == pytest.approx(expected, rel=1e-9)
    assert r.rounds == steps
    slower = simulate(p, Sync(), 0, steps, lambda j, s: step_s, NET.replace(step_overhead_s=1e-3), nbytes=nbytes)
    assert slower.seconds == pytest.approx(expected + steps * 1e-3, rel=1e-9)


def test_communication_costs_slow_sync_down_and_free_is_fastest():
    compute = sleeper_schedule(4, 0.02, 0.05, seed=1)
    free = simulate(4, Sync(), 0, 20, compute)
    costly = simulate(4, Sync(), 0, 20, compute, NET, nbytes=1 << 20)
    dearer = simulate(4, Sync(), 0, 20, compute, NET.replace(reduce_base_s=5e-3), nbytes=1 << 20)
    assert free.seconds < costly.seconds < dearer.seconds


def test_a_saturated_coordinator_makes_solo_slower_than_its_free_replay():
    compute = random_delays(16, 0.01, 0.05, seed=0)
    free = simulate(16, Solo(), 8, 15, compute)
    slow = simulate(16, Solo(), 8, 15, compute, NetworkModel(coordinator_s=2e-3))
    assert slow.seconds > 1.5 * free.seconds
    assert slow.coordinator_busy_s > 0.5 * slow.seconds  # it is the bottleneck


@pytest.mark.parametrize("mode", [Solo(), Majority(seed=2), Majority(seed=5, quorum=3)])
@pytest.mark.parametrize("tau", [1, 3])
def test_staleness_bound_holds_under_network_costs(mode, tau):
    r = simulate(6, mode, tau, 30, random_delays(6, 0.01, 0.04, seed=7, delayed_per_step=2), NET, nbytes=1 << 16)
    assert 0 < r.staleness_max <= tau
    assert r.posts == 6 * 30


def test_deterministic():
    compute = random_delays(8, 0.02, 0.1, seed=4, delayed_per_step=2)
    a = simulate(8, Majority(seed=1, quorum=4), 4, 20, compute, NET, nbytes=4096)
    b = simulate(8, Majority(seed=1, quorum=4), 4, 20, random_delays(8, 0.02, 0.1, seed=4, delayed_per_step=2),
                 NET, nbytes=4096)
    assert a == b


def test_deadline_stops_each_rank_after_the_step_that_crosses_it():
    r = simulate(2, Solo(), 8, 10 ** 6, lambda j, s: 0.01, deadline_s=0.105)
    # posts at 0.01 .. 0.11: the step started at 0.10 is the last one
    assert r.posts == 22
    assert all(f == pytest.approx(0.11) for f in r.finish)


def test_per_rank_step_counts():
    r = simulate(3, Solo(), 16, [10, 10, 2], persistent_straggler(3, 0.01, 5.0))
    assert r.posts == 22


def test_bad_arguments():
    with pytest.raises(ValueError):
        simulate(0, Solo(), 1, 1, lambda j, s: 0.0)
    with pytest.raises(ValueError):
        simulate(3, Solo(), 1, [1, 2], lambda j, s: 0.0)


# -- schedules -------------------------------------------------------------------------------------

def test_random_delays_is_sleeper_schedule():
    for k in (1, 3):
        a = sleeper_schedule(16, 0.02, 0.3, seed=9, delayed_per_step=k)
        b = random_delays(16, 0.02, 0.3, seed=9, delayed_per_step=k)
        assert all(a(j, s) == b(j, s) for j in range(16) for s in range(50))


def test_persistent_straggler():
    c = persistent_straggler(4, 0.02, 3.0)
    assert [c(j, 7) for j in range(4)] == [0.02, 0.02, 0.02, pytest.approx(0.06)]
    with pytest.raises(ValueError):
        persistent_straggler(4, 0.02, 3.0, straggler=4)


# -- the network model and its fit -------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e-2), min_size=3, max_size=3), st.integers(1, 4096), st.integers(0, 1 << 30))
def test_reduce_cost_is_monotone(coefs, p, nbytes):
    net = NetworkModel(reduce_base_s=coefs[0], reduce_alpha_s=coefs[1], reduce_beta_s_per_byte=coefs[2] * 1e-6)
    here = net.reduce_seconds(p, nbytes)
    assert net.reduce_seconds(p + 1, nbytes) >= here
    assert net.reduce_seconds(2 * p, nbytes) >= here
    assert net.reduce_seconds(p, nbytes + 1) >= here
    assert net.message_seconds(p + 1) >= net.message_seconds(p)


def test_negative_constants_are_refused():
    with pytest.raises(ValueError, match="reduce_alpha_s"):
        NetworkModel(reduce_alpha_s=-1e-6)


def test_free_model():
    assert NetworkModel.free().is_free
    assert not NET.is_free
    assert NetworkModel.free().reduce_seconds(1024, 1 << 30) == 0.0
    assert NetworkModel.from_dict(NET.to_dict()) == NET


def test_fit_reduce_recovers_known_constants():
    truth = NetworkModel(reduce_base_s=3e-4, reduce_alpha_s=1e-4, reduce_beta_s_per_byte=2e-9)
    samples = [(p, n, truth.reduce_seconds(p, n)) for p in (2, 4, 8) for n in (4, 65536, 1 << 20, 4 << 20)]
    base, alpha, beta = fit_reduce(samples)
    assert (base, alpha, beta) == pytest.approx((3e-4, 1e-4, 2e-9), rel=1e-6)


def test_nonnegative_least_squares_clips_at_zero():
    # unconstrained: y = 2 - x has a negative slope; constrained, the slope is 0
    x = nonnegative_least_squares([[1, 0], [1, 1], [1, 2]], [2.0, 1.0, 0.0])
    assert x[1] == 0.0 and x[0] == pytest.approx(1.0)
    assert fit_linear([1, 2, 3], [2.0, 4.0, 6.0]) == pytest.approx((0.0, 2.0), abs=1e-12)
    with pytest.raises(ValueError):
        nonnegative_least_squares(np.ones((3, 2)), np.ones(4))
