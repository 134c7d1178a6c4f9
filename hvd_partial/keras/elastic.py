"""``hvd.elastic`` for Keras 3: Horovod's ``KerasState`` and the callbacks
that commit and track the state during ``model.fit``. With
``hvd.init(elastic=True)`` the survivors of a dead rank go on in the same
processes (docs/elastic.md, "Horovod's elastic API").

Example::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, steps_per_epoch=100, epochs=epochs - state.epoch,
                  callbacks=[hvd.elastic.UpdateBatchStateCallback(state),
                             hvd.elastic.UpdateEpochStateCallback(state),
                             hvd.elastic.CommitStateCallback(state, batches_per_commit=10)])

    train(state)
"""

from __future__ import annotations

import keras

from ..elastic import HorovodInternalError, HostsUpdatedInterrupt, run
from ..tensorflow.elastic import TensorFlowKerasState


class KerasState(TensorFlowKerasState):
    """A built Keras model and its optimizer (``optimizer`` or the compiled
    one) plus plain values; see :class:`TensorFlowKerasState`.

    Example::

        state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    """

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` after every ``batches_per_commit`` batches and at
    each epoch's end. Each commit is a collective (it flushes the optimizer
    and checks for a world change), so every rank must run as many batches.

    Example::

        CommitStateCallback(state, batches_per_commit=10)
    """

    def __init__(self, state, batches_per_commit: int = 1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # every rank counts from the same point after a reset

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the number of the last finished batch (0 at
    an epoch's end). With ``steps_per_epoch``, the first epoch after a reset
    runs only the steps the interrupted epoch had left.

    Example::

        UpdateBatchStateCallback(state)
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        steps = self.params.get("steps") if self.params else None
        if steps:
            if self.steps_per_epoch is None:
                self.steps_per_epoch = steps
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of epochs finished, counted across
    resets (``model.fit`` counts from 0 at each call).

    Example::

        UpdateEpochStateCallback(state)
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        # One past the finished epoch, so that a reset after state.batch went back to 0 does not repeat it.
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
           "HorovodInternalError", "HostsUpdatedInterrupt"]
