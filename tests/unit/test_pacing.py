"""The engine's nap lengths while a post waits for its round to start."""

import time

from hvd_partial.config import Config
from hvd_partial.engine.pacing import Pacing


class ScriptedBell:
    """A doorbell every peer can ring; ``rings`` says which waits a ring ends."""

    def __init__(self, size, rings):
        self.reachable = size - 1
        self.rings = list(rings)
        self.waits = []  # the timeout of each wait

    def wait(self, timeout):
        self.waits.append(timeout)
        return self.rings.pop(0) if self.rings else False


def waiting_naps(rings, count):
    config = Config(doorbell_poll_ms=10.0, idle_poll_ms=1.0)
    bell = ScriptedBell(4, rings)
    pacing = Pacing(config, bell, 4, relays_activations=True, commands=[])
    since = time.perf_counter() - 10.0  # the post has waited 10 s: naps are as long as allowed
    for _ in range(count):
        pacing.nap_while_waiting(since)
    return bell.waits


def test_a_long_wait_naps_the_doorbell_period():
    assert waiting_naps([], 4) == [0.01] * 4


def test_naps_after_a_ring_that_finds_nothing_are_short_then_long_again():
    # A ring whose message was already taken (it came late) is followed by no
    # work: the engine must not keep polling every millisecond for the whole wait.
    waits = waiting_naps([True], 12)
    assert waits[0] == 0.01
    assert waits[1:6] == [0.001] * 5, waits
    assert waits[6:] == [0.01] * 6, waits


def test_work_found_after_a_ring_ends_the_short_naps():
    config = Config(doorbell_poll_ms=10.0, idle_poll_ms=1.0)
    bell = ScriptedBell(4, [True])
    pacing = Pacing(config, bell, 4, relays_activations=True, commands=[])
    since = time.perf_counter() - 10.0
    pacing.nap_while_waiting(since)
    pacing.worked()
    pacing.nap_while_waiting(since)
    assert bell.waits == [0.01, 0.01]


def test_a_nap_ends_by_the_engines_next_timer():
    config = Config(doorbell_poll_ms=10.0, idle_poll_ms=1.0)
    bell = ScriptedBell(4, [])
    pacing = Pacing(config, bell, 4, relays_activations=True, commands=[])
    since = time.perf_counter() - 10.0
    pacing.nap_while_waiting(since, until=time.perf_counter() + 0.003)
    pacing.nap_while_waiting(since, until=time.perf_counter() - 0.001)  # already due: no nap
    pacing.nap_while_waiting(since, until=time.perf_counter() + 1.0)
    assert 0.0 < bell.waits[0] <= 0.003 and bell.waits[1] == 0.0 and bell.waits[2] == 0.01, bell.waits


def test_reduce_poll_default_spaces_tests_only_where_ranks_outnumber_cores():
    from hvd_partial.engine.pacing import reduce_poll_us

    assert reduce_poll_us(-1, local_size=4, cores=2) == 200.0
    assert reduce_poll_us(-1, local_size=2, cores=2) == 0.0
    assert reduce_poll_us(-1, local_size=1, cores=16) == 0.0
    # a value set by the user wins either way
    assert reduce_poll_us(0, local_size=8, cores=2) == 0.0
    assert reduce_poll_us(50, local_size=1, cores=16) == 50.0


def test_reduce_poll_config_takes_minus_one_or_a_spacing():
    import pytest

    from hvd_partial.config import Config
    from hvd_partial.errors import ConfigError

    assert Config().reduce_poll_us == -1
    assert Config(reduce_poll_us=0).reduce_poll_us == 0
    with pytest.raises(ConfigError, match="reduce_poll_us"):
        Config(reduce_poll_us=-2)
