"""hvd.elastic for TensorFlow and Keras without MPI: the states' save and
restore, and the callbacks' commits and counters."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import hvd_partial.tensorflow as hvd_tf  # noqa: E402
import hvd_partial.tensorflow.keras as hvd  # noqa: E402
from hvd_partial.core.world import World  # noqa: E402
from hvd_partial.elastic import ElasticCollectives  # noqa: E402

COLLECTIVES = ElasticCollectives(lambda obj, name: obj, lambda obj, name: [obj], lambda: World.initial(0, 1),
                                 lambda: None)


def test_tensorflow_state_restores_variables_and_values():
    w = tf.Variable([1.0, 2.0])
    state = hvd_tf.elastic.TensorFlowState([w], collectives=COLLECTIVES, epoch=0)
    w.assign([3.0, 4.0])
    state.epoch = 1
    state.save()
    w.assign([9.0, 9.0])
    state.epoch = 2
    state.restore()
    assert w.numpy().tolist() == [3.0, 4.0] and state.epoch == 1


def test_keras_state_restores_model_and_optimizer_built_after_the_state():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    state = hvd.elastic.KerasState(model, optimizer, collectives=COLLECTIVES, batch=0)
    x, y = tf.ones((4, 2)), tf.zeros((4, 1))

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    step()
    state.commit()
    saved = [v.numpy().copy() for v in model.variables + list(optimizer.variables)]
    step()
    state.restore()
    assert all((a == v.numpy()).all() for a, v in zip(saved, model.variables + list(optimizer.variables)))


def test_callbacks_commit_and_count():
    commits = []

    class Counting:
        epoch, batch = 3, 0

        def commit(self):
            commits.append(self.batch)

    state = Counting()
    commit = hvd.elastic.CommitStateCallback(state, batches_per_commit=2)
    batch, epoch = hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state)
    for cb in (commit, batch, epoch):
        cb.on_train_begin()
    for b in range(5):
        batch.on_train_batch_end(b)
        commit.on_train_batch_end(b)
    batch.on_epoch_end(0)
    commit.on_epoch_end(0)
    epoch.on_epoch_end(0)
    assert commits == [1, 3, 0] and state.epoch == 4 and state.batch == 0
    assert hvd.elastic.run is hvd_tf.elastic.run
