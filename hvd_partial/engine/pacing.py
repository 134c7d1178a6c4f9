"""The engine's idle/wake policy: what the engine thread does after a step
that found no work, and how compute threads and peers wake it.

It never blocks in MPI; it polls with a back-off, so the training threads
keep their CPU. A sleeping engine is woken by a compute thread's poke (its
doorbell where the transport has one, else a lock) or a peer's ring. The
measurements behind these choices are in docs/history/engine-performance.md.
"""

from __future__ import annotations

import os
import threading
import time

# While a reduction is in flight the engine tests only it for this long before
# looking at commands and control messages again (bounds their extra latency).
_FOCUS_SECONDS = 2e-4
# How long a post waiting for its round to start is watched continuously
# before the engine naps (shorter: the designated rank's jitter costs naps).
_START_PATIENCE_SECONDS = 3e-3
# A nap lasts this fraction of the time waited so far (see
# nap_while_waiting for its bounds): a message that comes mid-nap without a
# ring is seen at most that much later, relative to the wait, while a long
# wait costs few wake-ups.
_NAP_FRACTION = 0.25
_NAP_MIN_SECONDS = 5e-5
# With doorbells, the short naps an engine takes after a wake-up that found
# nothing, before it sleeps doorbell_poll_ms at a time again (idle: a back-off
# from 40 us, about 1.2 ms in all; waiting for a round: naps of idle_poll_ms).
_RECHECKS = 5


# reduce_poll_us=-1: the spacing of a long reduction's tests where a host's ranks
# outnumber its cores (docs/history/engine-performance.md, issue 36 part 2).
_OVERSUBSCRIBED_REDUCE_POLL_US = 200.0


def reduce_poll_us(configured: float, local_size: int, cores: int) -> float:
    """The spacing of a long reduction's tests (``Config.reduce_poll_us``):
    ``configured`` where set (>= 0), else (-1) 200 microseconds where the
    host's ``local_size`` ranks outnumber the ``cores`` this process may use,
    0 otherwise."""
    if configured >= 0:
        return configured
    return _OVERSUBSCRIBED_REDUCE_POLL_US if local_size > cores else 0.0


