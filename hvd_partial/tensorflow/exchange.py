"""The TensorFlow side of a partial allreduce of gradients, shared by
``DistributedGradientTape`` and the Keras ``DistributedOptimizer``.

One :class:`GradientExchange` owns one fused stream. Inside a ``tf.function``
(``model.fit``'s compiled train step included) a post is a ``tf.numpy_function``
that posts this rank's gradients and returns the results of the k rounds the
post took, stacked on a new first axis; :meth:`RoundGradients.apply` then runs
a ``tf.while_loop`` that applies them one by one, oldest first, through the
user's optimizer. k is only known at run time and differs between ranks and
steps, which is why the loop is a graph loop and not a Python one.

Example::

    exchange = GradientExchange("grads", mode=hvd.Solo())
    rounds = exchange.exchange(grads, variables)   # eager or inside tf.function
    rounds.apply(optimizer)                        # k updates, in round order

With ``process_set=`` (a set other than the global one) the gradients are
reduced among the set's members only; a rank outside the set takes its own
gradients, as in Horovod, and has nothing to flush. In sync mode (the
default on a set) a post is one negotiated grouped allreduce among the
members (the numpy-level set collective) and always takes one round. In solo
and majority mode the stream runs on the set's own engine
(:mod:`hvd_partial.collectives.set_engines`, started when the exchange is
made: collective over the members), a world of the set's members: its
rounds, staleness and quorum are the set's, and ``flush()`` (also through
``hvd.flush_tapes()``, ``flush_gradients()`` and the Keras optimizer's
``flush()`` and epoch callback) is collective over the members only.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

import hvd_partial as _core
from .. import session as _session
from ..api import post_grouped
from ..collectives.process_sets import check_usable, global_process_set, set_engine
from ..core import carried_values
from ..errors import ConfigError, EngineError, HvdPartialError, StreamConflictError, UnsupportedInputError
from ..modes import Mode, ReduceOp, Sync
from . import state
from .compression import Compression, Compressor
from .overlap import OverlapBuckets

log = logging.getLogger("hvd_partial.tensorflow")

#: Decorator for code that builds graph ops with plain Python control flow:
#: AutoGraph would only re-convert it (seconds per trace) when a user's
#: tf.function calls it. Shared by the tape, the hand-off and the Keras optimizer.
graph_builder = tf.autograph.experimental.do_not_convert


def init_generation():
    """A token that changes at every ``init`` (None when not initialized)."""
    return _core.config() if _core.is_initialized() else None


def posted_since_init(name: str) -> bool:
    """True if this process posted to stream ``name`` since the latest ``init``."""
    tf_state = state.current()
    if tf_state is None:
        return False
    with tf_state.lock:
        return name in tf_state.posted


def rank_label() -> str:
    """This process's rank for error messages (``?`` before ``init``)."""
    try:
        return str(_core.rank())
    except HvdPartialError:
        return "?"


