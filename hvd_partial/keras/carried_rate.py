"""The learning rate a Keras ``DistributedOptimizer`` carries with every round.

Each post carries the learning rate this rank's inner optimizer holds at
that moment (a float rate as set last, by a callback or by hand; a
``LearningRateSchedule`` or callable evaluated then, on the inner
optimizer's ``iterations``). Every rank applies a round with the same rate,
derived from the round's sums (:mod:`hvd_partial.core.carried_values`: the
posts' rate where they all agree bit for bit, else their mean), and the
inner optimizer holds the rank's own rate again after each update, so what
a schedule or callback reads back stays its own.

Example::

    rate = CarriedLearningRate(inner)
    rounds = exchange.exchange(grads, variables, carried=rate.local())   # in the train step
    rounds.apply_with(lambda g, v, values: rate.apply_with(values[0], lambda: inner.apply(g, v)), variables)
"""

from __future__ import annotations

import keras
import tensorflow as tf


class CarriedLearningRate:
    """Reads the inner optimizer's learning rate for a post and sets a round's for one update.

    Works in graph code (inside ``tf.function``, ``model.fit``'s train step)
    and eagerly. A ``LossScaleOptimizer`` forwards to the optimizer it wraps.
    """

    def __init__(self, inner):
        self.inner = inner

    @property
    def target(self):
        """The optimizer whose learning rate is used (a loss-scale optimizer's inner one)."""
        if isinstance(self.inner, keras.optimizers.LossScaleOptimizer):
            return self.inner.inner_optimizer
        return self.inner

    def local(self):
        """This rank's learning rate now, as a float64 vector of one: what a post carries."""
        return tf.reshape(tf.cast(tf.convert_to_tensor(self.target.learning_rate), tf.float64), [1])

    def apply_with(self, value, update) -> None:
        """Run ``update()`` (one inner update) with the learning rate ``value``
        (a float64 scalar tensor), then give the optimizer this rank's own back."""
        target = self.target
        current = target.learning_rate
        if isinstance(current, keras.Variable):
            # A float rate: the variable holds the round's rate for the update, then the rank's own.
            own = tf.convert_to_tensor(current)
            target.learning_rate = tf.cast(value, own.dtype)
            try:
                update()
            finally:
                target.learning_rate = own
            return
        # A schedule or a callable is evaluated when the update reads the rate:
        # for this update (while it is traced, or run eagerly) the rate is the
        # round's. Keras keeps the schedule object only in this attribute.
        own = target._learning_rate
        dtype = tf.convert_to_tensor(current).dtype
        target.learning_rate = lambda: tf.cast(value, dtype)
        try:
            update()
        finally:
            target.learning_rate = own
