"""model.fit with the callbacks, save / load round trips, an eager custom
loop, sparse gradients and the errors a user can hit (argv[1]: a directory
shared by the ranks)."""

import os
import sys

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.keras as hvd
import hvd_partial.tensorflow as hvd_tf
from support import phase, report

SHARED = sys.argv[1]
LR = 0.05
WARMUP = 8


class LearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []  # (updates applied before the batch, learning rate read back after it)
        self.updates = None

    def on_train_batch_begin(self, batch, logs=None):
        self.updates = int(self.model.optimizer.iterations)

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.updates, float(self.model.optimizer.learning_rate)))


def callbacks_and_saving(rank, size):
    x, y = C.classification_data(size * 64)
    xs, ys = x[rank::size], y[rank::size]
    model = C.mlp(seed=rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(LR), mode=hvd.Solo())
    model.compile(optimizer=opt, loss=C.LOSS, metrics=["accuracy"])
    rates, participation = LearningRates(), hvd.callbacks.ParticipationReportCallback()
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_rounds=WARMUP)
    history = model.fit(xs, ys, batch_size=8, epochs=2, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback(), warmup, rates, participation])
    out = {"history": history.history, "rates": rates.seen, "participation": participation.history,
           "digest": C.state_digest(model, opt), "iterations": int(opt.iterations)}

    phase("save and load")
    path = os.path.join(SHARED, "model.keras")
    if rank == 0:
        model.save(path)
    hvd.barrier()
    loaded = keras.models.load_model(path)
    lopt = loaded.optimizer
    out["loaded"] = {"type": type(lopt).__name__, "mode": repr(lopt.mode), "inner": type(lopt.inner_optimizer).__name__,
                     "digest": C.state_digest(loaded, lopt), "iterations": int(lopt.iterations),
                     "stream": lopt.stream_name}
    # Training goes on from the loaded state, on the same stream (same name and settings).
    loaded.fit(xs, ys, batch_size=8, epochs=1, verbose=0)
    out["loaded"]["after_fit"] = C.state_digest(loaded, lopt)
    out["loaded"]["after_fit_iterations"] = int(lopt.iterations)

    phase("h5 and tf.train.Checkpoint")
    h5_path = os.path.join(SHARED, "model.h5")
    prefix = os.path.join(SHARED, "ckpt")
    if rank == 0:
        model.save(h5_path)
        tf.train.Checkpoint(model=model, optimizer=opt).write(prefix)
    hvd.barrier()
    h5 = keras.models.load_model(h5_path)
    hopt = h5.optimizer
    out["h5"] = {"type": type(hopt).__name__, "iterations": int(hopt.iterations)}
    hopt.build(h5.trainable_variables)  # Keras's .h5 loader leaves the moments for the first update
    out["h5"]["digest"] = C.state_digest(h5, hopt)
    h5.fit(xs, ys, batch_size=8, epochs=1, verbose=0)
    out["h5"]["after_fit"] = C.state_digest(h5, hopt)
    out["h5"]["after_fit_iterations"] = int(hopt.iterations)
    fresh = C.mlp(seed=99)
    fopt = hvd.DistributedOptimizer(keras.optimizers.Adam(LR), name=opt.name + "_restored")
    fopt.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fopt).read(prefix).assert_consumed()
    out["checkpoint"] = {"digest": C.state_digest(fresh, fopt), "iterations": int(fopt.iterations)}

    phase("load_model helper")
    plain = C.mlp(seed=11)
    plain.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=C.LOSS)
    plain.fit(x[:32], y[:32], batch_size=8, epochs=1, verbose=0)  # same data on every rank: same state
    plain_path = os.path.join(SHARED, "plain.keras")
    if rank == 0:
        plain.save(plain_path)
    hvd.barrier()
    wrapped = hvd.load_model(plain_path, mode=hvd.Majority(seed=3, quorum=1))
    retuned = hvd.load_model(path, mode=hvd.Majority(seed=4), name="reloaded_adam")
    out["helper"] = {"type": type(wrapped.optimizer).__name__, "mode": repr(wrapped.optimizer.mode),
                     "same_state": C.state_digest(wrapped, wrapped.optimizer.inner_optimizer)
                     == C.state_digest(plain, plain.optimizer),
                     "retuned_mode": repr(retuned.optimizer.mode), "retuned_stream": retuned.optimizer.stream_name}
    wrapped.fit(xs, ys, batch_size=8, epochs=1, verbose=0)
    out["helper"]["after_fit"] = C.state_digest(wrapped, wrapped.optimizer)
    return out


