"""How the rounds of ``DistributedGradientTape.gradient()`` reach the optimizer
in solo and majority mode, where one post can take k >= 1 rounds.

Horovod's loop is ``grads = tape.gradient(loss, vars)`` then
``opt.apply_gradients(zip(grads, vars))``: one list of gradients, one update.
To keep every replica identical, all k rounds must be applied, in order, each
as its own update, before the next forward pass. So:

1. ``gradient()`` returns the gradients of the latest round and records a
   *hand-out*: those exact tensor objects (eager tensors, or the symbolic
   tensors of the ``tf.function`` being traced), with the k rounds behind them.
2. The first ``DistributedGradientTape`` installs a wrapper around Keras 3's
   ``Optimizer.apply`` (``apply_gradients`` calls it). When every gradient it
   receives is a tensor of a hand-out, it applies all k rounds of those
   gradients, oldest first, each through the optimizer's own ``apply``, in a
   ``tf.while_loop`` (k is known only at run time; this works eagerly and in a
   traced function). Any other call goes to Keras unchanged.
3. A tiny op after the loop tells the stream which gradients had all their
   rounds applied. If a later post (or flush) finds that the previous
   hand-out took k > 1 rounds and some gradient was applied some other way
   (changed first, clipped, or applied by hand), every remaining step would
   diverge from the other ranks: it raises ``ConfigError`` naming the problem.
   With k = 1 the latest round is the whole story and any way of applying it
   is right.

Gradients of a hand-out may be split between several optimizers (each applies
the k rounds of its part). Mixing them with other gradients in one call, or
giving a hand-out's variables other gradients, raises ``ConfigError`` at once.
The hand-outs and their consumers are kept in the session
(:mod:`hvd_partial.tensorflow.state`): ``shutdown()`` forgets them.

Example::

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    tape = hvd.DistributedGradientTape(tape)                 # solo by default
    grads = tape.gradient(loss, model.trainable_variables)   # the latest round
    opt.apply_gradients(zip(grads, model.trainable_variables))   # applies all k
"""

from __future__ import annotations

import functools
import logging
import weakref

import numpy as np
import tensorflow as tf

from ..errors import ConfigError
from . import state
from .exchange import GradientExchange, RoundGradients, apply_compiled, graph_builder, rank_label, source_name

log = logging.getLogger("hvd_partial.tensorflow")

_MARK = "_hvd_partial_handoff"


class HandOut:
    """The gradients one ``gradient()`` returned and the rounds behind them."""

    def __init__(self, exchange: GradientExchange, rounds: RoundGradients, returned: list, sources: list):
        self.exchange = exchange
        self.rounds = rounds
        self.returned = returned
        self.sources = sources
        self.applied: set[int] = set()


def hand_out(exchange: GradientExchange, rounds: RoundGradients, sources: list) -> list:
    """The latest round's gradients (aligned with ``sources``), recorded so
    that a Keras optimizer applying them applies every round."""
    install()
    latest = rounds.round(tf.maximum(rounds.count - 1, 0))
    returned = [None if g is None else tf.identity(g) for g in latest]
    handout = HandOut(exchange, rounds, returned, sources)
    tf_state = state.require()
    with tf_state.lock:
        old = tf_state.latest_handouts.pop(exchange.name, None)
        if old is not None:
            for tensor in old.returned:
                if tensor is not None:
                    tf_state.handouts_by_tensor.pop(id(tensor), None)
        tf_state.latest_handouts[exchange.name] = handout
        for i, tensor in enumerate(returned):
            if tensor is not None:
                tf_state.handouts_by_tensor[id(tensor)] = (handout, i)
    return returned


@graph_builder
def _claim(grads: list):
    """(HandOut, indices) if ``grads`` came from one hand-out; None if from none."""
    tf_state = state.current()
    if tf_state is None:
        return None
    found = []
    with tf_state.lock:
        for g in grads:
            entry = tf_state.handouts_by_tensor.get(id(g)) if g is not None else None
            found.append(entry if entry is not None and entry[0].returned[entry[1]] is g else None)
    if all(f is None for f in found):
        return None
    owners = {id(f[0]) for f in found if f is not None}
    if len(owners) > 1 or any(f is None for f, g in zip(found, grads) if g is not None):
        raise ConfigError(
            f"rank {rank_label()}: apply_gradients() got gradients from DistributedGradientTape.gradient() mixed "
            "with other gradients (or from two different gradient() calls); in solo and majority mode each "
            "optimizer call must receive gradients of one gradient() call only, unchanged")
    handout = next(f[0] for f in found if f is not None)
    return handout, [f[1] for f in found if f is not None]


@graph_builder
def _check_foreign(variables: list) -> None:
    """Raise if ``variables`` belong to a hand-out not yet applied: the
    gradients were changed between ``gradient()`` and the optimizer."""
    tf_state = state.current()
    if tf_state is None:
        return
    ids = {id(v) for v in variables}
    with tf_state.lock:
        pending = [h for h in tf_state.latest_handouts.values()
                   if h.exchange.mode.kind != "sync" and len(h.applied) < sum(g is not None for g in h.returned)]
    for handout in pending:
        touched = [i for i, s in enumerate(handout.sources) if id(s) in ids and handout.returned[i] is not None
                   and i not in handout.applied]
        if touched:
            raise ConfigError(
                f"rank {rank_label()}: the optimizer got other gradients for {source_name(handout.sources[touched[0]])!r} "
                f"than the ones DistributedGradientTape.gradient() returned (stream {handout.exchange.name!r}). "
                f"In {handout.exchange.mode.kind} mode one gradient() can take several rounds, and all must be "
                "applied: pass its result unchanged to apply_gradients(); to transform gradients use "
                "tape.gradient_rounds(loss, variables).apply_with(fn), or mode=Sync()")


