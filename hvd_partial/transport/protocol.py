"""The seam between the engine and what moves its bytes.

:class:`~hvd_partial.engine.engine.Engine` and its parts (dispatch,
reductions, liveness, pacing, the helper collectives' negotiator) reach the
network only through a :class:`Transport`. :class:`~hvd_partial.transport.mpi.MpiTransport`
is what real runs use; unit tests pass small stand-ins with the same members.

Example::

    transport: Transport = MpiTransport(comm, doorbell=True, quorum_counters=True)
    transport.send(1, TAG_PROTOCOL, message)
    for source, tag, message in transport.receive():
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ..core.decentral.quorum import QuorumCounters
    from .doorbell import Doorbell


class Transport(Protocol):
    """Point-to-point control messages and nonblocking reductions of one rank.
    Only the engine thread calls it once the engine runs."""

    rank: int
    size: int
    local_rank: int  # among the processes on this node
    local_size: int
    # Peers ring it after an urgent message so that a sleeping engine wakes at once; None: no doorbells.
    doorbell: Doorbell | None
    # quorum_counters(n): the counters of the n-th stream with a quorum to register (raises
    # TooManyStreamsError past the window's capacity); None: the streams keep no shared
    # counters (one rank, or the transport has no one-sided window).
    quorum_counters: Callable[[int], QuorumCounters] | None
    helpers: Any  # the helper collectives' communicator; None: no helper collectives
    tag_base: int  # added to every tag on the wire (sessions apart)

    def barrier(self) -> None:
        """Collective: every rank reached this point (before the engine thread starts)."""

    def send(self, dest: int, tag: int, message: object) -> None:
        """Send ``message`` to rank ``dest`` under ``tag``, without blocking; in order per pair of ranks."""

    def receive(self, rung: bool = False) -> list[tuple[int, int, object]]:
        """Every message that has arrived, as ``(source, tag, message)``; ``rung``: a peer
        rang this rank's doorbell, so look harder."""

    def progress_sends(self) -> int:
        """Move queued sends on; returns how many are still outstanding."""

    def retain_unfinished_sends(self) -> None:
        """Keep the sends still in flight alive for the life of the process (after a failure)."""

    def new_stream_comm(self) -> tuple[Any, Any]:
        """Start making a new stream's own communicator: ``(comm, request)``."""

    def stream_comm_ready(self, request: Any) -> bool:
        """Whether the communicator started by :meth:`new_stream_comm` is ready."""

    def iallreduce_in_place(self, comm: Any, buffer: np.ndarray) -> Any:
        """Start summing ``buffer`` over ``comm`` in place; returns its request."""

    def done(self, requests: list) -> bool:
        """Whether every request in ``requests`` completed."""

    def free(self) -> None:
        """Release what the transport holds (after the engine stopped)."""
