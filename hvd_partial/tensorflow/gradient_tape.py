"""``DistributedGradientTape``: a ``tf.GradientTape`` whose gradients are
reduced across ranks by a (partial) allreduce.

In ``Sync`` mode ``gradient()`` behaves as Horovod's: one averaged gradient per
call. In ``Solo`` and ``Majority`` mode one call can take several rounds (a
rank that was behind catches up with every round it missed), so the gradients
come as :class:`RoundGradients` that must all be applied, in order, for the
replicas to stay identical: use ``gradient_rounds()``.

Example (custom training loop, partial mode)::

    import hvd_partial.tensorflow as hvd

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, mode=hvd.Solo())
        tape.gradient_rounds(loss, model.trainable_variables).apply(optimizer)

    for x, y in data:
        step(x, y)
    hvd.flush_gradients().apply(optimizer, model.trainable_variables)   # every rank
"""

from __future__ import annotations

import tensorflow as tf

import hvd_partial as _core
from ..errors import ConfigError
from ..modes import Mode, ReduceOp
from .compression import Compression, Compressor
from .exchange import (GradientExchange, RoundGradients, _graph_builder, exchange_for, existing_exchange,
                       rank_label)

#: Stream used by tapes created without ``name=``.
DEFAULT_TAPE_STREAM = "tensorflow.DistributedGradientTape"


class DistributedGradientTape:
    """Wrap ``gradtape`` (a ``tf.GradientTape``) so that its gradients are
    reduced across ranks.

    Arguments: ``mode`` (``Solo()`` by default, ``Majority(...)`` or ``Sync()``),
    ``op`` (``Average`` or ``Sum``), ``compression`` (``Compression.none`` or
    ``.fp16``), ``sparse_as_dense`` (reduce ``IndexedSlices`` gradients as
    dense; otherwise they raise), ``max_staleness`` (rounds; default from
    ``init``), ``name`` (the stream; tapes of different variable sets need
    different names). Every other attribute is the wrapped tape's.

    Example (Horovod's pattern, sync mode)::

        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        tape = hvd.DistributedGradientTape(tape, mode=hvd.Sync())
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    """

    def __init__(self, gradtape, mode: Mode | None = None, op: ReduceOp = _core.Average,
                 compression: Compressor = Compression.none, sparse_as_dense: bool = False,
                 max_staleness: int | None = None, name: str = DEFAULT_TAPE_STREAM):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        self._tape = gradtape
        self._exchange: GradientExchange = exchange_for(name, mode, op, compression, max_staleness,
                                                        sparse_as_dense, owner=f"DistributedGradientTape({name!r})")

    @property
    def tape(self) -> tf.GradientTape:
        """The wrapped ``tf.GradientTape``."""
        return self._tape

    @property
    def mode(self) -> Mode:
        return self._exchange.mode

    @property
    def stream_name(self) -> str:
        return self._exchange.name

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, attr):
        # Only reached for names this class does not define: watch, stop_recording, jacobian, ...
        return getattr(self._tape, attr)

    @_graph_builder
    def gradient_rounds(self, target, sources, output_gradients=None,
                        unconnected_gradients=tf.UnconnectedGradients.NONE) -> RoundGradients:
        """Compute this rank's gradients, post them and return every round the
        post took (oldest first) as :class:`RoundGradients`; apply them all
        with ``.apply(optimizer)``. Works in every mode, eagerly and inside
        ``tf.function``.

        Example::

            tape.gradient_rounds(loss, variables).apply(optimizer)
        """
        flat_sources = tf.nest.flatten(sources)
        grads = self._tape.gradient(target, flat_sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        if tf.executing_eagerly():
            try:
                return self._exchange.exchange(grads, flat_sources)
            except tf.errors.OpError as err:
                self._exchange.reraise(err)
        return self._exchange.exchange(grads, flat_sources)

    @_graph_builder
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Horovod's call: the reduced gradients, in the structure of ``sources``.

        Only in ``Sync`` mode, where every call takes exactly one round; in
        ``Solo``/``Majority`` a call can take several rounds, so this raises
        ``ConfigError`` (use ``gradient_rounds``, or ``hvd_partial.keras.DistributedOptimizer``).
        """
        if self._exchange.mode.kind != "sync":
            raise ConfigError(
                f"rank {rank_label()}: DistributedGradientTape.gradient() returns one gradient per call, which "
                f"only mode=Sync() guarantees; in {self._exchange.mode.kind} mode a call can take several rounds "
                "that must all be applied in order: use tape.gradient_rounds(loss, variables).apply(optimizer) "
                "or hvd_partial.keras.DistributedOptimizer")
        rounds = self.gradient_rounds(target, sources, output_gradients, unconnected_gradients)
        return tf.nest.pack_sequence_as(sources, rounds.round(0))

    def flush(self, sources=None) -> RoundGradients:
        """Collective (every rank, eagerly): the updates of every outstanding
        round of this tape's stream plus a final synchronous round.

        Example::

            tape.flush().apply(optimizer, model.trainable_variables)
        """
        return flush_gradients(self._exchange.name, sources)


def flush_gradients(name: str = DEFAULT_TAPE_STREAM, sources=None) -> RoundGradients:
    """Collective (every rank, eagerly): take every outstanding round of the
    tape stream ``name`` plus a final synchronous round that empties every
    rank's pending gradients; apply the result to keep replicas identical.

    Example::

        hvd.flush_gradients().apply(optimizer, model.trainable_variables)
    """
    exchange = existing_exchange(name)
    if exchange is None:
        return RoundGradients(None, [], None if sources is None else tf.nest.flatten(sources))
    flat = None if sources is None else tf.nest.flatten(sources)
    try:
        return exchange.flush(flat)
    except tf.errors.OpError as err:
        exchange.reraise(err)
