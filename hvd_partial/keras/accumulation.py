"""Local gradient accumulation of a Keras ``DistributedOptimizer`` with
``backward_passes_per_step > 1``: gradients are summed into optimizer
variables (checkpointed with the optimizer) and posted once every
``passes_per_post`` calls; every flush leaves the sums at zero on every rank.

Example::

    accumulation = GradientAccumulation(exchange, passes_per_post=4, average=False, carried=rate.local)
    accumulation.track(accumulators, passes)           # variables made in the optimizer's build()
    accumulation.add(grads, variables, model_variables, apply_one)   # in apply(), graph or eager
    accumulation.flush_pending(variables, model_variables, apply_one)  # in flush(), eager
"""

from __future__ import annotations

import tensorflow as tf

from ..errors import UnsupportedInputError
from ..tensorflow.exchange import GradientExchange, rank_label


class GradientAccumulation:
    """The sums of local gradients between two posts of one optimizer's stream.

    ``accumulators`` (one variable per model variable) and ``passes`` (an
    int32 counter) are the optimizer's variables, given by :meth:`track`.
    ``carried``: a function giving the values a post carries (graph ops),
    for a stream that carries any.
    """

    def __init__(self, exchange: GradientExchange, passes_per_post: int, average: bool, carried=None):
        self.exchange = exchange
        self.carried = carried
        self.passes_per_post = passes_per_post
        self.average = average
        self.accumulators: list = []
        self.passes = None

    def track(self, accumulators: list, passes) -> None:
        self.accumulators = list(accumulators)
        self.passes = passes

    def pending(self) -> int:
        """Eager: local passes summed since the last post."""
        return 0 if self.passes is None else int(self.passes.numpy())

    def add(self, grads: list, variables: list, model_variables: list, apply_one) -> None:
        """Sum ``grads`` in; on the ``passes_per_post``-th pass post the sums and apply the rounds with ``apply_one``."""
        dense = [None if g is None else self._densify(g, v) for g, v in zip(grads, variables)]
        self.exchange.make_plan(dense, variables)  # checks the gradients before any state changes
        accumulators = self._accumulators_for(variables, model_variables, [g is not None for g in dense])
        for grad, accumulator in zip(dense, accumulators):
            if accumulator is not None:
                accumulator.assign_add(grad)
        passes = self.passes.assign_add(1)

        def post():
            self.post(accumulators, variables, apply_one)
            return tf.constant(True)

        tf.cond(passes >= self.passes_per_post, post, lambda: tf.constant(False))

    def flush_pending(self, variables: list, model_variables: list, apply_one) -> int:
        """Eager: post the sums of an incomplete group of passes (they are not lost); returns the updates applied."""
        if self.pending() == 0:
            return 0
        active = {s.index for s in self.exchange.plan.slots}
        accumulators = self._accumulators_for(variables, model_variables, [i in active for i in range(len(variables))])
        before = self.exchange.updates
        # Compiled, as in a train step (see apply_compiled).
        tf.function(lambda: self.post(accumulators, variables, apply_one), autograph=False)()
        return self.exchange.updates - before

    def post(self, accumulators: list, variables: list, apply_one) -> None:
        """Post the sums (averaged over the passes if asked), zero them, apply every round taken."""
        scale = 1.0 / self.passes_per_post if self.average else None
        summed = []
        for acc in accumulators:
            if acc is None:
                summed.append(None)
                continue
            value = tf.identity(acc.value)
            summed.append(value * tf.cast(scale, value.dtype) if scale is not None else value)
        rounds = self.exchange.exchange(summed, variables, carried=None if self.carried is None else self.carried())
        with tf.control_dependencies(list(rounds.stacked)):
            for acc in accumulators:
                if acc is not None:
                    acc.assign(tf.zeros_like(acc.value))
            self.passes.assign(0)
        rounds.apply_with(apply_one, variables)

    def _accumulators_for(self, variables: list, model_variables: list, active: list) -> list:
        index = {id(v): i for i, v in enumerate(model_variables)}
        out = []
        for var, used in zip(variables, active):
            position = index.get(id(var))
            if used and position is None:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: variable {getattr(var, 'path', var)!r} was not among the variables "
                    "the DistributedOptimizer was built with")
            out.append(self.accumulators[position] if used else None)
        return out

    def _densify(self, grad, var):
        if isinstance(grad, tf.IndexedSlices):
            if not self.exchange.sparse_as_dense:
                raise UnsupportedInputError(
                    f"rank {rank_label()}: the gradient of {getattr(var, 'path', var)!r} is sparse "
                    "(tf.IndexedSlices); pass sparse_as_dense=True to DistributedOptimizer")
            return tf.convert_to_tensor(grad)
        return grad
