"""``DistributedGradientTape``: a ``tf.GradientTape`` whose gradients are
reduced across ranks by a (partial) allreduce, with Horovod's signature.

``tape.gradient()`` works in every mode, eagerly and inside ``tf.function``.
In ``Sync`` mode it is Horovod's call exactly: one averaged gradient per call.
In ``Solo`` and ``Majority`` mode one call can take several rounds (a rank
that was behind catches up with every round it missed); ``gradient()`` returns
the latest round's gradients, and a Keras optimizer given them unchanged
(``apply_gradients`` or ``apply``) applies every round, in order (see
:mod:`hvd_partial.tensorflow.handoff`). ``gradient_rounds()`` gives all the
rounds explicitly, for loops that transform gradients or use no Keras optimizer.

Example (Horovod's loop, unchanged; solo by default)::

    import hvd_partial.tensorflow as hvd

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for x, y in data:
        step(x, y)
    hvd.flush_tapes()     # collective: identical replicas on every rank
"""

from __future__ import annotations

import tensorflow as tf

import hvd_partial as _core
from ..errors import NotSupportedError
from ..modes import Mode, ReduceOp
from . import handoff, state
from .basics import check_usable, global_process_set, require_default
from .compression import Compression, Compressor
from .exchange import GradientExchange, RoundGradients, exchange_for, existing_exchange, graph_builder, set_mode

#: Stream of the first set of sources differentiated by tapes created without ``name=``;
#: later sets get ``.2``, ``.3``, ... in the order this process first uses them. On a
#: process set other than the global one the stream is ``<this>.set<id>`` (then ``.2``, ...).
DEFAULT_TAPE_STREAM = "tensorflow.DistributedGradientTape"


def _default_stream(sources: list, process_set) -> str:
    set_id = process_set.process_set_id
    key = (set_id, tuple(id(s) for s in sources))
    base = DEFAULT_TAPE_STREAM if set_id == 0 else f"{DEFAULT_TAPE_STREAM}.set{set_id}"
    tf_state = state.require()
    with tf_state.lock:
        names = tf_state.default_names
        found = names.get(key)
        if found is None:
            n = sum(1 for other_id, _ in names if other_id == set_id)
            found = names[key] = (base if n == 0 else f"{base}.{n + 1}", list(sources))
        return found[0]


