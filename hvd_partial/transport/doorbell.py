"""Doorbells: wake an idle engine at once when a control message is sent to it.

MPI cannot wake a sleeping thread when a message arrives: an idle engine
only sees one at its next poll, and a solo
round cannot reduce until every rank's engine has seen its start. So each
urgent control message is followed by a one-byte UDP datagram to the
destination's doorbell, and an idle engine sleeps in ``select`` on its
doorbell instead of a timer. Compute threads ring the same bell through a
pipe when they submit work.

A doorbell is only a hint: the message itself always travels over MPI and
the engine still polls (every ``doorbell_poll_ms`` where every peer can ring
it, else every ``idle_poll_ms``), so a lost or blocked datagram costs
latency, never correctness. Peers on the same host are rung on the
loopback address; a remote peer only if its host name resolves to a
non-loopback address, else that peer is left to polling.
"""

from __future__ import annotations

import logging
import os
import select
import socket

log = logging.getLogger("hvd_partial.transport")


def _own_address() -> str | None:
    """An address other hosts may reach this one at, or None."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


class Doorbell:
    """This process's doorbell and the addresses of its peers' doorbells.

    Example (what the MPI transport does at start-up, on every rank)::

        bell = Doorbell.open(comm.allgather, host=MPI.Get_processor_name(), rank=comm.Get_rank())
        bell.ring(0)         # after sending rank 0 an urgent message
        bell.wait(0.001)     # the engine, idle: True when rung
    """

    def __init__(self, sock: socket.socket | None, peers: list):
        self._sock = sock
        self._peers = peers  # rank -> (address, port) or None
        self._pipe_r, self._pipe_w = os.pipe()
        os.set_blocking(self._pipe_r, False)
        os.set_blocking(self._pipe_w, False)
        self._fds = [self._pipe_r] + ([sock] if sock is not None else [])
        self._closed = False
        self._rung = False  # a peer's ring was consumed and not yet reported

    @classmethod
    def open(cls, allgather, host: str, rank: int) -> "Doorbell":
        """Collective: bind a UDP socket and exchange addresses with ``allgather``
        (a function of one object returning everyone's, e.g. ``comm.allgather``)."""
        sock = None
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("0.0.0.0", 0))
            sock.setblocking(False)
        except OSError as err:
            log.debug("rank %d: no doorbell socket (%s); idle engines poll", rank, err)
            if sock is not None:
                sock.close()
            sock = None
        mine = None if sock is None else (host, _own_address(), sock.getsockname()[1])
        everyone = allgather(mine)
        peers = []
        for j, entry in enumerate(everyone):
            if j == rank or entry is None:
                peers.append(None)
                continue
            peer_host, address, port = entry
            if peer_host == host:
                peers.append(("127.0.0.1", port))
            elif address is not None:
                peers.append((address, port))
            else:
                peers.append(None)
        reachable = sum(p is not None for p in peers)
        log.debug("rank %d: doorbells of %d of %d peers reachable", rank, reachable, len(everyone) - 1)
        return cls(sock, peers)

    def ring(self, dest: int) -> None:
        """Wake ``dest``'s engine (best effort, never blocks)."""
        peer = self._peers[dest] if dest < len(self._peers) else None
        if peer is None or self._sock is None or self._closed:
            return
        try:
            self._sock.sendto(b"\0", peer)
        except OSError:  # a full buffer means it has wake-ups pending anyway
            pass

    def poke(self) -> None:
        """Wake this process's own engine (from any thread)."""
        if self._closed:  # never write to a closed descriptor's number
            return
        try:
            os.write(self._pipe_w, b"\0")
        except BlockingIOError:  # full pipe: a wake-up is pending anyway
            pass

    def wait(self, timeout: float) -> bool:
        """Sleep until rung, poked or ``timeout`` seconds; True when woken."""
        readable, _, _ = select.select(self._fds, [], [], timeout)
        if not readable:
            return False
        self.drain()
        return True

    def drain(self) -> bool:
        """Consume every pending ring and poke without sleeping; True if there were any."""
        found = False
        try:
            while os.read(self._pipe_r, 4096):
                found = True
        except BlockingIOError:
            pass
        if self._sock is not None:
            try:
                while True:
                    self._sock.recv(64)
                    found = self._rung = True
            except (BlockingIOError, OSError):
                pass
        return found

    def take_ring(self) -> bool:
        """True if a peer rang since the last call: a message is on its way."""
        rung, self._rung = self._rung, False
        return rung

    @property
    def port(self) -> int | None:
        return None if self._sock is None else self._sock.getsockname()[1]

    @property
    def reachable(self) -> int:
        """How many peers this process can ring."""
        return sum(p is not None for p in self._peers) if self._sock is not None else 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._pipe_r, self._pipe_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._sock is not None:
            self._sock.close()