def usable_cores() -> int:
    """How many cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Pacing:
    """Sleep and wake-up of one engine thread.

    ``commands`` is the command queue (non-empty: a compute thread queued one).
    ``awaiting_start(stream_id, round)`` says whether this rank joined a round
    before hearing that it started (a majority round joined early).
    """

    def __init__(self, config, bell, size: int, relays_activations: bool, commands, awaiting_start=None):
        self._bell = bell
        # awaiting_start(stream id, round): this rank joined the round before it started
        self._awaiting_start = awaiting_start
        self._bell_covers_all = bell is not None and bell.reachable == size - 1
        self._bell_poll = config.doorbell_poll_ms / 1000.0
        self._nap_max = config.idle_poll_ms / 1000.0
        self._spin = config.spin_us / 1e6
        self._poll_max = config.idle_poll_ms / 1000.0
        if relays_activations and (bell is None or bell.reachable < size - 1):
            self._poll_max /= 4  # other ranks' activations pass through here, not all by doorbell
        self._commands = commands
        # Unlocked means "a wake-up is pending": a bare lock is much cheaper to
        # hand between threads than threading.Event, and every post passes here.
        self._wake = threading.Lock()
        # True only while the engine thread sleeps: compute threads wake it
        # (a syscall on each side) only then. It is set before the thread's
        # last look at the command queue, so no command can slip by unseen.
        self._asleep = False
        self._idle = 0
        self._recheck = 0  # short naps left after a wake-up that found nothing yet
        self._awake_until = 0.0
        # Short naps left after a nap that a ring ended, until a step finds work: the
        # ring may precede its message in MPI. Counted down, since a ring can also come
        # after its message was taken (a stale ring), and then no work ever follows.
        self._rung_naps_left = 0
        self.unsent = 0  # control messages still queued in MPI after the last step
        self.naps = 0  # naps taken while a call waited (read by tests and benchmarks)

    @property
    def asleep(self) -> bool:
        """The engine thread sleeps now (idle, or napping while a call waits)."""
        return self._asleep

    # -- compute-thread side ----------------------------------------------------------

    def poke(self) -> None:
        """Wake the engine thread if it sleeps (it sees the change otherwise)."""
        if not self._asleep:
            return
        if self._bell is not None:
            self._bell.poke()
            return
        try:
            self._wake.release()
        except RuntimeError:  # already unlocked: a wake-up is pending anyway
            pass

    # -- engine thread ------------------------------------------------------------------

    def take_ring(self) -> bool:
        """A peer rang since the last look (a message is probably there)."""
        return self._bell is not None and self._bell.take_ring()

    def worked(self) -> None:
        """The last step found work: stay awake a little, more usually follows."""
        self._idle = self._recheck = 0
        self._rung_naps_left = 0
        self._awake_until = time.perf_counter() + self._spin

    def rest(self, reductions, helper_busy: bool, oldest_wait: float | None, timer: float | None = None) -> None:
        """After a step that found no work. ``oldest_wait``: when the oldest
        call still waiting was made (None: no call waits); ``timer``: when the
        engine's next timer (an activation delay) ends, if one runs."""
        self._idle += 1
        idle = self._idle
        if reductions.in_flight:
            if (oldest_wait is not None and self._awaiting_start is not None
                    and time.perf_counter() - oldest_wait >= _START_PATIENCE_SECONDS
                    and reductions.only_awaiting_start(self._awaiting_start)):
                # Joined early, and the designated rank is late: nothing can finish before it
                # joins, and its flood (at once, or after its activation delay) rings this rank.
                # Nap like a post waiting for its round; each step tests the reductions.
                self.nap_while_waiting(oldest_wait, timer)
                return
            # A reduction progresses only inside MPI calls: stay in them
            # and look at the rest now and then.
            reductions.poll(time.perf_counter() + _FOCUS_SECONDS, self._commands)
        elif helper_busy:
            # A helper collective in progress needs this engine in MPI.
            if idle < 5000:
                os.sched_yield()
            else:
                time.sleep(1e-4)
        elif oldest_wait is not None:
            # A compute thread waits for a round to start: look closely for
            # a while, yielding (a doorbell's wake-up is slow); a longer wait
            # is for another rank's computation, so nap and leave it the CPU.
            self.nap_while_waiting(oldest_wait, timer)
        elif time.perf_counter() < self._awake_until:
            # Work just happened and more usually follows (the next post of a
            # training loop): stay awake a little, yielding, rather than pay a wake-up.
            os.sched_yield()
        elif self._bell is not None:
            self._sleep_on_bell(idle)
        else:
            self._asleep = True
            self._wake.acquire(blocking=False)  # consume a pending wake-up
            if not self._commands:
                self._wake.acquire(timeout=min(self._poll_max, 2e-5 * idle))
            self._asleep = False

    def _sleep_on_bell(self, idle: int) -> None:
        # Nothing in flight: sleep, but wake at once on a new command
        # or a peer's urgent message, then poll closely again.
        if self._bell_covers_all and not self.unsent and not self._recheck:
            # Every message that needs this engine rings it and every post
            # pokes it: the timer only catches a lost ring. Rings of messages
            # already handled are consumed first rather than woken for.
            if self._bell.drain():
                return
            nap = self._bell_poll
        else:
            # Without doorbells from every peer, after a wake-up that found
            # nothing (a ring ahead of its message), or while this rank's own
            # sends are queued in MPI (only its MPI calls move them): back off.
            nap = min(self._poll_max, 2e-5 * (1 << min(idle, 20)))
            self._recheck = max(0, self._recheck - 1)
        self._asleep = True
        if not self._commands and self._bell.wait(nap):
            self._idle = 0
            self._recheck = _RECHECKS
        self._asleep = False

    def nap_while_waiting(self, since: float, until: float | None = None) -> None:
        """While a post waits for its round to start: yield the CPU once or,
        when the wait began over 3 ms ago (the oldest waiting call was made
        at ``since``), nap a quarter of the time waited: from 50 us up to
        ``doorbell_poll_ms`` where every peer can ring this rank's doorbell,
        else up to ``idle_poll_ms``, and never past ``until`` (the engine's
        next timer, whose end is work for this rank).

        Such a wait is for another rank's computation (a majority round's
        designated rank, a laggard holding the staleness bound); the round's
        start rings this rank's doorbell, so a nap ends at once, and the
        ranks waited for keep the CPU.
        """
        waited = time.perf_counter() - since
        if waited < _START_PATIENCE_SECONDS:
            os.sched_yield()
            return
        # Where every peer rings, the nap only bounds the delay of a lost ring;
        # it stays short while this rank's sends are queued and for a few naps
        # after a ring that found no message yet (a ring can come before MPI shows it).
        long_ok = self._bell_covers_all and not self.unsent and not self._rung_naps_left
        self._rung_naps_left = max(0, self._rung_naps_left - 1)
        nap = min(self._bell_poll if long_ok else self._nap_max, max(_NAP_MIN_SECONDS, _NAP_FRACTION * waited))
        if until is not None:
            nap = max(0.0, min(nap, until - time.perf_counter()))
        if self._nap(nap):
            self._rung_naps_left = _RECHECKS

    def _nap(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; a new command wakes the engine at once, and
        so does a peer's ring where there is a doorbell. True if woken so."""
        self.naps += 1
        self._asleep = True
        try:
            if self._bell is not None:
                return bool(self._commands) or self._bell.wait(seconds)
            self._wake.acquire(blocking=False)  # consume a pending wake-up
            return bool(self._commands) or self._wake.acquire(timeout=seconds)
        finally:
            self._asleep = False
