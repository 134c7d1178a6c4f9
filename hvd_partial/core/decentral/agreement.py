"""What every rank agrees on once, without a coordinator: a stream's
registration, a sync stream's flush round, and shutdown.

Each agreement is a binomial gather over all ranks (root 0, see
:mod:`.gather`) whose outcome the root floods over the hypercube (as
:mod:`hvd_partial.core.activation` floods rounds). Per agreement a rank sends
at most one report and receives at most ``ceil(log2 P)``, and sends and
receives at most ``ceil(log2 P)`` copies of the outcome: rank 0 is the root
of the trees, not a coordinator that hears from every rank.

- **Registration** (key ``("register", name, n)``, after ``n`` rejections of
  that name): every rank's first post to
  ``name`` reports the stream's signature. Each rank compares its children's
  signatures with its own, so the root learns the first two ranks that
  disagree, if any, and floods ``Rejected(reason, name)``, or else
  ``Registered(name, id)``. Ids follow the order in which the root completed
  registrations; they order the streams' communicators on every rank.
- **A sync stream's k-th flush** (keys ``("begun", id, k)`` and
  ``("flush", id, k)``): a rank that flushes floods ``FlushBegun`` unless it
  heard another rank's (a rank that posted more rounds then fails instead of
  waiting); once every rank flushes, the root floods the flush round's ``Start``.
- **Shutdown**, two gathers: ``("leave",)`` once every rank is leaving, with
  which ranks posted each stream name, so that a stream some ranks never
  posted (it would never register) is rejected; then ``("closed",)`` once
  every rank's own shutdown is done (all its flushes complete): the root
  floods ``Closed`` and the engines may stop.

Pure: no MPI, no clocks. ``send(dest, message)`` reaches a peer;
``deliver(message)`` hands an outcome to this rank's driver.

Example::

    agreements = Agreements(rank=0, size=1, send=..., deliver=print)
    agreements.register("g", signature)   # prints Registered(name='g', stream=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import EngineError
from ..activation import hypercube_neighbours
from ..messages import Closed, FlushBegun, Registered, Rejected, Start
from .gather import Gather

__all__ = ["Agreements", "AgreementReport", "AgreementOutcome"]


@dataclass(frozen=True, slots=True)
class AgreementReport:
    """Gather report: the sender (at ``position``) and its subtree are ready for
    agreement ``key``; ``payload`` sums up what the subtree brings."""

    key: tuple
    position: int
    payload: Any = None

    def __reduce__(self):
        return AgreementReport, (self.key, self.position, self.payload)


@dataclass(frozen=True, slots=True)
class AgreementOutcome:
    """The root's decision on agreement ``key``, flooded over the hypercube:
    a driver message, or for shutdown's first gather a tuple of ``Rejected``."""

    key: tuple
    message: Any

    def __reduce__(self):
        return AgreementOutcome, (self.key, self.message)


class _Open:
    __slots__ = ("gather", "payload")

    def __init__(self, gather: Gather, payload):
        self.gather = gather
        self.payload = payload