def claimed_by_tape(grads) -> bool:
    """True if any of ``grads`` was returned by ``DistributedGradientTape.gradient()``."""
    tf_state = state.current()
    if tf_state is None:
        return False
    with tf_state.lock:
        by_tensor = tf_state.handouts_by_tensor
        return any(g is not None and id(g) in by_tensor and by_tensor[id(g)][0].returned[by_tensor[id(g)][1]] is g
                   for g in grads)


@graph_builder
def _apply_rounds(optimizer, original, handout: HandOut, indices: list, variables: list) -> None:
    for i, var in zip(indices, variables):
        source = handout.sources[i]
        if hasattr(source, "assign") and source is not var:
            raise ConfigError(
                f"rank {rank_label()}: the gradient of {source_name(source)!r} was given to the optimizer with "
                f"variable {source_name(var)!r}; zip the gradients with the variables they were computed for")
    if not getattr(optimizer, "built", True):
        optimizer.build(variables)
    rounds = handout.rounds
    count = rounds.count

    def body(r):
        grads = rounds.round(r)
        original(optimizer, [grads[i] for i in indices], variables)
        return (r + 1,)

    # parallel_iterations=1: every update reads the variables the previous one wrote.
    (done,) = tf.while_loop(lambda r: r < count, body, (tf.constant(0, dtype=tf.int32),), parallel_iterations=1)
    exchange = handout.exchange
    slots = np.array(indices, dtype=np.int32)
    consumer = (weakref.ref(optimizer), list(variables), list(indices))
    optimizer_id = id(optimizer)

    def mark(_):
        exchange.mark_applied(slots)
        # At run time: a function traced before the latest init() still reaches flush_tapes().
        tf_state = state.require()
        with tf_state.lock:
            tf_state.consumers.setdefault(exchange.name, {})[optimizer_id] = consumer
        return np.int32(0)

    tf.numpy_function(mark, [done], tf.int32, stateful=True, name="hvd_partial_rounds_applied")
    handout.applied.update(indices)


def install() -> None:
    """Wrap Keras 3's ``Optimizer.apply`` once per process (idempotent)."""
    import keras

    owner = next(c for c in keras.optimizers.Optimizer.__mro__ if "apply" in c.__dict__)
    original = owner.__dict__["apply"]
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    @graph_builder
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        claimed = _claim(grads) if grads else None
        if claimed is None:
            tf_state = state.current()
            if trainable_variables is not None and tf_state is not None and tf_state.latest_handouts:
                _check_foreign(list(trainable_variables))
            return original(self, grads, trainable_variables)
        handout, indices = claimed
        if trainable_variables is None:
            trainable_variables = list(self._trainable_variables)
        variables = [v for g, v in zip(grads, trainable_variables) if g is not None]
        return _apply_rounds(self, original, handout, indices, variables)

    setattr(apply, _MARK, True)
    setattr(apply, "__wrapped_original__", original)
    owner.apply = apply


def consumers(name: str) -> list[tuple]:
    """(optimizer, variables, source indices) of every optimizer still alive
    that applied stream ``name``'s hand-outs."""
    tf_state = state.current()
    if tf_state is None:
        return []
    out = []
    with tf_state.lock:
        entries = list(tf_state.consumers.get(name, {}).values())
    for ref, variables, indices in entries:
        optimizer = ref()
        if optimizer is not None:
            out.append((optimizer, variables, indices))
    return out


def apply_flush(exchange: GradientExchange, rounds: RoundGradients) -> int:
    """Apply a flush's rounds through the optimizers that applied the
    stream's hand-outs (eager call; the updates run compiled, as in a step).
    Returns k."""
    found = consumers(exchange.name)
    k = int(rounds.count)
    if k == 0:
        return 0
    if not found:
        raise ConfigError(f"rank {rank_label()}: flush of stream {exchange.name!r} took {k} rounds but no Keras "
                          "optimizer has applied this stream's gradients; apply "
                          "hvd.flush_gradients(name).apply(optimizer, variables) yourself")
    import keras

    owner = next(c for c in keras.optimizers.Optimizer.__mro__ if "apply" in c.__dict__)
    original = getattr(owner.__dict__["apply"], "__wrapped_original__", owner.__dict__["apply"])
    for optimizer, variables, indices in found:
        def update(grads, _active, optimizer=optimizer, variables=variables, indices=indices):
            by_source = dict(zip(active_slots, grads))
            original(optimizer, [by_source[i] for i in indices], variables)

        active_slots = [s.index for s in rounds.plan.slots]
        apply_compiled(rounds, update, [None] * rounds.plan.count, state.require().compiled_flushes,
                       (exchange.name, id(optimizer), tuple(indices)))
    return k
