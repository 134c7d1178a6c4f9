"""Rank 1 builds a different model: every rank must fail with an error that
says so, and none may hang. Four ways in: model.fit with the broadcast
callback, model.fit alone, an eager custom loop and a tf.function loop."""

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import tensorflow as tf

import hvd_partial.keras as hvd
from support import phase, report


def model_for(rank):
    return C.mlp(seed=0, hidden=12 if rank != 1 else 13)


def failure(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test looks at what was raised
        return {"type": type(err).__name__, "is_hvd": isinstance(err, hvd.HvdPartialError),
                "message": str(err)[:2000]}
    return None


def main():
    hvd.init()
    rank = hvd.rank()
    x, y = C.classification_data(64)
    out = {}

    phase("broadcast callback")
    model = model_for(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="with_broadcast"), loss=C.LOSS)
    out["broadcast"] = failure(lambda: model.fit(
        x, y, batch_size=8, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]))

    phase("first post in fit")
    model = model_for(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="in_fit"), loss=C.LOSS)
    out["fit"] = failure(lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0))

    phase("eager loop")
    model = model_for(rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="eager_loop")

    def eager():
        with tf.GradientTape() as tape:
            loss = C.LOSS(y[:8], model(x[:8]))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    out["eager"] = failure(eager)

    phase("tf.function loop")
    model = model_for(rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="graph_loop")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    out["graph"] = failure(lambda: step(x[:8], y[:8]))
    phase("shutdown")
    hvd.shutdown()
    report(out)


main()