class Agreements:
    """One rank's side of every agreement (see the module docstring)."""

    def __init__(self, rank: int, size: int, send: Callable[[int, object], None],
                 deliver: Callable[[object], None]):
        self.rank = rank
        self.size = size
        self._send = send
        self._deliver = deliver
        self._order = np.arange(size)
        self.neighbours = hypercube_neighbours(rank, size)
        self._open: dict[tuple, _Open] = {}
        self._early: dict[tuple, list] = {}  # reports for agreements this rank has not begun
        self._heard: set[tuple] = set()  # outcomes heard (floods are forwarded once)
        self.outcomes: dict[tuple, object] = {}  # what each heard outcome said (re-told after a failure)
        self._begun: dict[tuple, object] = {}  # this rank's own reports, as it first made them
        self._next_id = 0  # at the root: the next stream id
        self._sync_flushes: dict[int, int] = {}  # sync stream id -> flushes begun here
        self._rejections: dict[str, int] = {}  # name -> registrations of it rejected (a name may be posted again)
        self._begin_later: list = []  # (key, payload) to begin once a rebase's outcomes were acted on
        self._left = False
        self._done = False  # this rank's own shutdown is done
        self._closing = False  # its report to ("closed",) is on its way

    # -- this rank's events ---------------------------------------------------------------

    def register(self, name: str, signature) -> None:
        """This rank's first post to ``name``."""
        self._begin(("register", name, self._rejections.get(name, 0)), (signature, self.rank, None))

    def sync_flush(self, stream: int, rounds: int) -> None:
        """This rank flushes sync stream ``stream`` after ``rounds`` rounds."""
        k = self._sync_flushes[stream] = self._sync_flushes.get(stream, 0) + 1
        self._outcome(("begun", stream, k), FlushBegun(stream, self.rank, rounds), source=None)
        self._begin(("flush", stream, k), None)

    def leave(self, names) -> None:
        """This rank shuts down; ``names``: every stream it ever posted."""
        if not self._left:
            self._left = True
            self._begin(("leave",), {name: frozenset([self.rank]) for name in names})

    def done(self) -> None:
        """This rank's shutdown is done but for the agreement that all are
        (it joins that gather once every rank is known to be leaving)."""
        if self._left and not self._done:
            self._done = True
            self._close_when_ready()

    def _close_when_ready(self) -> None:
        if self._done and not self._closing and ("leave",) in self._heard:
            self._closing = True
            self._begin(("closed",), None)

    # -- a failure: the survivors go on in a smaller world -----------------------------

    def rebased(self, rank: int, size: int, send: Callable[[int, object], None], deliver: Callable[[object], None],
                heard: dict, next_id: int) -> tuple["Agreements", list]:
        """The same agreements on the survivors' world, as ``rank`` of ``size``,
        and the outcomes this rank has still to act on. ``heard``: every outcome
        some survivor heard (the same on every survivor), which this rank adopts
        without flooding it again; ``next_id``: the next stream id to assign.
        Gathers in progress lost their reports with the old communicator: this
        rank's own reports that no outcome answered begin again."""
        new = Agreements(rank, size, send, deliver)
        new._next_id = next_id
        new._heard = set(self._heard)
        new.outcomes = dict(self.outcomes)
        new._sync_flushes = dict(self._sync_flushes)
        new._rejections = dict(self._rejections)
        new._left, new._done = self._left, self._done
        # registrations in stream id order (the order streams get their communicators), then the rest
        missed = sorted((key for key in heard if key not in self._heard),
                        key=lambda k: (0, heard[k].stream, "") if type(heard[k]) is Registered else (1, 0, str(k)))
        for key in missed:
            new._heard.add(key)
            new.outcomes[key] = heard[key]
        for key, payload in self._begun.items():
            if key in heard:
                continue
            kind = key[0]
            if kind == "register":
                payload = (payload[0], rank, None)
            elif kind == "leave":
                payload = {name: frozenset([rank]) for name in payload}
            elif kind == "closed":
                new._closing = True
            new._begin_later.append((key, payload))
        return new, [(key, heard[key]) for key in missed]

    def begin_again(self) -> None:
        """Begin the gathers :meth:`rebased` kept (after the missed outcomes were acted on)."""
        later, self._begin_later = self._begin_later, []
        for key, payload in later:
            self._begin(key, payload)

    def act_on(self, key: tuple, message) -> None:
        """Act on an outcome: one heard (after flooding it on), or one adopted by
        :meth:`rebased` (never flooded again)."""
        for decision in (message if key[0] == "leave" else (message,)):
            if type(decision) is Rejected:
                self._rejections[decision.name] = self._rejections.get(decision.name, 0) + 1
            self._deliver(decision)
        if key[0] == "leave":
            self._close_when_ready()

    # -- messages -------------------------------------------------------------------------

    def on_message(self, source: int, message) -> None:
        if type(message) is AgreementOutcome:
            self._outcome(message.key, message.message, source)
            return
        opened = self._open.get(message.key)
        if opened is None:
            self._early.setdefault(message.key, []).append(message)
            return
        self._apply(opened, message)
        self._progress(message.key, opened)

    # -- internals ------------------------------------------------------------------------

    def _begin(self, key: tuple, payload) -> None:
        if key in self._open or key in self._heard:  # pragma: no cover - a caller's bug
            raise EngineError(f"rank {self.rank}: agreement {key!r} begun twice")
        gather = Gather(key[0], self._order, self.rank)
        gather.ready = True
        self._begun[key] = payload
        opened = self._open[key] = _Open(gather, payload)
        for report in self._early.pop(key, ()):
            self._apply(opened, report)
        self._progress(key, opened)

    def _apply(self, opened: _Open, report: AgreementReport) -> None:
        opened.gather.child_reported(report.position)
        kind = opened.gather.kind
        if kind == "register":
            signature, first, mismatch = opened.payload
            if mismatch is None:
                child_signature, child_first, child_mismatch = report.payload
                if child_mismatch is not None:
                    mismatch = child_mismatch
                elif child_signature != signature:
                    mismatch = (first, signature, child_first, child_signature)
                opened.payload = (signature, first, mismatch)
        elif kind == "leave":
            posted = dict(opened.payload)
            for name, ranks in report.payload.items():
                posted[name] = posted.get(name, frozenset()) | ranks
            opened.payload = posted

    def _progress(self, key: tuple, opened: _Open) -> None:
        gather = opened.gather
        if gather.reported or not gather.complete():
            return
        gather.reported = True
        if not gather.is_root:
            self._send(gather.parent, AgreementReport(key, gather.position, opened.payload))
            return
        self._outcome(key, self._decide(key, opened.payload), source=None)

    def _decide(self, key: tuple, payload):
        kind = key[0]
        if kind == "register":
            name = key[1]
            signature, first, mismatch = payload
            if mismatch is not None:
                return Rejected(_disagreement(name, mismatch), name=name)
            self._next_id += 1
            return Registered(name, self._next_id - 1)
        if kind == "flush":
            return Start(key[1], None, None, flush=True)
        if kind == "leave":
            everyone = frozenset(range(self.size))
            return tuple(Rejected(f"stream {name!r} was posted on ranks {sorted(ranks)} but never on ranks "
                                  f"{sorted(everyone - ranks)} before shutdown", name=name)
                         for name, ranks in sorted(payload.items()) if ranks != everyone)
        return Closed()

    def _outcome(self, key: tuple, message, source: int | None) -> None:
        """Forward an outcome the first time it is heard, and act on it."""
        if key in self._heard:
            return
        self._heard.add(key)
        self.outcomes[key] = message
        self._open.pop(key, None)
        self._begun.pop(key, None)
        for n in self.neighbours:
            if n != source:
                self._send(n, AgreementOutcome(key, message))
        self.act_on(key, message)


def _disagreement(name: str, mismatch: tuple) -> str:
    a, sig_a, b, sig_b = mismatch
    diffs = sig_a.differences(sig_b) if hasattr(sig_a, "differences") else [f"{sig_a!r} vs {sig_b!r}"]
    return f"ranks disagree on stream {name!r}: rank {b} differs from rank {a} in " + "; ".join(diffs)
