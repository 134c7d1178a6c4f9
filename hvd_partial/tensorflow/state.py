"""The TensorFlow adapter's per-session state, kept in the running
:class:`~hvd_partial.session.Session` (its ``tensorflow`` field) so that
``shutdown()`` drops it and the next ``init()`` starts clean.

A ``tf.function`` traced before ``shutdown()`` keeps running after the next
``init()`` without being traced again, so what ``flush_tapes()`` needs (the
tape streams' exchanges and the optimizers that applied them) is entered at
run time, by every post and every applied hand-out, not only while tracing.

Example::

    from hvd_partial.tensorflow import state

    tf_state = state.require()            # NotInitializedError before init()
    found = tf_state.exchanges.get(name)  # under tf_state.lock
    if state.current() is None: ...       # no session: nothing was posted, claimed or registered
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import session as _session

if TYPE_CHECKING:  # annotations only: those modules import this one
    from .exchange import GradientExchange
    from .handoff import HandOut


@dataclass
class TensorFlowState:
    """What ``DistributedGradientTape``, the tape/optimizer hand-off and the
    exchanges remember between calls in one session. ``lock`` guards every field.

    - ``exchanges``: the tape streams' exchanges by stream name (tapes are
      made anew every step, their streams are not).
    - ``posted``: streams this process posted to in this session, across
      exchange objects (a reloaded Keras model's new optimizer posts to an
      already registered stream).
    - ``tape_streams``: tape streams in the order of their first use (the
      order ``flush_tapes()`` flushes them in).
    - ``default_names``: (process set id, ids of a set of sources) -> (the stream a tape
      without ``name=`` uses for them, the sources, kept alive so that their
      ids stay theirs).
    - ``handouts_by_tensor``: id of a tensor ``gradient()`` returned ->
      (its hand-out, its index among the sources); the hand-out keeps the
      tensor alive.
    - ``latest_handouts``: stream name -> its latest hand-out (an older one is
      dropped when a new one is made).
    - ``consumers``: stream name -> optimizer id -> (weak optimizer,
      variables, source indices): who applied the stream's hand-outs, for
      ``flush_tapes()``.
    - ``compiled_flushes``: the compiled update functions that apply flushed
      rounds through those optimizers.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    exchanges: dict[str, GradientExchange] = field(default_factory=dict)
    posted: set[str] = field(default_factory=set)
    tape_streams: list[str] = field(default_factory=list)
    default_names: dict[tuple, tuple[str, list]] = field(default_factory=dict)
    handouts_by_tensor: dict[int, tuple[HandOut, int]] = field(default_factory=dict)
    latest_handouts: dict[str, HandOut] = field(default_factory=dict)
    consumers: dict[str, dict[int, tuple]] = field(default_factory=dict)
    compiled_flushes: dict = field(default_factory=dict)

    def enter_tape_exchange(self, exchange: GradientExchange) -> GradientExchange:
        """Register a tape stream's exchange (the first one of a name stays) and
        the stream's place in ``tape_streams``; returns the registered exchange."""
        with self.lock:
            found = self.exchanges.setdefault(exchange.name, exchange)
            if exchange.name not in self.tape_streams:
                self.tape_streams.append(exchange.name)
            return found


def current() -> TensorFlowState | None:
    """The running session's TensorFlow state; None before ``init()``, after
    ``shutdown()`` and while the adapter has not run in this session."""
    s = _session.current()
    return None if s is None else s.tensorflow


def require() -> TensorFlowState:
    """The running session's TensorFlow state, made on first use
    (``NotInitializedError`` before ``init()`` or after ``shutdown()``)."""
    s = _session.require()
    with s.lock:
        if s.tensorflow is None:
            s.tensorflow = TensorFlowState()
        return s.tensorflow