def eager_loop(rank, size):
    x, y = C.classification_data(size * 40, seed=2)
    xs, ys = x[rank::size], y[rank::size]
    model = C.mlp(seed=5)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), mode=hvd.Solo(), name="eager")
    for t in range(4 + rank):  # different step counts per rank
        with tf.GradientTape() as tape:
            loss = C.LOSS(ys[t * 4:(t + 1) * 4], model(xs[t * 4:(t + 1) * 4], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    opt.flush()
    return {"digest": C.state_digest(model, opt), "iterations": int(opt.iterations)}


def sparse(rank, size):
    rng = np.random.default_rng(rank)
    tokens = rng.integers(0, 20, size=(32, 5))
    labels = rng.integers(0, 2, size=32)

    def model_with(opt):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        model.compile(optimizer=opt, loss=C.LOSS)
        return model

    out = {}
    model = model_with(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Solo(), name="sparse_no"))
    try:
        model.fit(tokens, labels, batch_size=8, epochs=1, verbose=0)
        out["rejected"] = None
    except hvd.UnsupportedInputError as err:
        out["rejected"] = str(err)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Solo(), sparse_as_dense=True,
                                   name="sparse_yes")
    model = model_with(opt)
    model.fit(tokens, labels, batch_size=8, epochs=1, verbose=0)
    out["dense_digest"] = C.state_digest(model, opt)
    return out


def tape_gradient_in_solo():
    """A tape's solo gradients given to a DistributedOptimizer (reduced twice): ConfigError."""
    model = C.mlp(seed=1)
    dopt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Solo(), name="twice")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(np.ones((2, 16), np.float32)))
    grads = hvd_tf.DistributedGradientTape(tape, mode=hvd.Solo(), name="never").gradient(
        loss, model.trainable_variables)
    try:
        dopt.apply_gradients(zip(grads, model.trainable_variables))
        return None
    except hvd.ConfigError as err:
        return str(err)


def jit_compiled_model(rank, size):
    """model.compile(jit_compile=True), the default on GPUs: fit must still work."""
    x, y = C.classification_data(size * 32, seed=8)
    model = C.mlp(seed=2)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), mode=hvd.Solo(), name="jit")
    model.compile(optimizer=opt, loss=C.LOSS, jit_compile=True)
    requested = bool(model.jit_compile)
    model.fit(x[rank::size], y[rank::size], batch_size=8, epochs=1, verbose=0)
    out = {"requested": requested, "digest": C.state_digest(model, opt), "iterations": int(opt.iterations)}
    # Several train steps per compiled call: the post runs inside Keras's own loop.
    model = C.mlp(seed=2)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), mode=hvd.Solo(), name="multi_step")
    model.compile(optimizer=opt, loss=C.LOSS, steps_per_execution=3)
    model.fit(x[rank::size], y[rank::size], batch_size=4, epochs=1, verbose=0)
    out["multi_step"] = {"digest": C.state_digest(model, opt), "iterations": int(opt.iterations),
                         "posts": opt.exchange.posts}
    return out


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {}
    phase("callbacks")
    out["fit"] = callbacks_and_saving(rank, size)
    phase("eager loop")
    out["eager"] = eager_loop(rank, size)
    phase("sparse")
    out["sparse"] = sparse(rank, size)
    out["tape_gradient_solo"] = tape_gradient_in_solo()
    phase("jit_compile")
    out["jit"] = jit_compiled_model(rank, size)
    report(out)


main()