def source_name(source) -> str:
    for attr in ("path", "name"):
        value = getattr(source, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(source).__name__


@dataclass(frozen=True)
class Slot:
    """One gradient that travels: its position among the sources, its shape,
    its own dtype and the dtype it travels in."""

    index: int
    shape: tuple
    dtype: str
    wire: str
    sparse: bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Group:
    """Gradients fused into one flat buffer (all of one wire dtype)."""

    wire: str
    slots: tuple  # of Slot

    @property
    def size(self) -> int:
        return sum(s.size for s in self.slots)


def fusion_buckets(order: dict, limit: int | None):
    """Groups of one wire dtype each, at most ``limit`` bytes (fusion_threshold_bytes;
    a larger gradient travels alone), in the order of ``order``."""
    for wire, members in order.items():
        itemsize = np.dtype(wire).itemsize
        bucket: list = []
        filled = 0
        for slot in members:
            nbytes = slot.size * itemsize
            if bucket and limit is not None and filled + nbytes > limit:
                yield Group(wire, tuple(bucket))
                bucket, filled = [], 0
            bucket.append(slot)
            filled += nbytes
        yield Group(wire, tuple(bucket))


@dataclass(frozen=True)
class GradientPlan:
    """How a list of gradients is packed into fused buffers and back.

    Fixed by the first post of a stream: the same variables must produce the
    same plan every step (a gradient that is ``None`` stays ``None``).
    """

    count: int  # number of sources, including those without a gradient
    groups: tuple  # of Group

    @property
    def slots(self) -> list:
        return sorted((s for g in self.groups for s in g.slots), key=lambda s: s.index)

    def describe(self) -> str:
        parts = [f"#{s.index} {list(s.shape)} {s.dtype}" for s in self.slots]
        return f"{len(parts)} of {self.count} sources with gradients: " + ", ".join(parts)

    def to_wire(self, grads: list, compression: Compressor) -> list:
        """Graph ops: one flat tensor per group."""
        flats = []
        for group in self.groups:
            parts = []
            for slot in group.slots:
                grad = grads[slot.index]
                if isinstance(grad, tf.IndexedSlices):
                    grad = tf.convert_to_tensor(grad)
                wire, _ = compression.compress(grad)
                if wire.dtype != slot.wire:
                    wire = tf.cast(wire, slot.wire)
                parts.append(tf.reshape(wire, [-1]))
            flats.append(parts[0] if len(parts) == 1 else tf.concat(parts, axis=0))
        return flats

    def from_wire(self, flats: list) -> list:
        """Graph ops: the gradients of one round (``None`` where a source had none)."""
        out = [None] * self.count
        for group, flat in zip(self.groups, flats):
            pieces = [flat] if len(group.slots) == 1 else tf.split(flat, [s.size for s in group.slots])
            for slot, piece in zip(group.slots, pieces):
                grad = tf.reshape(piece, slot.shape)
                if slot.wire != slot.dtype:
                    grad = tf.cast(grad, slot.dtype)
                out[slot.index] = grad
        return out


class RoundGradients:
    """The rounds that one post (or flush) took, as gradients to apply in order.

    ``count`` is k, a scalar tensor (0 is possible: a flush round to which no
    rank contributed is not an update and is left out). ``round(i)`` gives the
    gradients of the i-th round aligned with the sources. In eager mode the
    object is also a sequence of gradient lists. ``values`` is, for a stream
    whose posts carry scalars (a Keras ``DistributedOptimizer``'s learning
    rate), a (k, n) float64 tensor: row i holds the values round i is applied
    with, the same on every rank; ``None`` otherwise.

    Example::

        rounds = tape.gradient_rounds(loss, model.trainable_variables)
        rounds.apply(optimizer)          # works inside tf.function too
        for grads in rounds:             # eager mode only
            print([g.shape for g in grads if g is not None])
    """

    def __init__(self, plan: GradientPlan | None, stacked: list, sources: list | None = None, values=None):
        self.plan = plan
        #: Per group of the plan, the rounds' wire gradients: a (k, group size) tensor.
        self.stacked = stacked
        self.sources = sources
        self.values = values

    @property
    def count(self):
        if not self.stacked:
            return tf.constant(0, dtype=tf.int32)
        return tf.shape(self.stacked[0], out_type=tf.int32)[0]

    @graph_builder
    def round(self, i) -> list:
        """Gradients of round ``i`` (0 = oldest taken), aligned with the sources."""
        if self.plan is None:
            raise IndexError("no rounds were taken")
        return self.plan.from_wire([rows[i] for rows in self.stacked])

    def __len__(self) -> int:
        if not tf.executing_eagerly():
            raise TypeError("len(RoundGradients) needs eager execution; inside tf.function use .count and .apply()")
        return int(self.count)

    def __iter__(self):
        for i in range(len(self)):
            yield self.round(i)

    @graph_builder
    def apply(self, optimizer, variables=None):
        """Apply every round, oldest first, with ``optimizer.apply_gradients``
        (one update per round). Returns k. Works eagerly and in ``tf.function``."""
        def update(grads, active):
            optimizer.apply_gradients(zip(grads, active))

        if hasattr(optimizer, "built") and not optimizer.built and variables is not None:
            optimizer.build(list(variables))
        return self.apply_with(update, variables)

    @graph_builder
    def apply_with(self, update, variables=None):
        """Call ``update(grads, variables)`` once per round, in order, leaving out
        sources without a gradient; ``update(grads, variables, values)`` with the
        round's carried values (a float64 vector) when the stream carries any. Returns k."""
        if self.plan is None:
            return tf.constant(0, dtype=tf.int32)
        variables = list(variables if variables is not None else (self.sources or []))
        if len(variables) != self.plan.count:
            raise UnsupportedInputError(
                f"rank {rank_label()}: {len(variables)} variables given for {self.plan.count} gradients")
        active_slots = self.plan.slots
        active = [variables[s.index] for s in active_slots]

        def body(i):
            grads = self.round(i)
            if self.values is None:
                update([grads[s.index] for s in active_slots], active)
            else:
                update([grads[s.index] for s in active_slots], active, self.values[i])
            return (i + 1,)

        count = self.count
        # parallel_iterations=1: every update reads the variables the previous one wrote.
        tf.while_loop(lambda i: i < count, body, (tf.constant(0, dtype=tf.int32),), parallel_iterations=1)
        return count


def apply_compiled(rounds: RoundGradients, update, variables, cache: dict, key) -> int:
    """Apply ``rounds`` with ``update`` inside a ``tf.function`` (cached in
    ``cache[key]``): the same ``tf.while_loop`` a traced train step runs.
    Flushed rounds then go through compiled updates as the others do; applied
    eagerly, an update can differ in the last bit from its graph version
    (Adadelta's did), and one rank applies a round in a step where another
    applies it in a flush. Returns k.

    Example::

        apply_compiled(exchange.flush(variables), optimizer_update, variables, self._compiled, "flush")
    """
    if rounds.plan is None:
        return 0
    plan = rounds.plan
    carried = rounds.values is not None
    fn = cache.get(key)
    if fn is None or fn[0] is not plan:
        spec = [tf.TensorSpec([None, g.size], tf.as_dtype(g.wire)) for g in plan.groups]
        if carried:
            spec.append(tf.TensorSpec([None, rounds.values.shape[1]], tf.float64))

        def run(*stacked):
            stacked = list(stacked)
            values = stacked.pop() if carried else None
            return RoundGradients(plan, stacked, variables, values).apply_with(update, variables)

        fn = cache[key] = (plan, tf.function(run, input_signature=spec, autograph=False))
    if int(rounds.count) == 0:
        return 0
    return int(fn[1](*rounds.stacked, *([rounds.values] if carried else [])))


class GradientExchange:
    """One fused stream of gradients between ranks.

    ``exchange(grads, sources)`` posts this rank's gradients and returns the
    :class:`RoundGradients` of the rounds taken; ``flush()`` (collective) takes
    every outstanding round plus a final synchronous one. With ``carries=n``
    every post also carries n scalars (``exchange(..., carried=values)``):
    each round's values are those every post in it held if they agree bit for
    bit, else their mean (:mod:`hvd_partial.core.carried_values`), the same on
    every rank, in ``RoundGradients.values`` and :attr:`last_values`.
    ``process_set``: reduce among a set's members only (solo and majority on
    the set's own engine; see the module docstring).

    Example::

        ex = GradientExchange("model/grads", mode=hvd.Majority(seed=3))
        ex.exchange(grads, model.trainable_variables).apply(optimizer)
        ex.flush().apply(optimizer, model.trainable_variables)
    """

    def __init__(self, name: str, mode: Mode | None = None, op: ReduceOp = _core.Average,
                 compression: Compressor = Compression.none, max_staleness: int | None = None,
                 sparse_as_dense: bool = False, owner: str = "gradients", tape_stream: bool = False,
                 carries: int = 0, process_set=global_process_set):
        if not isinstance(name, str) or not name:
            raise TypeError(f"stream name must be a non-empty str, got {name!r}")
        #: The set the gradients are reduced in (see the module docstring).
        self.process_set = check_usable(process_set, owner)
        mode = _core.stream_options(set_mode(mode, self.process_set), op, max_staleness)
        if not isinstance(compression, Compressor):
            raise TypeError(f"compression must be Compression.none or Compression.fp16, got {compression!r}")
        self.name = name
        self.mode = mode
        self.op = op
        self.compression = compression
        self.max_staleness = max_staleness
        self.sparse_as_dense = bool(sparse_as_dense)
        self.owner = owner
        #: A DistributedGradientTape stream: every post enters it in the session's registry.
        self.tape_stream = tape_stream
        #: How many scalars every post carries (0: none).
        self.carries = carries
        self.plan: GradientPlan | None = None
        #: Sync mode's buckets posted as the backward pass computes them (fixed with the plan;
        #: None: each post is one, :mod:`hvd_partial.tensorflow.overlap`).
        self.overlap: OverlapBuckets | None = None
        #: Updates handed out so far (rounds with at least one contributor).
        self.updates = 0
        #: Rounds taken so far, including flush rounds nobody contributed to.
        self.rounds_taken = 0
        self.posts = 0
        #: The facts of the rounds taken by the latest post or flush.
        self.last_results: list = []
        #: Per round with data taken by the latest post or flush: (round, posts summed, carried values).
        self.last_values: list = []
        self.last_error: BaseException | None = None
        #: Rounds handed out by DistributedGradientTape.gradient() that must all
        #: be applied before the next post: (init token, k, slots not yet applied); None when none are owed.
        self.owed: tuple | None = None
        if self.on_set_engine and self.process_set.included():
            set_engine(self.process_set)  # started here: collective over the set's members

    @property
    def settings(self) -> tuple:
        return (self.mode, self.op, self.compression.name, self.max_staleness, self.sparse_as_dense,
                self.process_set.process_set_id)

    @property
    def on_set(self) -> bool:
        """Whether the stream reduces among a process set other than the global one."""
        return not self.process_set.is_global

    @property
    def on_set_engine(self) -> bool:
        """Whether the stream is a solo or majority stream on a process set (its own engine's, on members)."""
        return self.on_set and self.mode.kind != "sync"

    @property
    def posts_to_engine(self) -> bool:
        """Whether posts go to an engine's stream: the session's, or (a solo or majority
        stream on a set, on a member) the set's; else they are a sync allreduce among a
        set's members or, outside the set, this rank's own gradients."""
        return not self.on_set or (self.on_set_engine and self.process_set.included())

    def engine(self):
        """The engine the stream's posts and flushes go to: the session's, or (a solo or
        majority stream on a set, on a member) the set's own."""
        if self.on_set_engine:
            return set_engine(self.process_set)
        return _session.require().engine

    def stats(self) -> dict:
        """This stream's participation report on its engine (see ``hvd_partial.stats()``;
        {} on a rank outside its set, or before the first post)."""
        if not self.posts_to_engine:
            return {}
        if self.on_set_engine:
            return self.engine().stats.snapshot().get(self.name, {})
        return _core.stats().get(self.name, {})

    # -- planning (trace time) ------------------------------------------------------

    def make_plan(self, grads: list, sources: list) -> GradientPlan:
        """Check ``grads`` against ``sources`` and fix (or compare with) the plan."""
        if len(grads) != len(sources):
            raise UnsupportedInputError(
                f"rank {rank_label()}: {len(grads)} gradients for {len(sources)} variables in {self.owner}")
        slots = []
        for i, (grad, source) in enumerate(zip(grads, sources)):
            if grad is None:
                continue
            sparse = isinstance(grad, tf.IndexedSlices)
            if sparse and not self.sparse_as_dense:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: the gradient of {source_name(source)!r} is sparse (tf.IndexedSlices, "
                    f"e.g. from an Embedding layer) and partial allreduce reduces dense buffers only; pass "
                    f"sparse_as_dense=True to {self.owner} to reduce it as a dense tensor")
            shape = getattr(source, "shape", None)
            if shape is None or not tf.TensorShape(shape).is_fully_defined():
                shape = grad.dense_shape if sparse else grad.shape
            shape = tf.TensorShape(shape)
            if not shape.is_fully_defined():
                raise UnsupportedInputError(
                    f"rank {rank_label()}: the gradient of {source_name(source)!r} has shape {shape} that is not "
                    "fully known; partial allreduce needs static shapes")
            dtype = tf.as_dtype(grad.dtype)
            if not dtype.is_floating:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: the gradient of {source_name(source)!r} has dtype {dtype.name}; "
                    "only floating-point gradients are reduced")
            wire = self.compression.wire_dtype(dtype)
            if wire not in (tf.float16, tf.float32, tf.float64):
                wire = tf.float32  # bfloat16 has no numpy dtype the engine reduces
            slots.append(Slot(i, tuple(shape.as_list()), dtype.name, wire.name, sparse))
        if not slots:
            raise UnsupportedInputError(
                f"rank {rank_label()}: {self.owner} got no gradients at all (every gradient is None): "
                "check that the loss depends on the variables")
        order: dict[str, list] = {}
        for slot in slots:
            order.setdefault(slot.wire, []).append(slot)
        cfg = _core.config() if _core.is_initialized() else None
        limit = cfg.fusion_threshold_bytes if cfg is not None else None
        plan = GradientPlan(len(grads), tuple(fusion_buckets(order, limit)))
        if self.plan is None:
            self.plan = plan
            if self.posts_to_engine:
                self.overlap = OverlapBuckets.for_plan(self.name, len(plan.groups), self.mode.kind, self.on_set)
        elif plan != self.plan:
            raise StreamConflictError(
                f"rank {rank_label()}: stream {self.name!r} of {self.owner} was first used with "
                f"{self.plan.describe()}; now with {plan.describe()}. A stream reduces a fixed set of "
                "gradients: use one DistributedOptimizer (or tape name=...) per set of variables")
        return plan

    # -- posting ------------------------------------------------------------------

    @graph_builder
    def exchange(self, grads, sources, handed_out: bool = False, carried=None) -> RoundGradients:
        """Post ``grads`` (aligned with ``sources``) and return the rounds taken.

        Eagerly this runs at once; inside ``tf.function`` it adds the ops.
        ``handed_out``: the caller returns only the latest round's gradients
        and every round must be applied before the next post (see
        :mod:`hvd_partial.tensorflow.handoff`), which the next post checks.
        ``carried``: this post's ``carries`` scalars (a float64 vector), for a
        stream that carries any.
        """
        grads, sources = list(grads), list(sources)
        if (carried is None) != (self.carries == 0):
            raise UnsupportedInputError(f"rank {rank_label()}: stream {self.name!r} carries {self.carries} values "
                                        f"with every post; got {'none' if carried is None else 'some'}")
        plan = self.make_plan(grads, sources)
        inputs = plan.to_wire(grads, self.compression)
        dtypes = [tf.as_dtype(g.wire) for g in plan.groups]
        if carried is not None:
            inputs.append(tf.reshape(tf.cast(carried, tf.float64), [self.carries]))
            dtypes.append(tf.float64)
        post = self._post_and_hand_out if handed_out else self._post_and_take
        if self.overlap is None:
            outputs = tf.numpy_function(post, inputs, dtypes, stateful=True, name="hvd_partial_post")
        else:
            outputs = self._post_buckets(inputs, post, dtypes)
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        for out, group in zip(outputs, plan.groups):
            out.set_shape([None, group.size])
        values = None
        if carried is not None:
            values = outputs.pop()
            values.set_shape([None, self.carries])
        return RoundGradients(plan, outputs, sources, values)

    def _post_buckets(self, inputs: list, post, dtypes: list):
        """Graph ops of a post in overlapped buckets: each bucket but the last
        posted as soon as its gradients exist, in order; then ``post`` of the last
        bucket (with the carried values), which waits for every bucket and
        returns the joined rounds as a post of every group would."""
        overlap, groups = self.overlap, len(self.plan.groups)
        token: list = []
        for k, bucket in enumerate(overlap.buckets[:-1]):
            with tf.control_dependencies(token):  # every rank posts the buckets in one order
                token = [tf.numpy_function(functools.partial(self._post_bucket, k), [inputs[j] for j in bucket],
                                           tf.int64, stateful=True, name="hvd_partial_post_bucket")]
        last = [inputs[j] for j in overlap.buckets[-1]] + inputs[groups:]  # then the carried values
        with tf.control_dependencies(token):
            return tf.numpy_function(post, last, dtypes, stateful=True, name="hvd_partial_post")

    def flush(self, sources=None) -> RoundGradients:
        """Collective, eager: take every outstanding round and a final
        synchronous round; returns their updates."""
        if not tf.executing_eagerly():
            raise UnsupportedInputError(
                f"rank {rank_label()}: flush() of {self.owner} must run eagerly (outside tf.function): it is "
                "a collective that every rank calls once, e.g. at the end of an epoch")
        handle = self.begin_flush()
        return self.finish_flush(handle, sources)

    def begin_flush(self):
        """Start this stream's collective flush (eager); None if nothing was posted since init."""
        if self.plan is None or not posted_since_init(self.name):
            # Nothing posted here, so nothing to flush (and no stream to name).
            return None
        self.check_owed()
        engine = self.engine()
        streams = [self.name] if self.overlap is None else self.overlap.streams
        return engine, [engine.submit_flush(s) for s in streams]

    def finish_flush(self, handle, sources=None) -> RoundGradients:
        """Wait for a flush started by :meth:`begin_flush`; returns its updates."""
        if handle is None:
            return RoundGradients(None, [], sources)
        engine, flushing = handle
        per_stream = [engine.wait(h) for h in flushing]
        results = self._joined(per_stream[-1], per_stream[:-1])
        stacked = [tf.constant(a) for a in self._stack(results)]
        values = stacked.pop() if self.carries else None
        return RoundGradients(self.plan, stacked, sources, values)

    # -- numpy side -----------------------------------------------------------------

    def _post_and_hand_out(self, *flats):
        stacked = self._post_and_take(*flats)
        k = stacked[0].shape[0]
        if k == 0:
            raise EngineError(f"rank {rank_label()}: a post to stream {self.name!r} took no round with data")
        slots = frozenset(s.index for s in self.plan.slots)
        self.owed = (init_generation(), k, slots) if k > 1 else None
        return stacked

    def mark_applied(self, slots) -> None:
        """Numpy side: every round of the latest hand-out was applied to ``slots``."""
        owed = self.owed
        if owed is not None:
            left = owed[2] - frozenset(int(i) for i in np.ravel(slots))
            self.owed = (owed[0], owed[1], left) if left else None

    def check_owed(self) -> None:
        """Raise ``ConfigError`` if the latest hand-out of this init took k > 1 rounds and some
        gradient did not have them all applied (checked, and forgotten, at every post and flush)."""
        owed, self.owed = self.owed, None
        if owed is None or owed[0] is not init_generation():
            return
        names = ", ".join(f"#{i}" for i in sorted(owed[2]))
        raise ConfigError(
            f"rank {rank_label()}: the previous gradient() of {self.owner} (stream {self.name!r}) took {owed[1]} "
            f"rounds, but only the latest was applied to the gradients of source(s) {names}, so this rank's "
            "replica now differs from the others. In solo and majority mode pass tape.gradient()'s result "
            "unchanged to a Keras optimizer's apply_gradients() or apply() (which applies every round), or use "
            "tape.gradient_rounds(loss, variables).apply(optimizer), or mode=Sync()")

    def _post_bucket(self, k: int, *flats):
        """Numpy side: post bucket ``k`` (not the last) of an overlapped post."""
        try:
            if k == 0:
                self.check_owed()
            arrays = [np.ascontiguousarray(f) for f in flats]
            overlap = self.overlap
            overlap.handles[k] = post_grouped(self.engine(), arrays, overlap.streams[k], self.mode, self.op,
                                              self.max_staleness)
            return np.int64(k)
        except BaseException as err:
            self._failed(err)
            raise

    def _joined(self, final: list, per_bucket: list) -> list:
        """The rounds of the stream (``final``) with the other buckets' rounds joined in."""
        if self.overlap is None:
            return final
        return self.overlap.join(final, per_bucket, len(self.plan.groups), rank_label())

    def _failed(self, err: BaseException) -> None:
        # TensorFlow re-raises this as an OpError whose text keeps our message;
        # eager callers get the original back through reraise().
        self.last_error = err
        log.error("rank %s: %s in %s (stream %r): %s", rank_label(), type(err).__name__, self.owner, self.name, err)

    def _post_and_take(self, *inputs):
        if not self.posts_to_engine:
            return self._reduce_on_set(*inputs)
        try:
            if self.overlap is None:  # else checked at the first bucket's post
                self.check_owed()
            arrays = [np.ascontiguousarray(f) for f in inputs]
            if self.carries:  # the carried values travel encoded, as the last array
                arrays[-1] = carried_values.encode([float(v) for v in arrays[-1]])
            engine = self.engine()
            handle = post_grouped(engine, arrays, self.name, self.mode, self.op, self.max_staleness)
            tf_state = state.require()
            with tf_state.lock:
                tf_state.posted.add(self.name)
            if self.tape_stream:  # also when traced before the latest init: flush_tapes() finds it
                tf_state.enter_tape_exchange(self)
            self.posts += 1
            # The stream's own round first: where ranks disagree on the buckets (another
            # overlap_backward or fusion_threshold_bytes), its registration fails on every rank.
            results = engine.wait(handle)
            if self.overlap is not None:
                results = self._joined(results, [engine.wait(h) for h in self.overlap.handles])
            return self._stack(results)
        except BaseException as err:
            self._failed(err)
            raise

    def _reduce_on_set(self, *inputs) -> list:
        """Numpy side of a sync post on a process set (one grouped allreduce among its
        members) and of any post on a rank outside the set (its own gradients),
        stacked as one round; the carried values stay this rank's."""
        arrays = [np.ascontiguousarray(f) for f in inputs]
        carried = arrays.pop() if self.carries else None
        try:
            if self.process_set.included():
                arrays = _core.grouped_allreduce(arrays, name=self.name, op=self.op, process_set=self.process_set)
        except BaseException as err:
            self.last_error = err
            log.error("rank %s: %s in %s (stream %r on %s): %s", rank_label(), type(err).__name__, self.owner,
                      self.name, self.process_set, err)
            raise
        self.posts += 1
        self.rounds_taken += 1
        self.updates += 1
        self.last_results = []
        out = [np.asarray(a, dtype=group.wire).reshape(1, group.size) for a, group in zip(arrays, self.plan.groups)]
        if carried is not None:
            out.append(carried.astype(np.float64).reshape(1, self.carries))
        return out

    def _stack(self, results) -> list:
        """The results with at least one contributor, stacked per group (then
        their carried values, a (k, carries) float64 array, for a stream that carries any)."""
        useful = [r for r in results if r.has_data]
        self.rounds_taken += len(results)
        self.updates += len(useful)
        self.last_results = results
        average = self.op is _core.Average
        # cap_round_step needs each round's count of posts, which only a stream that carries values has.
        capped = bool(self.carries) and _core.config().cap_round_step
        scales = [carried_values.step_scale(r, average, capped) for r in useful]
        out = []
        for j, group in enumerate(self.plan.groups):
            stacked = np.empty((len(useful), group.size), dtype=group.wire)
            for i, result in enumerate(useful):
                stacked[i] = result.arrays[j]
                if scales[i] != 1.0:
                    stacked[i] *= stacked.dtype.type(scales[i])
            out.append(stacked)
        self.last_values = []
        if self.carries:
            values = np.empty((len(useful), self.carries), np.float64)
            for i, result in enumerate(useful):
                values[i] = carried_values.values_of_round(result, average)
                posts = carried_values.posts_in(result.arrays[-1], carried_values.round_scale(result, average))
                self.last_values.append((result.round, posts, values[i].tolist()))
            out.append(values)
        return out

    def reraise(self, error: tf.errors.OpError):
        """Raise the hvd_partial error behind a TensorFlow ``OpError`` if any."""
        original = self.last_error
        if original is not None and isinstance(original, HvdPartialError):
            self.last_error = None
            raise original from error
        raise error


