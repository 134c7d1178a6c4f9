"""Round-driven learning rates of a Keras ``DistributedOptimizer``: the rate
of each update is a function of the update count (``iterations``), identical
on every rank, however many rounds a rank applies in one step.

:class:`RoundRates` holds a traced schedule (``set_schedule``, used by
``LearningRateWarmupCallback``) and Python rules evaluated at run time
(``add_rule``, used by ``LearningRateScheduleCallback``); ``before_update``
sets the inner optimizer's rate before each update.

Example::

    rates = RoundRates()
    rates.add_rule(inner, lambda r: 0.1 if r < 1000 else 0.01)
    rates.before_update(inner)      # in the update loop, before inner.apply(...)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..errors import ConfigError


class RoundRates:
    """The learning-rate schedule and rules one optimizer applies per update."""

    def __init__(self):
        self.schedule = None  # fn(r) -> rate, traced: r is a float32 tensor
        self.until_round: int | None = None
        self.rules: list = []  # Python rules fn(update) -> rate or None, evaluated at run time

    def set_schedule(self, inner, fn, until_round: int) -> None:
        """Use ``fn(r)`` as the rate of update ``r`` while ``r <= until_round`` (None: no schedule)."""
        if fn is not None:
            try:
                inner.learning_rate = float(inner.learning_rate)  # raises if the rate is a schedule
            except TypeError as err:
                raise ConfigError(
                    f"the inner optimizer {inner.name!r} has a learning-rate schedule, which a round-driven "
                    "schedule cannot override; create it with a float learning_rate") from err
        self.schedule = fn
        self.until_round = until_round

    def add_rule(self, inner, rule) -> None:
        """Call ``rule(r)`` before every update; a float it returns becomes the rate (the last rule's wins)."""
        try:
            float(inner.learning_rate)
        except TypeError as err:
            raise ConfigError(
                f"the inner optimizer {inner.name!r} has a learning-rate schedule, which a round-driven "
                "learning-rate callback cannot override; create it with a float learning_rate") from err
        self.rules.append(rule)

    def remove_rule(self, rule) -> None:
        self.rules = [r for r in self.rules if r is not rule]

    def rule_rate(self, update) -> np.float64:
        """Numpy side: the rate the rules give update ``update`` (NaN: none of them sets one)."""
        rate = None
        for rule in list(self.rules):
            value = rule(int(update))
            if value is not None:
                rate = value
        return np.float64(np.nan if rate is None else rate)

    def before_update(self, inner) -> None:
        """Set ``inner``'s learning rate for its next update (graph ops; nothing if no rule or schedule)."""
        if self.rules:
            current = tf.convert_to_tensor(inner.learning_rate)
            wanted = tf.numpy_function(self.rule_rate, [inner.iterations], tf.float64, stateful=True,
                                       name="hvd_partial_lr_rule")
            wanted.set_shape([])
            inner.learning_rate = tf.where(tf.math.is_nan(wanted), current, tf.cast(wanted, current.dtype))
        if self.schedule is not None:
            step = tf.cast(inner.iterations, tf.float32)
            current = tf.convert_to_tensor(inner.learning_rate)
            wanted = tf.cast(self.schedule(step), current.dtype)
            inner.learning_rate = tf.where(step <= float(self.until_round), wanted, current)
