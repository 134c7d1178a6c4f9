"""``hvd.elastic`` for TensorFlow 2 (eager): Horovod's ``run``,
``TensorFlowKerasState`` and ``TensorFlowState``. With
``hvd.init(elastic=True)`` the survivors of a dead rank go on in the same
processes (docs/elastic.md, "Horovod's elastic API").

Example::

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

    train(state)
"""

from __future__ import annotations

import tensorflow as tf

from ..elastic import ElasticCollectives, HorovodInternalError, HostsUpdatedInterrupt, ObjectState, run
from .functions import broadcast_variables


def _optimizer_variables(optimizer) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` (eager) plus plain values: ``save`` copies
    the variables' values to host memory, ``restore`` assigns them back,
    ``sync`` assigns rank 0's (``broadcast_variables``) and then saves.
    TensorFlow 1 sessions are not supported (``session`` must be None).

    Example::

        state = hvd.elastic.TensorFlowState([w, b], epoch=0)
    """

    def __init__(self, variables=None, session=None, collectives: ElasticCollectives | None = None, **kwargs):
        if session is not None:
            raise ValueError("TensorFlowState: TensorFlow 1 sessions are not supported (run eagerly)")
        if variables is None:
            raise ValueError("TensorFlowState: pass the variables to track (TensorFlow 2 has no global list)")
        self.variables = list(variables)
        self._save_variables()
        super().__init__(collectives, **kwargs)

    def _tracked(self) -> list:
        return self.variables

    def _before_copy(self) -> None:
        """Bring every rank's variables to the same values first (nothing here)."""

    def _save_variables(self) -> None:
        # Pairs, not a list of values: an optimizer builds its variables at its first step, after the state
        # was made; a restore leaves the variables made since the save as they are.
        self._saved_values = [(v, v.numpy()) for v in self._tracked()]

    def save(self) -> None:
        self._before_copy()
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in self._saved_values:
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        self._before_copy()
        broadcast_variables(self._tracked(), root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """A built Keras model and its optimizer (``optimizer`` or the model's
    compiled one) plus plain values. As :class:`TensorFlowState` over the
    model's and the optimizer's variables; before copying or broadcasting
    them it calls the optimizer's ``flush()`` (hvd_partial's Keras
    ``DistributedOptimizer``), a collective after which every rank's
    variables are bitwise alike. With ``DistributedGradientTape``, call
    ``hvd.flush_tapes()`` before ``commit()`` yourself.

    Example::

        state = hvd.elastic.TensorFlowKerasState(model, epoch=0, batch=0)
    """

    def __init__(self, model, optimizer=None, backend=None, collectives: ElasticCollectives | None = None,
                 **kwargs):
        if hasattr(model, "build") and not model.built:
            raise ValueError("TensorFlowKerasState: the model must be built first (model.build(input_shape))")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        super().__init__(variables=[], collectives=collectives, **kwargs)

    def _tracked(self) -> list:
        optimizer = [] if self.optimizer is None else _optimizer_variables(self.optimizer)
        return list(self.model.variables) + optimizer

    def _before_copy(self) -> None:
        flush = getattr(self.optimizer, "flush", None)
        if callable(flush):
            flush()


__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "HorovodInternalError", "HostsUpdatedInterrupt"]
