"""The engine's observer: rank statuses, the stall inspector, the periodic
slow-rank report and the timeline hooks. Runs on the engine thread; only
:meth:`Observer.enrich` is called from other threads.

Every rank makes a small :class:`RankStatus` now and then (a few times per
stall-warning period, at most every 5 s): how long since it last called
hvd_partial, whether a call of it is in progress, and its wait and compute
time per post. The statuses travel up the binomial tree rooted at rank 0 and
rank 0's picture back down it (:class:`StatusBundle`), so every rank has the
whole picture while sending O(log P) messages per status period (see
:meth:`Observer.on_status`), and each decides on its own:

- **stall**: rank j is stalled when it has called nothing (no post, flush,
  helper or shutdown in progress or submitted) for ``stall_warning_seconds``
  while another rank was waiting in a call or kept posting. Every rank logs a
  warning naming j (again every ``stall_warning_seconds``); past
  ``stall_shutdown_seconds`` (0 = never) every rank fails with
  :class:`~hvd_partial.observe.stall.StalledRankError` naming j, j itself too.
  Ranks that all stop calling (an evaluation phase, say) are not stalled.
  When every rank has waited that long in a call (they wait for each other:
  a blocking call that not every rank makes), that deadlock is reported the
  same way, listing each rank's call; the error then names no rank.
- **report**: rank 0 logs the slow-rank report at INFO every ``report_seconds``.

Example::

    HVD_PARTIAL_STALL_WARNING_SECONDS=30 HVD_PARTIAL_LOG_LEVEL=INFO mpiexec -n 4 python train.py
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..core.activation import binomial_children, max_hops
from .report import enrich, format_report
from .stall import StalledRankError

log = logging.getLogger("hvd_partial.report")
stall_log = logging.getLogger("hvd_partial.stall")

TAG_STATUS = 15  # beside the transport's tags 11-14
_WINDOW = 512  # recent posts per stream kept for means and p95
# Statuses older than this many status periods are left out of the stall rule.
_STALE_PERIODS = 5


@dataclass(frozen=True)
class RankStatus:
    """What a rank tells the others about itself (by the statuses' tree).

    ``idle_seconds``: since its latest call was submitted (since ``init`` if
    none); ``busy``: a call of it is in progress; ``streams``: name ->
    (posts, wait mean s, wait p95 s, compute mean s or None).
    """

    rank: int
    idle_seconds: float
    busy: bool
    last_call: str
    streams: dict


@dataclass(frozen=True)
class StatusBundle:
    """Statuses on their way up the binomial tree rooted at rank 0 (from a
    child: its subtree's) or down it (from the parent: every rank's).

    ``entries``: ``(status, age)`` pairs, ``age`` the seconds since its rank
    made it, as the sender's clock tells; the receiver's clock then dates it.
    """

    entries: tuple
    down: bool


def binomial_parent(rank: int) -> int | None:
    """The parent of ``rank`` in :func:`binomial_children`'s tree rooted at 0."""
    return rank - (1 << (rank.bit_length() - 1)) if rank > 0 else None


def binomial_subtree(rank: int, world_size: int) -> frozenset:
    """``rank`` and every rank below it in the tree rooted at 0."""
    out, todo = set(), [rank]
    while todo:
        v = todo.pop()
        out.add(v)
        todo += binomial_children(v, 0, world_size)
    return frozenset(out)


class _Window:
    __slots__ = ("posts", "waits", "computes", "last_finish")

    def __init__(self):
        self.posts = 0
        self.waits: deque = deque(maxlen=_WINDOW)
        self.computes: deque = deque(maxlen=_WINDOW)
        self.last_finish: float | None = None

    def figures(self) -> tuple:
        waits = np.fromiter(self.waits, dtype=float, count=len(self.waits))
        mean = float(waits.mean()) if waits.size else 0.0
        p95 = float(np.percentile(waits, 95)) if waits.size else 0.0
        compute = float(sum(self.computes) / len(self.computes)) if self.computes else None
        return self.posts, mean, p95, compute


def status_interval(config) -> float | None:
    """Seconds between status messages, or None when nothing needs them."""
    candidates = []
    if config.stall_warning_seconds > 0:
        candidates.append(config.stall_warning_seconds / 4)
    if config.stall_shutdown_seconds > 0:
        candidates.append(config.stall_shutdown_seconds / 4)
    if config.report_seconds > 0:
        candidates.append(config.report_seconds / 2)
    if not candidates:
        return None
    return min(max(min(candidates), 0.05), 5.0)


class Observer:
    """Attached to an engine by :func:`hvd_partial.observe.attach_observer`."""

    def __init__(self, engine, timeline=None):
        # A proxy, not a reference: the engine owns its observer, and a cycle
        # between them would keep every shut-down engine (with its result
        # buffers) alive until a full garbage collection, which rarely comes.
        self.engine = weakref.proxy(engine)
        self.config = engine.config
        self.rank = engine.rank
        self.size = engine.size
        self.timeline = timeline
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._last_submit = self._started
        self._last_call = "init"
        self._windows: dict[str, _Window] = {}
        # rank -> (status, when that rank made it, by this rank's perf_counter)
        self._peers: dict[int, tuple[RankStatus, float]] = {}
        self._interval = status_interval(self.config)
        # The statuses' tree: up to the parent, rank 0's picture down to the children.
        self._parent = binomial_parent(self.rank)
        self._children = binomial_children(self.rank, 0, self.size)
        self._subtree = binomial_subtree(self.rank, self.size)
        # A child's news goes up at once, but at most once per this many seconds:
        # up to ceil(log2 P) + 1 messages per status period, each level passed within
        # the gap (the whole way up within about one period).
        self._up_gap = (self._interval or 0.0) / max(1, max_hops(self.size))
        self._last_up = float("-inf")
        self._news_from_below = False
        self._next_status = self._started
        self._report_every = self.config.report_seconds
        self._next_report = self._started + self._report_every if self._report_every > 0 else float("inf")
        self._last_report_rounds: dict[str, tuple[int, float]] = {}
        self._demand_since: dict[int, float] = {}
        self._warned_at: dict[int, float] = {}
        self.stalled: dict[int, float] = {}  # rank -> seconds stalled, at the latest check
        self._closed = False

    # ===== engine hooks (engine thread) ============================================

    def on_call(self, handle, description: str, post_stream: str | None = None) -> None:
        """A call was submitted: ``description`` names it (``post 'g'``);
        ``post_stream`` is the stream of a post."""
        self._last_submit = handle.posted_at
        self._last_call = description
        if self.timeline is not None and post_stream is not None:
            self.timeline.post(post_stream, handle.posted_at)

    def on_finish(self, stream: str, waiter) -> None:
        handle = waiter.handle
        if waiter.kind == "post":
            window = self._windows.get(stream)
            if window is None:
                with self._lock:
                    window = self._windows[stream] = _Window()
            finished = handle.finished_at
            window.posts += 1
            window.waits.append(finished - handle.posted_at)
            if window.last_finish is not None:
                window.computes.append(max(handle.posted_at - window.last_finish, 0.0))
            window.last_finish = finished
        if self.timeline is not None:
            self.timeline.finished(stream, waiter.kind, handle, [r.round for r in waiter.results])

    def on_status(self, source: int, bundle: StatusBundle) -> None:
        """Statuses from a child (its subtree's, passed up soon after) or from
        the parent (every rank's, passed down at once). Per rank and status
        period: at most ``ceil(log2 P) + 1`` bundles sent up and one down to
        each child (``ceil(log2 P)`` at most); they reach every rank within
        about three status periods of being made (see docs/design.md)."""
        now = time.perf_counter()
        for status, age in bundle.entries:
            if status.rank != self.rank:
                self.record(status, now - age)
        if bundle.down:
            self._send_down(now)
        elif self._parent is not None:  # rank 0 sends its picture down at its own period
            self._news_from_below = True

    def tick(self) -> None:
        """Called by the engine every 10 ms or so."""
        now = time.perf_counter()
        if self.timeline is not None:
            self.timeline.tick(now)
        if self._interval is not None and now >= self._next_status:
            self._next_status = now + self._interval
            self._send_status(now)
            if self.config.stall_warning_seconds > 0 or self.config.stall_shutdown_seconds > 0:
                self.inspect(now)
        elif self._news_from_below and now - self._last_up >= self._up_gap:
            self._send_up(now)
        if now >= self._next_report:
            self._next_report = now + self._report_every
            if self.rank == 0 and log.isEnabledFor(logging.INFO):
                log.info("hvd_partial slow-rank report after %.1f s:\n%s", now - self._started,
                         self.report_text(now))

    def rebase(self, rank: int, size: int) -> None:
        """The world shrank (elastic training): this rank is ``rank`` of ``size``; the
        statuses' tree is the new world's and what was known of peers is forgotten."""
        with self._lock:
            self.rank, self.size = rank, size
            self._parent = binomial_parent(rank)
            self._children = binomial_children(rank, 0, size)
            self._subtree = binomial_subtree(rank, size)
            self._up_gap = (self._interval or 0.0) / max(1, max_hops(size))
            self._peers.clear()
            self._demand_since.clear()
            self._warned_at.clear()
            self.stalled = {}
            self._news_from_below = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.rank == 0 and self._report_every > 0 and log.isEnabledFor(logging.INFO):
            try:
                log.info("hvd_partial final slow-rank report:\n%s", self.report_text(time.perf_counter()))
            except Exception:  # noqa: BLE001 - never fail a shutdown over a report
                log.exception("could not build the final report")
        if self.timeline is not None:
            self.timeline.close()

    # ===== status and stall inspector ================================================

    @property
    def interval(self) -> float | None:
        """Seconds between two statuses of this rank (None: statuses are off)."""
        return self._interval

    @property
    def peers(self) -> dict[int, tuple[RankStatus, float]]:
        """A copy of what this rank knows: rank -> (its newest status, when it was made)."""
        with self._lock:
            return dict(self._peers)

    def record(self, status: RankStatus, made: float) -> None:
        """Keep ``status`` (made at ``made``, this rank's perf_counter) unless a newer one is known."""
        with self._lock:
            known = self._peers.get(status.rank)
            if known is None or made > known[1]:
                self._peers[status.rank] = (status, made)

    def _own_status(self, now: float) -> RankStatus:
        busy = self.engine.busy
        with self._lock:
            windows = list(self._windows.items())
        return RankStatus(self.rank, now - self._last_submit, busy, self._last_call,
                          {name: w.figures() for name, w in windows})

    def _send_status(self, now: float) -> None:
        status = self._own_status(now)
        self.record(status, now)
        if self._parent is None:
            self._send_down(now)
        else:
            self._send_up(now)

    def _entries(self, now: float, ranks=None) -> tuple:
        with self._lock:
            return tuple((status, now - made) for j, (status, made) in self._peers.items()
                         if ranks is None or j in ranks)

    def _send_up(self, now: float) -> None:
        """This rank's subtree's statuses, to its parent."""
        self._last_up = now
        self._news_from_below = False
        self.engine.tell(self._parent, TAG_STATUS, StatusBundle(self._entries(now, self._subtree), down=False))

    def _send_down(self, now: float) -> None:
        """Every status this rank knows, to its children."""
        if self._children:
            bundle = StatusBundle(self._entries(now), down=True)
            for child in self._children:
                self.engine.tell(child, TAG_STATUS, bundle)

    def inspect(self, now: float) -> None:
        """Find stalled ranks; warn, or fail past the shutdown time."""
        # A status older than _STALE_PERIODS periods (about three is the most a
        # running tree takes) means its rank, or one on its way up the tree, has
        # stopped running: that is for liveness to name, not the stall rule.
        limit = _STALE_PERIODS * self._interval
        with self._lock:
            peers = {j: entry for j, entry in self._peers.items() if now - entry[1] <= limit}
        if len(peers) < 2:
            return
        recent = 2.5 * self._interval
        last_submit = {j: made - st.idle_seconds for j, (st, made) in peers.items()}
        active = {j for j, (st, made) in peers.items() if st.busy or now - last_submit[j] < recent}
        warn_after = self.config.stall_warning_seconds or self.config.stall_shutdown_seconds
        stalled = {}
        for j, (st, made) in peers.items():
            others = active - {j}
            if st.busy or not others or now - last_submit[j] < recent:
                self._demand_since.pop(j, None)
                self._warned_at.pop(j, None)
                continue
            since = self._demand_since.get(j)
            if since is None or since < last_submit[j]:
                # Others are active while j calls nothing: the stall clock starts
                # when both were true, as far as the statuses tell.
                since = self._demand_since[j] = max(last_submit[j], now - self._interval)
            seconds = now - since
            if seconds < warn_after:
                continue
            stalled[j] = seconds
            waiting = sorted(others)
            posting = [k for k in waiting if peers[k][0].busy and str(peers[k][0].last_call).startswith("post")]
            reason = (f"rank {j} has called no hvd_partial function for {seconds:.1f} s (last call: "
                      f"{st.last_call}, {now - last_submit[j]:.1f} s ago) while rank(s) "
                      f"{', '.join(map(str, waiting))} wait or keep posting")
            if posting:
                # a rank parked in a collective holds nobody back; one that calls nothing does
                reason += (f"; the posts of rank(s) {', '.join(map(str, posting))} wait for it under the "
                           f"staleness bound (max_staleness rounds ahead of its last post): rank {j} is absent, "
                           "not waiting in a collective")
            shutdown = self.config.stall_shutdown_seconds
            if shutdown > 0 and seconds >= shutdown:
                stall_log.error("rank %d: %s; stall_shutdown_seconds=%g: failing every rank", self.rank,
                                reason, shutdown)
                # No notice to the others: each rank reaches this verdict from the same
                # statuses within one status period, and raises StalledRankError itself.
                self.engine.fail(StalledRankError(j, f"stalled: {reason} (stall_shutdown_seconds={shutdown:g})"),
                                  notify=False)
                return
            last = self._warned_at.get(j)
            if self.config.stall_warning_seconds > 0 and (last is None or now - last >= warn_after):
                self._warned_at[j] = now
                stall_log.warning("rank %d: stall: %s (stall_warning_seconds=%g%s)", self.rank, reason,
                                  self.config.stall_warning_seconds,
                                  f", every rank fails after {shutdown:g} s" if shutdown > 0 else "")
        self.stalled = stalled
        self._inspect_deadlock(now, peers, last_submit, warn_after)

    def _inspect_deadlock(self, now, peers, last_submit, warn_after) -> None:
        """Every rank waiting in a call, none submitting anything: they wait for each other."""
        if len(peers) < self.size or not all(st.busy for st, _ in peers.values()):
            self._warned_at.pop(-1, None)
            return
        waited = min(now - last_submit[j] for j in peers)
        if waited < warn_after:
            return
        calls = ", ".join(f"rank {j} in {peers[j][0].last_call}" for j in sorted(peers))
        reason = (f"deadlock: every rank has waited {waited:.1f} s or more in an hvd_partial call ({calls}); "
                  "look for a blocking call (a sync stream, flush, barrier or helper) that not every rank "
                  "makes, or that ranks make in another order")
        in_posts = [j for j in sorted(peers) if str(peers[j][0].last_call).startswith("post")]
        if in_posts and len(in_posts) < len(peers):
            # a partial stream's post never waits for a rank parked in another call: a sync one does
            reason += (f"; the posts of rank(s) {', '.join(map(str, in_posts))} wait for ranks in other calls: "
                       "a sync stream's post waits for every rank's post of it")
        shutdown = self.config.stall_shutdown_seconds
        if shutdown > 0 and waited >= shutdown:
            stall_log.error("rank %d: %s; stall_shutdown_seconds=%g: failing every rank", self.rank, reason, shutdown)
            self.engine.fail(StalledRankError(None, f"{reason} (stall_shutdown_seconds={shutdown:g})"), notify=False)
            return
        last = self._warned_at.get(-1)
        if self.config.stall_warning_seconds > 0 and (last is None or now - last >= warn_after):
            self._warned_at[-1] = now
            stall_log.warning("rank %d: %s (stall_warning_seconds=%g)", self.rank, reason,
                              self.config.stall_warning_seconds)

    # ===== report ==================================================================

    def enrich(self, snapshot: dict) -> dict:
        """Add the per-rank figures to a ``StatsRecorder.snapshot()`` (any thread)."""
        now = time.perf_counter()
        with self._lock:
            statuses = {j: st for j, (st, _) in self._peers.items()}
            windows = list(self._windows.items())
        # This rank's own figures are always current.
        statuses[self.rank] = RankStatus(self.rank, now - self._last_submit, False, self._last_call,
                                         {name: w.figures() for name, w in windows})
        out = enrich(snapshot, statuses, self.size, now - self._started)
        for stream in out.values():
            stream["stalled_ranks"] = dict(self.stalled)
        return out

    def report_text(self, now: float) -> str:
        snapshot = self.enrich(self.engine.stats.snapshot())
        rates = {}
        for name, s in snapshot.items():
            rounds0, t0 = self._last_report_rounds.get(name, (0, self._started))
            rates[name] = (s["rounds"] - rounds0) / max(now - t0, 1e-9)
            self._last_report_rounds[name] = (s["rounds"], now)
        return format_report(snapshot, rates, self.stalled)
