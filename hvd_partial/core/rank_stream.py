"""One rank's side of one stream: pending contributions, completed rounds not
yet taken, and the post or flush waiting for results. Pure: the engine feeds
it events and carries out what it returns.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import MismatchError, StreamConflictError
from ..modes import ReduceOp
from .buffer_pool import BufferPool
from .decentral.facts import KNOWN_TAKEN
from .fusion import Layout
from .messages import Flush, FlushBegun, Start
from .round_result import RoundResult, all_fresh, any_data


@dataclass(slots=True)
class PendingPost:
    seq: int
    buffers: list
    computed_for: int
    owned: list  # per buffer: False while it is (a view of) the caller's array


@dataclass(slots=True)
class Launch:
    """A round to reduce: sum ``send`` over all ranks, then call ``complete``.

    ``send`` is ``None`` when the round has no contributors anywhere (the
    flush of a sync stream); the engine then completes it with zeros and no
    communication. For solo and majority rounds the last buffer of ``send``
    holds this rank's facts, so the reduction gathers every rank's facts with
    the data: the decentralized plane's ``(FIELDS, P)`` array, or, under the
    simulator's reference coordinator (:mod:`hvd_partial.sim.coordinator`), a
    flat array (contributed, staleness, last post summed).

    ``owned`` says, per buffer of ``send``, whether it belongs to this rank's
    stream alone (a fused or staged copy, the facts): the engine may then
    reduce it in place and hand it out as the result, sparing a copy of
    the whole buffer. The caller's own arrays and the shared zeros are never
    owned.
    """

    round: int
    send: list | None
    facts: Start | None  # a Start (sync flush rounds, the simulator's coordinator); None for decentralized rounds
    with_facts: bool = False  # solo and majority rounds: the last buffer of send is the facts
    owned: list | None = None  # set whenever send is


class Waiter:
    """What a post or flush waits for; the engine signals it when done."""

    __slots__ = ("kind", "seq", "results", "until_flush", "handle")

    def __init__(self, kind: str, seq: int = 0, handle=None):
        self.kind = kind  # "post" or "flush"
        self.seq = seq
        self.results: list[RoundResult] = []
        self.until_flush = kind == "flush"
        self.handle = handle  # the engine's Handle to wake, if any


class RankStream:
    """State of one stream on one rank.

    Example::

        s = RankStream(rank=0, world_size=2, name="g", layout=Layout.of([x]),
                       sync=False, op=Average)
        msg, done = s.post([x.reshape(-1)], owned=False, waiter=Waiter("post"))
    """

    def __init__(self, rank: int, world_size: int, name: str, layout: Layout, sync: bool,
                 op: ReduceOp, grouped: bool = False):
        self.rank = rank
        self.world_size = world_size
        self.name = name
        self.layout = layout
        self.sync = sync
        self.op = op
        self.grouped = grouped
        self.id: int | None = None
        self.seq = 0
        self.pending: deque[PendingPost] = deque()
        self.taken = 0
        self.completed = 0
        self.started = 0
        self.results: deque[RoundResult] = deque()
        self.waiter: Waiter | None = None
        self._zeros: list | None = None
        self._staging = BufferPool()  # copies of pending data, sums of several posts
        # rank -> last post it summed in the latest completed round (for the simulator's coordinator)
        self.last_included: dict[int, int] = {}
        # Sync streams: set while some rank flushes (FlushBegun), until the flush round.
        self.flush_begun: FlushBegun | None = None
        # Set by the decentralized control plane: reads a round's reduced facts
        # into (staleness row, initiator, flush); the facts are kept in last_facts.
        self.read_facts = None
        self.last_facts = None
        # Set with read_facts: a round nobody contributed to (which that plane may start) does not
        # answer a post; the post waits for one with data (its own data is still pending).
        self.posts_need_data = False
        # Elastic training: copies of the rounds completed here that some rank may not have
        # completed yet (round -> reduced buffers, facts last), so that after a failure this rank
        # can hand them to the survivors that lack them. None: not kept (elastic off).
        self.kept_rounds: dict[int, list] | None = None
        self.world_version = 0  # the world this stream's rounds complete on (elastic training)
        # Elastic training, after the world grew: the rounds this stream completed before, so that
        # its round numbers go on (the engine that restarted on the bigger world counts from 0).
        self.round_offset = 0

    # -- compute-thread requests (run on the engine thread) ---------------------

    def check_idle(self):
        if self.waiter is not None:
            raise StreamConflictError(
                f"stream {self.name!r} already has a {self.waiter.kind} in progress on rank {self.rank}; "
                "synchronize it before posting again")

    def post(self, buffers: list, owned: bool, waiter: Waiter, registered: bool = True):
        """Record a post. Returns ``(report, launch, done)``: what the control
        policy hears of it, ``(seq, computed_for, taken, waiting)`` as in
        :class:`~.messages.Post` (or None), a sync round to launch (or None),
        and whether ``waiter`` is already satisfied."""
        self.check_idle()
        if self.sync and self.flush_begun is not None:
            raise MismatchError(self._unequal_posts(self.started))
        if isinstance(owned, bool):
            owned = [owned] * len(buffers)
        self.seq += 1
        waiter.seq = self.seq
        computed_for = self.taken
        if self.sync:
            self.waiter = waiter
            launch = Launch(self.started, buffers, None, owned=list(owned))
            self.started += 1
            return None, launch, False
        self.pending.append(PendingPost(self.seq, buffers, computed_for, owned))
        if self.completed > self.taken and (not self.posts_need_data or any_data(self.results)):
            self._deliver(waiter)
            done = True
        else:
            self.waiter = waiter
            done = False
        # the first post travels as the registration itself
        report = (self.seq, computed_for, self.taken, not done) if registered else None
        if done:
            self._own_pending()
        return report, None, done

    def flush(self, waiter: Waiter, final: bool = False) -> Flush:
        self.check_idle()
        self.waiter = waiter
        waiter.results.extend(self._take_completed())
        return Flush(self.rank, self.id, self.taken, final)

    def take(self) -> list[RoundResult]:
        """The rounds completed and not yet taken, taken now, with no post
        (none while a post or flush is in progress: it takes them)."""
        if self.waiter is not None or self.sync:
            return []
        return self._take_completed()

    # -- engine events ----------------------------------------------------------

    def on_flush_begun(self, notice: FlushBegun) -> str | None:
        """A rank began flushing this sync stream. Returns what is wrong if
        this rank already started a round that rank will never join."""
        self.flush_begun = notice
        if self.started > notice.rounds:
            return self._unequal_posts(notice.rounds)
        return None

    def _unequal_posts(self, round_number: int) -> str:
        notice = self.flush_begun
        return (f"sync stream {self.name!r}: rank {notice.rank} began flushing it after {notice.rounds} rounds, "
                f"but rank {self.rank} posted round {round_number}; every rank must post to a sync stream "
                f"equally often (solo and majority streams allow uneven posts)")

    def on_start(self, start: Start) -> Launch:
        """A ``Start`` decision: a sync stream's flush round (or, in the
        simulator, a round its reference coordinator started)."""
        if start.round is None:  # flush of a sync stream: a round with no contributors
            self.flush_begun = None
            launch = Launch(self.started, None, start)
            self.started += 1
            return launch
        P = self.world_size
        facts = np.zeros(3 * P, dtype=np.int64)
        if self.pending:
            facts[self.rank] = 1
            facts[P + self.rank] = start.round - self.pending[0].computed_for
            facts[2 * P + self.rank] = self.pending[-1].seq
        return self.join(start.round, facts, start)

    def join(self, round_number: int, facts: np.ndarray, start: Start | None = None) -> Launch:
        """This rank joins ``round_number`` with everything posted and not yet
        contributed, and with its ``facts`` (the decentralized plane's, or those
        :meth:`on_start` filled in from a ``start``)."""
        if round_number != self.started:
            raise AssertionError(f"stream {self.name!r}: expected round {self.started}, got {round_number}")
        self.started += 1
        # Everything posted before this message reached the engine joins the round.
        items = list(self.pending)
        self.pending.clear()
        send, owned = self._combine(items)
        return Launch(round_number, [*send, facts], start, with_facts=True, owned=[*owned, True])

    def complete(self, launch: Launch, reduced: list | None) -> Waiter | None:
        """A round finished with the reduced ``buffers`` (None: nothing was
        contributed). Returns the waiter to wake, if it is now satisfied."""
        if self.kept_rounds is not None:
            self._keep(launch, reduced)
        facts = launch.facts
        initiator = None if facts is None else facts.initiator
        flush = False if facts is None else facts.flush
        if reduced is None:
            reduced = self.layout.zeros()
            row = np.zeros(self.world_size, np.int64)
            self.last_included = {}
        elif launch.with_facts:
            gathered, reduced = reduced[-1], reduced[:-1]
            if self.read_facts is not None:
                self.last_facts = gathered
                row, initiator, flush = self.read_facts(gathered)
            else:
                P = self.world_size
                row = np.where(gathered[:P] != 0, gathered[P:2 * P] + 1, 0)
                self.last_included = {j: int(gathered[2 * P + j]) for j in np.flatnonzero(gathered[:P]).tolist()}
        else:
            row = all_fresh(self.world_size)
        result = RoundResult(launch.round + self.round_offset, initiator, flush=flush, staleness_row=row)
        result.world_size, result.world_version = self.world_size, self.world_version
        if self.op is ReduceOp.AVERAGE and result.has_data:
            for buf in reduced:
                np.divide(buf, self.world_size, out=buf)
        arrays = self.layout.unpack(reduced)
        result.buffers = reduced
        if self.grouped:
            result.arrays = arrays
        else:
            result.array = arrays[0]
        self.results.append(result)
        self.completed += 1
        waiter = self.waiter
        if waiter is None:
            return None
        if waiter.until_flush:
            if not result.flush:
                return None
            waiter.results.extend(self._take_completed())
        elif self.posts_need_data and not (result.has_data or result.flush):
            return None
        else:
            self._deliver(waiter)
        self.waiter = None
        self._own_pending()
        return waiter

    # -- elastic training: surviving a dead rank -----------------------------------

    def keep_rounds(self) -> None:
        """Keep a copy of each completed round until every rank has completed it (elastic training)."""
        if self.kept_rounds is None:
            self.kept_rounds = {}

    def _keep(self, launch: Launch, reduced: list | None) -> None:
        kept = self.kept_rounds
        kept[launch.round] = None if reduced is None else [b.copy() for b in reduced]
        if launch.with_facts and reduced is not None and self.read_facts is not None:
            # A rank's KNOWN_TAKEN counts a waiting post's round as taken: one less is completed for sure.
            everywhere = int(reduced[-1][KNOWN_TAKEN].min()) - 1
        else:  # a sync round starts only once every rank completed the one before
            everywhere = launch.round
        for r in [r for r in kept if r < everywhere]:
            del kept[r]

    def kept_round(self, round_number: int) -> list | None:
        """The reduced buffers of a round completed here (facts last), for a survivor that lacks it."""
        return self.kept_rounds[round_number]

    def rebase(self, rank: int, world_size: int, columns, world_version: int) -> None:
        """The world shrank: this rank is now ``rank`` of ``world_size``; ``columns``
        are the old ranks that survive, in their new order (facts are re-indexed by them)."""
        self.rank, self.world_size, self.world_version = rank, world_size, world_version
        if self.last_facts is not None:
            self.last_facts = self.last_facts[:, columns]
        if self.kept_rounds is not None:
            self.kept_rounds.clear()  # every survivor completed every kept round in the recovery
        self._zeros = None

    # -- internals --------------------------------------------------------------

    def _take_completed(self) -> list[RoundResult]:
        out = list(self.results)
        self.results.clear()
        self.taken = self.completed
        return out

    def _deliver(self, waiter: Waiter):
        waiter.results.extend(self._take_completed())

    def _own_pending(self):
        # The caller may reuse its arrays once synchronize returns: copy what
        # is still waiting for a round.
        for item in self.pending:
            if not all(item.owned):
                item.buffers = [b if mine else self._staging.copy_of(b) for b, mine in zip(item.buffers, item.owned)]
                item.owned = [True] * len(item.buffers)

    def _combine(self, items: list[PendingPost]) -> tuple[list, list]:
        """The buffers this rank sends in a round, and which of them it owns."""
        if not items:
            if self._zeros is None:
                self._zeros = self.layout.zeros()  # read-only send buffer, reused
            return self._zeros, [False] * len(self._zeros)
        if len(items) == 1:
            return items[0].buffers, list(items[0].owned)
        total = [b if mine else self._staging.copy_of(b) for b, mine in zip(items[0].buffers, items[0].owned)]
        for item in items[1:]:
            for acc, b in zip(total, item.buffers):
                np.add(acc, b, out=acc)
        return total, [True] * len(total)

    def last_known_taken(self) -> np.ndarray | None:
        """Per rank, the rounds it had taken (a waiting post counts) when it
        joined the latest round completed here, where the round's facts tell
        (the decentralized plane)."""
        if self.read_facts is None or self.last_facts is None:
            return None
        return self.last_facts[KNOWN_TAKEN]

    @property
    def lag(self) -> int:
        return self.completed - self.taken
