"""Sync mode's overlap of reductions with the backward pass, TensorFlow side
(``overlap_backward``).

With ``fusion_threshold_bytes=512`` the MLP below (float32) is four fused
groups, so four buckets. Each case trains with overlap on, then (after
``shutdown`` and ``init``) the same steps with overlap off: ``model.fit``,
``backward_passes_per_step=2``, ``steps_per_execution=3``, fp16 compression, a ``tf.function`` step with
``DistributedGradientTape`` followed by a flush, and the same tape eagerly.
Last, ``fit`` with overlap on rank 0 only, which must fail on every rank.

The probe: a custom gradient between the first and the second layer, which
the backward pass reaches after the last layer's gradients (the first bucket)
and before the first layer's, waits (up to 60 s) until this rank posted its
first bucket. With overlap the post runs on TensorFlow's other inter-op thread
while the probe waits; if the buckets went out only after the whole backward
pass, the probe would give up and report it.

Argument: none. Report per case and setting: weight digests, updates, rounds,
the streams posted, and the probe's findings.
"""

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import threading

import keras
import tensorflow as tf

import hvd_partial.keras as hvd
import hvd_partial.tensorflow as hvd_tf
from hvd_partial.errors import MismatchError
from hvd_partial.tensorflow.exchange import existing_exchange
from support import phase, report

# The probe needs a second inter-op thread to run a bucket's post while the backward pass waits.
tf.config.threading.set_inter_op_parallelism_threads(2)

BATCH, STEPS, THRESHOLD = 4, 6, 512
PROBE_WAIT_SECONDS = 60.0


def mlp(probe=None) -> keras.Model:
    """16 -> 12 -> 12 -> 3. Groups of at most 512 bytes, cut in variable order: [w1] (768 B, alone),
    [b1], [w2], [b2, w3, b3]; posted last first, so the first bucket needs no gradient behind ``probe``."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(12, activation="tanh")(inputs)
    h = keras.layers.Dense(12, activation="tanh")(h if probe is None else probe(h))
    return keras.Model(inputs, keras.layers.Dense(3)(h))


def streams_posted() -> list:
    return sorted(name for name in hvd_tf.stats() if ".overlap." in name or name.startswith("keras."))


def fit_case(xs, ys, passes: int = 1, steps_per_execution: int = 1, compression=hvd.Compression.none) -> dict:
    model = mlp()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), mode=hvd.Sync(),
                                   backward_passes_per_step=passes, compression=compression)
    model.compile(optimizer=opt, loss=C.LOSS, steps_per_execution=steps_per_execution)
    model.fit(xs, ys, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    overlap = opt.exchange.overlap
    return {"digest": C.state_digest(model, opt), "updates": opt.exchange.updates, "rounds": opt.exchange.rounds_taken,
            "groups": len(opt.exchange.plan.groups), "buckets": None if overlap is None else len(overlap.buckets),
            "streams": streams_posted()}


def tape_case(xs, ys, name: str, compiled: bool) -> dict:
    model = mlp()
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, mode=hvd.Sync(), name=name)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    run = tf.function(step) if compiled else step
    for t in range(STEPS):
        run(xs[t * BATCH:(t + 1) * BATCH], ys[t * BATCH:(t + 1) * BATCH])
    flushed = len(hvd_tf.flush_gradients(name))
    exchange = existing_exchange(name)
    return {"digest": C.state_digest(model, optimizer), "updates": exchange.updates, "rounds": exchange.rounds_taken,
            "flush_updates": flushed, "buckets": None if exchange.overlap is None else len(exchange.overlap.buckets)}


def probe_case(xs, ys) -> dict:
    """Whether a bucket's post runs while the backward pass still computes the first layer's gradient."""
    first_post = threading.Event()
    seen = {"waits": 0, "posted_in_time": 0}

    def wait_for_first_post(dy):
        seen["waits"] += 1
        seen["posted_in_time"] += int(first_post.wait(PROBE_WAIT_SECONDS))
        return dy

    @tf.custom_gradient
    def probe(x):
        def grad(dy):
            # Stateless: a stateful op would be ordered before the posts, which come later in the program.
            return tf.numpy_function(wait_for_first_post, [dy], dy.dtype, stateful=False)
        return tf.identity(x), grad

    model = mlp(probe=keras.layers.Lambda(probe))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Sync())
    model.compile(optimizer=opt, loss=C.LOSS)
    model.build((None, 16))
    opt.build(model.trainable_variables)
    exchange = opt.exchange
    post_bucket = exchange._post_bucket

    def post_and_tell(k, *flats):
        out = post_bucket(k, *flats)
        if k == 0:
            first_post.set()
        return out

    exchange._post_bucket = post_and_tell  # before the train step is traced: its posts call this
    out = {}
    for t in range(3):
        first_post.clear()
        model.train_on_batch(xs[t * BATCH:(t + 1) * BATCH], ys[t * BATCH:(t + 1) * BATCH])
    out.update(seen)
    out["digest"] = C.state_digest(model, opt)
    return out


def main():
    out = {}
    for setting in ("on", "off"):
        hvd.init(overlap_backward=setting == "on", fusion_threshold_bytes=THRESHOLD)
        rank, size = hvd.rank(), hvd.size()
        x, y = C.classification_data(size * BATCH * STEPS * 2)
        xs, ys = C.interleaved_shard(x, y, rank, size, BATCH)
        phase(f"fit, overlap {setting}")
        out[f"fit/{setting}"] = fit_case(xs, ys)
        phase(f"fit backward_passes_per_step=2, overlap {setting}")
        out[f"passes2/{setting}"] = fit_case(xs, ys, passes=2)
        phase(f"fit steps_per_execution=3, overlap {setting}")
        out[f"spe3/{setting}"] = fit_case(xs, ys, steps_per_execution=3)
        phase(f"fit fp16 compression, overlap {setting}")
        out[f"fp16/{setting}"] = fit_case(xs, ys, compression=hvd.Compression.fp16)
        phase(f"compiled tape, overlap {setting}")
        out[f"tape/{setting}"] = tape_case(xs, ys, f"tape-{setting}", compiled=True)
        phase(f"eager tape, overlap {setting}")
        out[f"eager/{setting}"] = tape_case(xs, ys, f"eager-{setting}", compiled=False)
        if setting == "on":
            phase("probe")
            out["probe"] = probe_case(xs, ys)
        hvd.shutdown()
    phase("overlap on rank 0 only")
    hvd.init(overlap_backward=rank == 0, fusion_threshold_bytes=THRESHOLD)
    try:
        fit_case(xs, ys)
        out["mismatch"] = "no error"
    except MismatchError as err:
        out["mismatch"] = str(err)
    hvd.shutdown()
    report(out)


main()
