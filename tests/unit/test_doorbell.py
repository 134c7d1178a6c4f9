"""The doorbell on its own, in one process: ringing, poking, draining, closing."""

import time

from hvd_partial.transport.doorbell import Doorbell


def _pair(host_b="h"):
    a = Doorbell.open(lambda mine: [mine, None], "h", 0)
    entry_a = ("h", None, a.port)
    b = Doorbell.open(lambda mine: [entry_a, mine], host_b, 1)
    return a, b


def test_a_ring_wakes_the_peer_once():
    a, b = _pair()
    try:
        assert not a.wait(0.01)  # nothing rung yet
        b.ring(0)
        b.ring(0)
        assert a.wait(5.0)
        assert not a.wait(0.01)  # both datagrams were drained by the first wake
        assert b.reachable == 1 and a.reachable == 0
    finally:
        a.close()
        b.close()


def test_a_poke_wakes_the_own_engine_and_is_drained():
    a, b = _pair()
    try:
        for _ in range(1000):  # more than one read's worth
            a.poke()
        assert a.wait(5.0)
        assert not a.wait(0.01)
    finally:
        a.close()
        b.close()


def test_a_peer_on_another_host_without_a_routable_address_is_not_rung():
    a, b = _pair(host_b="other-host")  # a reported no address other hosts can use
    try:
        assert b.reachable == 0
        b.ring(0)  # a no-op, not an error
        assert not a.wait(0.05)
    finally:
        a.close()
        b.close()


def test_closed_bell_ignores_pokes_and_rings():
    import os
    import select

    a, b = _pair()
    try:
        b.close()
        b.ring(0)  # a closed bell rings nobody: the open peer is not woken
        assert not a.wait(0.05)
        b.close()  # twice is fine
    finally:
        a.close()
    # The closed bells' descriptor numbers go to the next files opened (the
    # lowest free numbers): a poke must write to none of them.
    pipes = [os.pipe() for _ in range(4)]  # as many descriptors as both bells held, and more
    try:
        a.poke()
        b.poke()
        readable, _, _ = select.select([r for r, _ in pipes], [], [], 0.05)
        assert not readable, "a closed bell's poke wrote to another file"
    finally:
        for fds in pipes:
            for fd in fds:
                os.close(fd)
    a.close()  # twice is fine


def test_drain_consumes_pending_rings_and_pokes_without_sleeping():
    a, b = _pair()
    try:
        assert not a.drain()  # nothing pending: returns at once
        b.ring(0)
        deadline = time.monotonic() + 5.0
        while not a.drain():  # the datagram may take a moment on loopback
            assert time.monotonic() < deadline, "the ring never arrived"
        assert a.take_ring() and not a.take_ring()  # a peer rang: reported once
        a.poke()
        a.poke()
        assert a.drain()  # a poke is there at once
        assert not a.take_ring()  # pokes are not rings
        assert not a.drain()
        assert not a.wait(0.01)  # nothing left to wake on
    finally:
        a.close()
        b.close()
