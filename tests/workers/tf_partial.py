"""Solo and majority mode (argv[1], comma-separated) with injected delays: conservation and the
staleness bound through model.fit, and identical weights and optimizer
variables on every rank after model.fit (Adam) and after custom loops
(DistributedOptimizer.apply_gradients and DistributedGradientTape with SGD+momentum)."""

import sys
import time

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.keras as hvd
import hvd_partial.tensorflow as hvd_tf
from support import phase, report

MODES = sys.argv[1].split(",")
MODE = MODES[0]  # the mode of the scenario running now
TAU = 2


def make_mode():
    return hvd.Solo() if MODE == "solo" else hvd.Majority(seed=5, quorum=2)


class Straggle(keras.callbacks.Callback):
    """Rank 1 is always slow; other ranks are slow now and then (seeded)."""

    def __init__(self, rank, persistent=0.012, occasional=0.025):
        super().__init__()
        self.rank = rank
        self.rng = np.random.default_rng(100 + rank)
        self.persistent, self.occasional = persistent, occasional

    def delay(self):
        if self.rank == 1:
            time.sleep(self.persistent)
        elif self.rng.random() < 0.2:
            time.sleep(self.occasional)

    def on_train_batch_begin(self, batch, logs=None):
        self.delay()


class Digests(keras.callbacks.Callback):
    """What every rank sees at each epoch end (after the automatic flush)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(C.state_digest(self.model, self.model.optimizer))


def conservation(rank, size, passes=1):
    """One-hot inputs, loss = x . w, SGD(lr=1), op=Sum: each post's gradient is
    its one-hot row, so the final weights are minus the sum of all posts. With
    ``passes`` > 1 a post carries the sum of several steps, and the epoch-end
    flush posts the incomplete last group."""
    features = 8
    rng = np.random.default_rng(7 + rank)
    rows = 10 + 3 * rank  # ranks run different numbers of steps
    which = rng.integers(0, features, size=rows)
    x = np.eye(features, dtype=np.float32)[which]
    y = np.zeros((rows, 1), dtype=np.float32)
    model = keras.Sequential([keras.Input((features,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), mode=make_mode(), op=hvd.Sum, max_staleness=TAU,
                                   backward_passes_per_step=passes)
    model.compile(optimizer=opt, loss=lambda yt, yp: keras.ops.sum(yp, axis=-1))
    epochs = 2
    model.fit(x, y, batch_size=1, epochs=epochs, shuffle=False, verbose=0, callbacks=[Straggle(rank)])
    counts = np.bincount(which, minlength=features) * epochs
    total = np.sum(hvd.allgather_object(counts.tolist()), axis=0)
    stats = opt.stats()
    return {"weights": np.asarray(model.weights[0]).ravel().tolist(), "expected": (-total).tolist(),
            "iterations": int(opt.iterations), "stats": stats, "posts": rows * epochs, "rounds": opt.rounds}


def fit_adam(rank, size):
    x, y = C.classification_data(size * 48 + 60)
    xv, yv = x[-60:], y[-60:]
    xs, ys = x[:-60][rank::size], y[:-60][rank::size]
    model = C.mlp(seed=rank)  # different initial weights: the broadcast callback aligns them
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), mode=make_mode())
    model.compile(optimizer=opt, loss=C.LOSS, metrics=["accuracy"])
    digests = Digests()
    history = model.fit(xs, ys, batch_size=8, epochs=2, verbose=0, validation_data=(xv, yv),
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Straggle(rank),
                                   hvd.callbacks.MetricAverageCallback(), digests])
    return {"digest": C.state_digest(model, opt), "epoch_digests": digests.seen,
            "iterations": int(opt.iterations), "history": history.history, "stats": opt.stats()}


def custom_loops(rank, size):
    x, y = C.classification_data(size * 64, seed=5)
    xs, ys = x[rank::size], y[rank::size]
    steps = 10 + 2 * rank
    straggle = Straggle(rank)

    model = C.mlp(seed=3)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), mode=make_mode(),
                                   name=f"loop_opt_{MODE}")

    @tf.function
    def opt_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for t in range(steps):
        straggle.delay()
        opt_step(xs[t * 4:(t + 1) * 4], ys[t * 4:(t + 1) * 4])
    flushed = opt.flush()
    optimizer_loop = {"digest": C.state_digest(model, opt), "iterations": int(opt.iterations),
                      "flush_updates": flushed}

    model2 = C.mlp(seed=4)
    plain = keras.optimizers.SGD(0.05, momentum=0.9)
    plain.build(model2.trainable_variables)

    @tf.function
    def tape_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model2(xb, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, mode=make_mode(), name=f"tape_{MODE}")
        return tape.gradient_rounds(loss, model2.trainable_variables).apply(plain)

    taken = 0
    for t in range(steps):
        straggle.delay()
        taken += int(tape_step(xs[t * 4:(t + 1) * 4], ys[t * 4:(t + 1) * 4]))
    flushed = hvd_tf.flush_gradients(f"tape_{MODE}").apply(plain, model2.trainable_variables)
    tape_loop = {"digest": C.state_digest(model2, plain), "iterations": int(plain.iterations),
                 "updates_in_steps": taken, "flush_updates": int(flushed)}
    return {"optimizer": optimizer_loop, "tape": tape_loop}


def main():
    global MODE
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {}
    def accumulated(rank, size):
        return conservation(rank, size, passes=3)

    for MODE in MODES:
        part = out[MODE] = {"seconds": {}}
        for key, scenario in (("conservation", conservation), ("accumulated", accumulated), ("fit", fit_adam),
                              ("loops", custom_loops)):
            phase(f"{MODE} {key}")
            started = time.perf_counter()
            part[key] = scenario(rank, size)
            part["seconds"][key] = round(time.perf_counter() - started, 2)
    report(out)


main()