class DistributedGradientTape:
    """Wrap ``gradtape`` (a ``tf.GradientTape``) so that its gradients are
    reduced across ranks.

    Arguments: ``mode`` (``Solo()`` by default, ``Majority(...)`` or ``Sync()``),
    ``op`` (``Average`` or ``Sum``), ``compression`` (``Compression.none`` or
    ``.fp16``), ``sparse_as_dense`` (reduce ``IndexedSlices`` gradients as
    dense; otherwise they raise), ``max_staleness`` (rounds; default from
    ``init``), ``name`` (the stream; tapes of different variable sets need
    different names), ``process_set`` (Horovod's: reduce among a set's
    members only; ``mode`` left out means ``Sync()`` there; ``Solo()`` and
    ``Majority(...)`` run on the set's own engine, a world of its members,
    started when the tape's stream is made (at construction with ``name=``,
    else at the first ``gradient()``): collective over the members; a rank
    outside the set gets its own gradients, as in Horovod). Every other
    attribute is the wrapped tape's.

    Example (Horovod's pattern, sync mode)::

        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        tape = hvd.DistributedGradientTape(tape, mode=hvd.Sync())
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    """

    def __init__(self, gradtape, device_dense="", device_sparse="", compression: Compressor = Compression.none,
                 sparse_as_dense: bool = False, op: ReduceOp = _core.Average, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, groups=None, process_set=global_process_set,
                 scale_local_gradients: bool = True, *, mode: Mode | None = None,
                 max_staleness: int | None = None, name: str | None = None):
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        require_default("DistributedGradientTape", device_dense=(device_dense, ""),
                        device_sparse=(device_sparse, ""), gradient_predivide_factor=(gradient_predivide_factor, 1.0),
                        num_groups=(num_groups, 0), groups=(groups, None))
        self._process_set = check_usable(process_set, "DistributedGradientTape")
        mode = set_mode(mode, self._process_set)
        self._tape = gradtape
        self._local_sources: dict[int, object] = {}  # id -> source whose gradient stays this rank's
        self._scale_local_gradients = bool(scale_local_gradients)
        self._settings = (mode, op, compression, max_staleness, sparse_as_dense)
        self._name = name
        # Checks the settings now; the stream is chosen at the first gradient() (it depends on the sources).
        _core.stream_options(mode, op, max_staleness)
        self._exchange: GradientExchange | None = None
        if name is not None and _core.is_initialized():
            self._exchange = self._exchange_named(name)  # a stream used with other settings fails here

    def _exchange_named(self, name: str) -> GradientExchange:
        mode, op, compression, max_staleness, sparse_as_dense = self._settings
        return exchange_for(name, mode, op, compression, max_staleness, sparse_as_dense,
                            owner=f"DistributedGradientTape({name!r})", process_set=self._process_set)

    def _exchange_for(self, sources: list) -> GradientExchange:
        if self._exchange is None:
            self._exchange = self._exchange_named(self._name or _default_stream(sources, self._process_set))
        return self._exchange

    @property
    def tape(self) -> tf.GradientTape:
        """The wrapped ``tf.GradientTape``."""
        return self._tape

    @property
    def mode(self) -> Mode:
        return _core.stream_options(self._settings[0], self._settings[1], self._settings[3])

    @property
    def stream_name(self) -> str | None:
        """The stream (None until the first ``gradient()`` of a tape without ``name=``)."""
        return self._name if self._exchange is None else self._exchange.name

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, attr):
        # Only reached for names this class does not define: watch, stop_recording, jacobian, ...
        return getattr(self._tape, attr)

    def register_local_source(self, source) -> None:
        """Horovod's call for model parallelism: ``source``'s gradient is this
        rank's own, never reduced (divided by the number of ranks with
        ``scale_local_gradients=True``, the default, as in Horovod); its shape
        may differ between ranks. Sync mode only: a round of solo or majority
        carries every source of the tape (``NotSupportedError`` otherwise)."""
        if self.mode.kind != "sync":
            raise NotSupportedError(
                f"rank {_core.rank()}: DistributedGradientTape.register_local_source works in sync mode only "
                f"(this tape's mode is {self.mode!r}); keep local variables out of the tape's sources instead")
        self._local_sources[id(source)] = source

    @graph_builder
    def gradient_rounds(self, target, sources, output_gradients=None,
                        unconnected_gradients=tf.UnconnectedGradients.NONE) -> RoundGradients:
        """Compute this rank's gradients, post them and return every round the
        post took (oldest first) as :class:`RoundGradients`; apply them all
        with ``.apply(optimizer)`` or ``.apply_with(fn)``. Works in every mode,
        eagerly and inside ``tf.function``.

        Example::

            tape.gradient_rounds(loss, variables).apply(optimizer)
        """
        if self._local_sources:
            raise NotSupportedError(f"rank {_core.rank()}: gradient_rounds() with local sources registered; call "
                                    "gradient() (sync mode)")
        return self._post(target, tf.nest.flatten(sources), output_gradients, unconnected_gradients,
                          handed_out=False)[0]

    def _post(self, target, flat_sources: list, output_gradients, unconnected_gradients,
              handed_out: bool) -> tuple[RoundGradients, dict]:
        """Post the gradients of the sources not registered local; returns the
        rounds taken and {index in flat_sources: local gradient}."""
        grads = self._tape.gradient(target, flat_sources, output_gradients=output_gradients,
                                    unconnected_gradients=unconnected_gradients)
        local = {i: self._scaled_local(g) for i, (s, g) in enumerate(zip(flat_sources, grads))
                 if id(s) in self._local_sources}
        shared = [i for i in range(len(flat_sources)) if i not in local]
        sources, grads = [flat_sources[i] for i in shared], [grads[i] for i in shared]
        exchange = self._exchange_for(sources)
        if tf.executing_eagerly():
            try:
                return exchange.exchange(grads, sources, handed_out=handed_out), local
            except tf.errors.OpError as err:
                exchange.reraise(err)
        return exchange.exchange(grads, sources, handed_out=handed_out), local

    def _scaled_local(self, grad):
        return scaled_local(grad, self._process_set) if self._scale_local_gradients else grad

    @graph_builder
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Horovod's call: the reduced gradients, in the structure of ``sources``.

        In sync mode, the one round the call took. In solo and majority mode,
        the latest of the k rounds the call took; pass them unchanged to a
        Keras optimizer's ``apply_gradients`` (or ``apply``), which then
        applies all k rounds in order. Applying them any other way is
        detected at the next post when k > 1 (``ConfigError``).
        """
        flat_sources = tf.nest.flatten(sources)
        if self.mode.kind == "sync":
            rounds, local = self._post(target, flat_sources, output_gradients, unconnected_gradients,
                                       handed_out=False)
            reduced = iter(rounds.round(0))
            grads = [local[i] if i in local else next(reduced) for i in range(len(flat_sources))]
            return tf.nest.pack_sequence_as(sources, grads)
        rounds, _ = self._post(target, flat_sources, output_gradients, unconnected_gradients, handed_out=True)
        exchange = self._exchange_for(flat_sources)
        return tf.nest.pack_sequence_as(sources, handoff.hand_out(exchange, rounds, flat_sources))

    def flush(self, sources=None) -> RoundGradients:
        """Collective (every rank, eagerly): the updates of every outstanding
        round of this tape's stream plus a final synchronous round.

        Example::

            tape.flush().apply(optimizer, model.trainable_variables)
        """
        if self._exchange is None:
            return RoundGradients(None, [], None if sources is None else tf.nest.flatten(sources))
        return flush_gradients(self._exchange.name, sources)


def scaled_local(grad, process_set):
    """A local source's gradient divided by the number of ranks of ``process_set``
    (Horovod's ``scale_local_gradients``); None stays None, ``IndexedSlices`` stay sparse."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(process_set.size(), grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(process_set.size(), grad.dtype)


def local_layer_weights(local_layers) -> list:
    """The trainable weights of ``local_layers`` (a layer, a list of layers, or None)."""
    layers = [] if local_layers is None else list(local_layers) if isinstance(local_layers, (list, tuple)) \
        else [local_layers]
    return [weight for layer in layers for weight in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape, local_layers=None, **kwargs) -> DistributedGradientTape:  # noqa: N802
    """Horovod's model-parallel tape: a :class:`DistributedGradientTape`
    (``kwargs`` are its arguments) with every trainable weight of
    ``local_layers`` registered as a local source (sync mode only).

    Example::

        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.embedding], mode=hvd.Sync())
    """
    tape = DistributedGradientTape(gradtape, **kwargs)
    for weight in local_layer_weights(local_layers):
        tape.register_local_source(weight)
    return tape


def flush_gradients(name: str = DEFAULT_TAPE_STREAM, sources=None) -> RoundGradients:
    """Collective (every rank, eagerly): take every outstanding round of the
    tape stream ``name`` plus a final synchronous round that empties every
    rank's pending gradients; apply the result to keep replicas identical. A
    solo or majority stream on a process set is flushed among the set's members
    (on its engine); a rank outside the set has nothing to flush.

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


def flush_tapes() -> int:
    """Collective (every rank, eagerly): flush every ``DistributedGradientTape``
    stream, in the order this process first used them, and apply each flush's
    rounds through the Keras optimizer(s) that applied that stream's
    ``gradient()`` results. Afterwards weights and optimizer state are
    identical on every rank (of each stream's set: a solo or majority stream on a
    process set is flushed on the set's engine, among its members). Returns the
    number of updates applied.

    Example::

        for x, y in data:
            step(x, y)          # tape.gradient() + opt.apply_gradients()
        hvd.flush_tapes()       # before evaluating or saving
    """
    tf_state = state.current()
    if tf_state is None:
        return 0  # no session, or no tape used in it: nothing to flush
    with tf_state.lock:
        names = list(tf_state.tape_streams)
    exchanges = [e for e in (existing_exchange(n) for n in names) if e is not None]
    # Started together: a rank that flushes one stream while others still post
    # to another would hold them back (it stops taking that stream's rounds).
    started = []
    for exchange in exchanges:
        try:
            started.append((exchange, exchange.begin_flush()))
        except tf.errors.OpError as err:
            exchange.reraise(err)
    applied = 0
    for exchange, handle in started:
        rounds = exchange.finish_flush(handle)
        applied += handoff.apply_flush(exchange, rounds)
    return applied
