"""One simulated rank's posts to one decentralized stream: what
:class:`~hvd_partial.core.rank_stream.RankStream` keeps in the engine
(pending posts, completed rounds not yet taken, the post or flush waiting
for results), for payloads of any kind. The stream's
:class:`~hvd_partial.core.decentral.stream.DecentralStream` reads it (as
its :class:`~hvd_partial.core.decentral.held_round.RankData`) and only
decides; the world feeds both, in the driver's order: the ledger first.

Example::

    ledger = PostLedger("g")
    ledger.post("g0")           # -> None: the post waits for a round
    ledger.join()               # -> ["g0"]: what this rank sums into the round it joins
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..core.decentral.messages import Complete
from ..core.rank_stream import Waiter
from ..core.round_result import RoundResult, any_data
from ..errors import StreamConflictError


@dataclass(slots=True)
class PendingPayload:
    seq: int
    computed_for: int  # rounds taken when it was posted
    payload: object


class PostLedger:
    """``posts_need_data``: a round nobody contributed to does not answer a post."""

    def __init__(self, name: str = "stream", posts_need_data: bool = False):
        self.name = name
        self.posts_need_data = posts_need_data
        self.pending: list[PendingPayload] = []
        self.seq = 0
        self.taken = 0
        self.completed = 0
        self.results: deque[RoundResult] = deque()
        self.waiter: Waiter | None = None

    def post(self, payload) -> Complete | None:
        """Record a post; returns its ``Complete`` if rounds already completed answer it."""
        self._check_idle("post")
        self.seq += 1
        self.pending.append(PendingPayload(self.seq, self.taken, payload))
        if self.completed > self.taken and (not self.posts_need_data or any_data(self.results)):
            return Complete("post", self.seq, self._take_all())
        self.waiter = Waiter("post", self.seq)
        return None

    def flush(self) -> None:
        """Wait for the flush round; the rounds completed so far are its first results."""
        self._check_idle("flush")
        if self.seq == 0:
            raise StreamConflictError(f"stream {self.name!r}: flushed before its first post")
        self.waiter = Waiter("flush", self.seq)
        self.waiter.results = self._take_all()

    def take(self) -> list:
        """The rounds completed and not yet taken, taken now (none while a post or flush waits)."""
        return [] if self.waiter is not None else self._take_all()

    def join(self) -> list:
        """Everything posted and not yet contributed: this rank's part of the round it joins."""
        items, self.pending = self.pending, []
        return [item.payload for item in items]

    def complete(self, result: RoundResult) -> Complete | None:
        """A round completed here; returns the ``Complete`` of the post or flush it answers."""
        self.results.append(result)
        self.completed += 1
        waiter = self.waiter
        if waiter is None:
            return None
        if waiter.kind == "post":
            if self.posts_need_data and not (result.has_data or result.flush):
                return None
            self.waiter = None
            return Complete("post", waiter.seq, self._take_all())
        if not result.flush:
            return None
        self.waiter = None
        return Complete("flush", waiter.seq, waiter.results + self._take_all())

    def fail(self, error: Exception) -> Complete | None:
        """The world failed: the waiting post or flush ends with ``error``."""
        waiter, self.waiter = self.waiter, None
        return None if waiter is None else Complete(waiter.kind, waiter.seq, [], error)

    def _take_all(self) -> list:
        out = list(self.results)
        self.results.clear()
        self.taken = self.completed
        return out

    def _check_idle(self, what: str):
        if self.waiter is not None:
            raise StreamConflictError(f"stream {self.name!r} already has a {self.waiter.kind} in progress; "
                                      f"cannot {what}")
