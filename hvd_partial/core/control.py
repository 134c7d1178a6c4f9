"""Control policies: who decides when the rounds of solo and majority streams
start. A :class:`~hvd_partial.core.driver.Driver` reports its rank's events to
its policy and hands it the peer messages the driver itself does not handle;
the policy answers only with peer messages. Another policy (decentralized
activation, say) can therefore replace this one without touching the driver.

A policy has four methods: ``report(message)`` (this rank's Register, Post,
Flush or Goodbye), ``on_message(source, message)`` (a peer message the driver
does not handle itself), ``round_completed(stream, launch)`` (this rank
completed a round; ``stream.last_included`` holds its facts) and
``decides_completion(stream)`` (whether that completion feeds a decision, for
the simulator's cost model). It acts only by ``send(dest, message)``; to start
a round on its own rank it sends itself the ``Start``. A decentralized policy
would activate rounds from every rank's reports and flood its own activation
messages to hypercube neighbours, with no change to the driver.

Example::

    control = CentralControl(rank=0, size=4, send=lambda dest, message: ...)
    control.report(Register(0, "g", signature))  # sent to rank 0, itself here
"""

from __future__ import annotations

from typing import Callable

from ..errors import EngineError
from .coordinator import Coordinator
from .messages import Flush, Goodbye, Post, Register

COORDINATOR_RANK = 0
# The coordinator's method for each report (looked up on the instance, so that a profiler can wrap it).
_REPORTS = {Register: "on_register", Post: "on_post", Flush: "on_flush", Goodbye: "on_goodbye"}


class CentralControl:
    """Rank 0 decides every round with the :class:`Coordinator`; every other
    rank reports to it, and it sends each decision to every rank (itself too),
    in the same order to all."""

    def __init__(self, rank: int, size: int, send: Callable[[int, object], None]):
        self.rank = rank
        self.size = size
        self._send = send
        self.coordinator = Coordinator(size) if rank == COORDINATOR_RANK else None

    def report(self, message) -> None:
        """This rank's own event (a registration, post, flush or goodbye)."""
        self._send(COORDINATOR_RANK, message)

    def on_message(self, source: int, message) -> None:
        """A peer's report reached this rank."""
        handler = _REPORTS.get(type(message))
        if handler is None or self.coordinator is None:
            raise EngineError(f"rank {self.rank}: unexpected control message from rank {source}: {message!r}")
        self._broadcast(getattr(self.coordinator, handler)(message))

    def decides_completion(self, stream) -> bool:
        """Whether this rank's completion of a round of ``stream`` feeds a decision."""
        return self.coordinator is not None and not stream.sync

    def round_completed(self, stream, launch) -> None:
        """This rank completed ``launch`` of ``stream``."""
        if self.coordinator is None or stream.sync or launch.facts is None or launch.facts.round is None:
            return
        self._broadcast(self.coordinator.on_round_complete(stream.id, launch.round, stream.last_included))

    def _broadcast(self, messages) -> None:
        send = self._send
        for message in messages:
            for dest in range(self.size):
                send(dest, message)
