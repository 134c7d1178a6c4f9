"""The facts every round carries inside its reduction, and the view of the
next round that every rank derives from them.

Each rank fills its own column of a ``(FIELDS, P)`` int64 array when it joins
a round; the reduction sums the arrays, so every rank ends the round with the
same facts and derives the same :class:`RoundView` for the next round with
vector operations only (no Python loop over ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# rows of the facts array
STALENESS = 0  # 0 if the rank summed no data, else 1 + round minus the round its oldest summed post was computed for
KNOWN_TAKEN = 1  # rounds it had taken when it joined, plus 1 if a post of it waited for a round then
FLUSHING = 2  # if it was flushing when it joined: which of its flushes (1, 2, ...), else 0
INITIATED = 3  # 1 if it started the round itself
PARKED = 4  # 1 if it joined while parked: waiting in a call that needs every rank, with nothing to post here
FIELDS = 5
# FLUSHING of a rank whose shutdown flushed the stream: it posts no more, so it
# takes part in every later flush round (above any flush number) and never trains again.
LEFT = 1 << 40


def empty_facts(world_size: int) -> np.ndarray:
    return np.zeros((FIELDS, world_size), dtype=np.int64)


@dataclass(slots=True)
class RoundView:
    """What every rank knows, identically, about round ``round`` before it starts.

    ``known_taken[j]`` is a lower bound on the rounds rank ``j`` has taken
    before any later post of it (its taken count when it joined the last
    round, plus one if a post of it was waiting then: that post takes the
    round it waits for before ``j`` can post again). ``blockers`` are the
    training ranks that, by this knowledge, hold the round back under the
    staleness bound; ``training`` the ranks not flushing. ``after_flush``
    says the previous round was the flush round (every rank joined it
    flushing), after which every rank trains again, but for those that left
    (shut down). ``parked`` ranks joined the last round while waiting in a
    call that needs every rank (a helper collective, another stream's flush):
    they count as training for flushes, but never block a round and, like a
    flushing rank, stand in for majority's initiator and leave the quorum.
    """

    round: int
    training: np.ndarray  # sorted ranks not flushing
    blockers: np.ndarray  # sorted training ranks with known_taken < round - tau + 1
    known_taken: np.ndarray
    flushing: np.ndarray  # bool per rank
    registration: bool = False  # round 0: every rank must post first
    after_flush: bool = False
    parked: np.ndarray | None = None  # bool per rank, or None: nobody is parked
    active: int = -1  # training ranks not parked (-1: all of training); the quorum's "ranks still training"

    def stands_in(self, rank: int) -> bool:
        """Whether ``rank`` starts no round by posting (it is flushing or parked)."""
        return bool(self.flushing[rank]) or (self.parked is not None and bool(self.parked[rank]))

    def is_parked(self, rank: int) -> bool:
        return self.parked is not None and bool(self.parked[rank])

    def active_count(self) -> int:
        return len(self.training) if self.active < 0 else self.active

    @classmethod
    def registration_view(cls, world_size: int) -> "RoundView":
        everyone = np.arange(world_size)
        return cls(0, everyone, everyone, np.zeros(world_size, np.int64), np.zeros(world_size, bool),
                   registration=True)

    @classmethod
    def after(cls, round_number: int, facts: np.ndarray, max_staleness: int, flushes_done: int = 0,
              last_flush_round: int = -1) -> "RoundView":
        """The view of round ``round_number + 1`` from round ``round_number``'s reduced facts.

        ``flushes_done`` counts the flush rounds completed up to and including
        ``round_number`` (the last of them was ``last_flush_round``). A rank
        can join a round before it completed the flush round before it: its
        column then still says flushing, in a flush that is over. It is
        training, and its flush took every round up to that flush round."""
        r = round_number + 1
        P = facts.shape[1]
        flushing_row = facts[FLUSHING]
        parked_row = facts[PARKED]
        if np.count_nonzero(parked_row):
            return cls._with_parked(r, facts, max_staleness, flushes_done, last_flush_round, parked_row > 0)
        if not np.count_nonzero(flushing_row):
            # Nobody joined flushing (the steady state): everyone trains. (argmin skips the
            # ufunc reduction machinery of min(), about 0.5 us: this runs every round.)
            known = facts[KNOWN_TAKEN]
            lowest = r - max_staleness + 1
            blockers = _EMPTY if known[known.argmin()] >= lowest else np.flatnonzero(known < lowest)
            return cls(r, _everyone(P), blockers, known, _nobody(P))
        if is_flush_round(facts, flushes_done - 1) and last_flush_round == round_number:
            # the flush round: every rank took everything and trains again, but for those that left
            left = flushing_row == LEFT
            training = np.flatnonzero(~left)
            blockers = training if max_staleness == 0 else np.zeros(0, np.int64)  # r < r - tau + 1 iff tau = 0
            return cls(r, training, blockers, np.full(P, r, np.int64), left, after_flush=True)
        flushing = facts[FLUSHING] > flushes_done
        known = facts[KNOWN_TAKEN]
        over = (facts[FLUSHING] > 0) & ~flushing
        known = np.where(over, np.maximum(known, last_flush_round + 1), known)
        training = ~flushing
        blockers = np.flatnonzero(training & (known < r - max_staleness + 1))
        return cls(r, np.flatnonzero(training), blockers, known, flushing)

    @classmethod
    def _with_parked(cls, r: int, facts: np.ndarray, max_staleness: int, flushes_done: int,
                     last_flush_round: int, parked: np.ndarray) -> "RoundView":
        """:meth:`after` where some rank joined the last round parked: a flush
        round has none (each of its ranks was flushing this stream)."""
        view = cls.after(r - 1, _unparked(facts), max_staleness, flushes_done, last_flush_round)
        parked = parked & ~view.flushing
        view.parked = parked
        view.blockers = view.blockers[~parked[view.blockers]]
        view.active = int(np.count_nonzero(~view.flushing & ~parked))
        return view


def _unparked(facts: np.ndarray) -> np.ndarray:
    out = facts.copy()
    out[PARKED] = 0
    return out


def is_flush_round(facts: np.ndarray, flushes_before: int) -> bool:
    """Every rank joined the round flushing, in the flush after the
    ``flushes_before`` completed ones (or having left, which matches any
    flush): the round sums every pending post."""
    row = facts[FLUSHING]
    n = flushes_before + 1
    if row[0] != n and row[0] != LEFT:
        return False
    return bool(((row == n) | (row == LEFT)).all())


def round_facts(facts: np.ndarray, flushes_before: int = 0):
    """``(staleness row, initiator, flush)`` of a reduced facts array, after
    ``flushes_before`` completed flush rounds (the row is
    :class:`~hvd_partial.core.round_result.RoundResult`'s: 0 for a rank that
    summed nothing, else 1 plus its lateness)."""
    flush = is_flush_round(facts, flushes_before)
    initiated = facts[INITIATED]
    first = int(initiated.argmax())  # the lowest rank that started the round, if any did
    initiator = None if flush or not initiated[first] else first
    return facts[STALENESS], initiator, flush


# Shared read-only arrays of the steady-state view, one per world size.
_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False
_EVERYONE: dict[int, np.ndarray] = {}
_NOBODY: dict[int, np.ndarray] = {}


def _everyone(P: int) -> np.ndarray:
    out = _EVERYONE.get(P)
    if out is None:
        out = _EVERYONE[P] = np.arange(P)
        out.flags.writeable = False
    return out


def _nobody(P: int) -> np.ndarray:
    out = _NOBODY.get(P)
    if out is None:
        out = _NOBODY[P] = np.zeros(P, bool)
        out.flags.writeable = False
    return out


def lags(round_number: int, known_taken: np.ndarray) -> list:
    """Per rank, how many rounds it had not taken when it joined round
    ``round_number`` (its facts' ``KNOWN_TAKEN`` row; a waiting post counts as taken)."""
    return np.maximum(round_number - known_taken, 0).tolist()