def set_mode(mode, process_set):
    """``mode`` for gradients reduced on ``process_set``: on a set other than the
    global one, ``Sync()`` where left out (Horovod's behaviour there)."""
    if process_set is None or process_set.is_global or mode is not None:
        return mode
    return Sync()


def exchange_for(name: str, mode, op, compression, max_staleness, sparse_as_dense, owner: str,
                 process_set=global_process_set) -> GradientExchange:
    """This session's exchange named ``name`` (tapes are created anew every
    step, their stream is not); its settings must not change."""
    tf_state = state.require()
    with tf_state.lock:
        found = tf_state.exchanges.get(name)
    if found is None:
        made = GradientExchange(name, mode, op, compression, max_staleness, sparse_as_dense, owner, tape_stream=True,
                                process_set=process_set)
        found = tf_state.enter_tape_exchange(made)
        if found is made:
            return found
    process_set = check_usable(process_set, owner)
    mode = set_mode(mode, process_set)
    wanted = (_core.default_mode() if mode is None else mode, op, compression.name, max_staleness, bool(sparse_as_dense),
              process_set.process_set_id)
    if found.settings != wanted:
        raise StreamConflictError(
            f"rank {rank_label()}: stream {name!r} is already used with mode/op/compression/max_staleness/"
            f"sparse_as_dense/process set id {found.settings}, now {wanted}; pass another name=")
    return found


def existing_exchange(name: str) -> GradientExchange | None:
    """This session's exchange named ``name``; None if no tape used it (or no session runs)."""
    tf_state = state.current()
    if tf_state is None:
        return None
    with tf_state.lock:
        return tf_state.exchanges.get(name)
