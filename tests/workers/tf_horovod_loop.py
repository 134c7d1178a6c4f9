"""Horovod's TF2 loop, unchanged (``tape = hvd.DistributedGradientTape(tape)``;
``opt.apply_gradients(zip(tape.gradient(loss, vars), vars))`` inside
``tf.function``), in the mode named by argv[1] (``default``: no mode given,
HVD_PARTIAL_MODE decides), with a persistent straggler and uneven step counts:

- conservation: one-hot losses, SGD(lr=1), op=Sum: after flush_tapes() the
  weights are exactly minus the sum of every rank's posts (no round lost,
  none applied twice); rank 1 posts each step only after rank 0 is two steps
  further, so its posts take several rounds (catch-ups) by construction;
- Adam with the first-batch broadcasts of Horovod's examples: weights and
  optimizer state bitwise identical on every rank after flush_tapes();
- the same loop eagerly; gradients changed before apply_gradients: ConfigError;
- shutdown() then init(): the same tape streams and a DistributedOptimizer go on.
"""

import os
import sys
import time

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.tensorflow as hvd
import hvd_partial.tensorflow.keras as hvd_keras
from support import phase, report

MODE = sys.argv[1]
# Majority rounds wait for a designated initiator, who may be the lagging rank
# itself: the lag by construction is for solo only.
LAG = MODE != "majority"


def mode_kwargs():
    return {} if MODE == "default" else {"mode": hvd.Solo() if MODE == "solo" else hvd.Majority(seed=5)}


def straggle(rank, rng):
    if rank == 1:
        time.sleep(0.015)
    elif rng.random() < 0.2:
        time.sleep(0.02)


def _marker(t: int) -> str:
    return os.path.join(os.environ["HVD_TEST_OUT"], f"rank0.step{t}")


def mark_step(t: int) -> None:
    open(_marker(t), "w").close()


def lag_behind_rank0(t: int, rank0_steps: int) -> None:
    """Rank 1 posts step t only once rank 0 has finished step t + 2 (or all its
    steps): every such post then takes several rounds (a catch-up), by
    construction rather than by timing (solo: rank 0 never waits for rank 1
    within the staleness bound)."""
    wanted = _marker(min(t + 2, rank0_steps - 1))
    deadline = time.monotonic() + 120
    while not os.path.exists(wanted):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 never finished the step of {wanted}")
        time.sleep(0.005)


def conservation(rank, size):
    steps = [8 + 3 * r for r in range(size)]
    width = sum(steps)
    offset = sum(steps[:rank])
    w = tf.Variable(tf.zeros([width], tf.float64), name="w")
    opt = keras.optimizers.SGD(1.0)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(x * w)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum, **mode_kwargs())
        grads = tape.gradient(loss, [w])
        opt.apply_gradients(zip(grads, [w]))

    for t in range(steps[rank]):
        if LAG and rank == 1 and t > 0:  # round 0 needs every rank's first post
            lag_behind_rank0(t, steps[0])
        x = np.zeros(width)
        x[offset + t] = 1.0
        step(tf.constant(x))
        if rank == 0:
            mark_step(t)
    from hvd_partial.tensorflow.exchange import existing_exchange

    ex = existing_exchange(hvd.DEFAULT_TAPE_STREAM)
    updates_in_steps, posts = ex.updates, ex.posts
    flushed = hvd.flush_tapes()
    return {"lagged": LAG and rank == 1, "w": w.numpy().tolist(), "posts": posts, "updates_in_steps": updates_in_steps, "flushed": flushed,
            "iterations": int(opt.iterations)}


def adam_loop(rank, size, eager=False):
    x, y = C.classification_data(size * 48)
    xs, ys = x[rank::size], y[rank::size]
    model = C.mlp(seed=rank)  # different initial weights: the first-batch broadcast fixes them
    opt = keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(10 + rank)

    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = C.LOSS(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape, **mode_kwargs())
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    step = training_step if eager else tf.function(training_step)
    for t in range(10 + 2 * rank):
        straggle(rank, rng)
        step(xs[t * 4:(t + 1) * 4], ys[t * 4:(t + 1) * 4], t == 0)
    flushed = hvd.flush_tapes()
    return {"digest": C.state_digest(model, opt), "iterations": int(opt.iterations), "flushed": flushed}


def changed_gradients(rank, size):
    model = C.mlp(seed=7)
    opt = keras.optimizers.SGD(0.1)
    x, y = C.classification_data(8)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, name="clipped", **mode_kwargs())
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    try:
        step(x, y)
    except Exception as err:  # noqa: BLE001 - ConfigError, or autograph's StagingError carrying it
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None}


def after_reinit(rank, size):
    """The tape stream of adam_loop and a Keras DistributedOptimizer, after shutdown() and init()."""
    from hvd_partial.tensorflow import state as tf_state
    from hvd_partial.tensorflow.exchange import existing_exchange, posted_since_init

    x, y = C.classification_data(size * 24, seed=5)
    xs, ys = x[rank::size], y[rank::size]
    model = C.mlp(seed=0)
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    dopt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05), name="reinit_opt", **mode_kwargs())
    model2 = C.mlp(seed=0)
    rng = np.random.default_rng(20 + rank)

    @tf.function
    def tape_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, name="reinit_tape", **mode_kwargs())
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    @tf.function
    def keras_step(xb, yb):
        with tf.GradientTape() as tape2:
            loss2 = C.LOSS(yb, model2(xb, training=True))
        dopt.apply_gradients(zip(tape2.gradient(loss2, model2.trainable_variables), model2.trainable_variables))

    out = []
    for generation in range(2):
        # One stream per loop, flushed before the next loop posts to another.
        for t in range(5 + rank):
            straggle(rank, rng)
            tape_step(xs[t * 4:(t + 1) * 4], ys[t * 4:(t + 1) * 4])
        hvd.flush_tapes()
        for t in range(5 + rank):
            straggle(rank, rng)
            keras_step(xs[t * 4:(t + 1) * 4], ys[t * 4:(t + 1) * 4])
        dopt.flush()
        out.append([C.state_digest(model, opt), C.state_digest(model2, dopt), int(opt.iterations)])
        if generation == 0:
            traced_exchange = existing_exchange("reinit_tape")
            hvd.shutdown()
            hvd.init()
            # The adapter's state went with the session: nothing registered or posted yet.
            fresh = (tf_state.current() is None and existing_exchange("reinit_tape") is None
                     and not posted_since_init("reinit_tape"))
    # The function traced before shutdown() posted through its exchange, which re-entered the new session.
    reentered = traced_exchange is not None and existing_exchange("reinit_tape") is traced_exchange
    return {"generations": out, "fresh_after_init": fresh, "reentered": reentered}


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {}
    for key, scenario in (("conservation", conservation), ("adam", adam_loop),
                          ("eager", lambda r, s: adam_loop(r, s, eager=True)), ("changed", changed_gradients),
                          ("reinit", after_reinit)):
        phase(key)
        out[key] = scenario(rank, size)
    report(out)


main()
