"""Sync mode equals one process training on the concatenated batches:
model.fit with SGD+momentum and with Adam, a custom loop with
DistributedGradientTape, and backward_passes_per_step=2. The test runs it
with a fusion threshold that cuts the model into two buckets, posted as the
backward pass computes them (``overlap_backward``)."""

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.keras as hvd
import hvd_partial.tensorflow as hvd_tf
from support import phase, report

BATCH, STEPS = 4, 12


def reference(optimizer, x, y, batch, epochs=1):
    """One process, no hvd_partial: the same model on the global batches."""
    model = C.mlp(seed=7)
    model.compile(optimizer=optimizer, loss=C.LOSS)
    model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return C.weights(model), int(optimizer.iterations)


def distributed_fit(optimizer, xs, ys, epochs=1, **kwargs):
    model = C.mlp(seed=7)
    opt = hvd.DistributedOptimizer(optimizer, mode=hvd.Sync(), **kwargs)
    model.compile(optimizer=opt, loss=C.LOSS)
    model.fit(xs, ys, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    overlap = opt.exchange.overlap  # the test runs with fusion_threshold_bytes small enough for two buckets
    return C.weights(model), int(opt.iterations), C.state_digest(model, opt), overlap and len(overlap.buckets)


def max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x, y = C.classification_data(size * BATCH * STEPS)
    xs, ys = C.interleaved_shard(x, y, rank, size, BATCH)
    out = {}

    phase("fit sgd momentum")
    mine, iters, dig, buckets = distributed_fit(keras.optimizers.SGD(0.1, momentum=0.9), xs, ys, epochs=2)
    ref, ref_iters = reference(keras.optimizers.SGD(0.1, momentum=0.9), x, y, size * BATCH, epochs=2)
    out["sgd"] = {"diff": max_diff(mine, ref), "iters": iters, "ref_iters": ref_iters, "digest": dig,
                  "moved": max_diff(mine, C.weights(C.mlp(seed=7))), "buckets": buckets}

    phase("fit adam")
    mine, iters, dig, _ = distributed_fit(keras.optimizers.Adam(0.01), xs, ys)
    ref, ref_iters = reference(keras.optimizers.Adam(0.01), x, y, size * BATCH)
    out["adam"] = {"diff": max_diff(mine, ref), "iters": iters, "ref_iters": ref_iters, "digest": dig}

    phase("fit backward_passes_per_step=2")
    mine, iters, dig, _ = distributed_fit(keras.optimizers.SGD(0.1, momentum=0.9), xs, ys,
                                          backward_passes_per_step=2, average_aggregated_gradients=True)
    # Two local passes averaged, then averaged over ranks: one step on 2 * size * BATCH rows.


    ref, ref_iters = reference(keras.optimizers.SGD(0.1, momentum=0.9), x, y, 2 * size * BATCH)
    out["bpps"] = {"diff": max_diff(mine, ref), "iters": iters, "ref_iters": ref_iters, "digest": dig}

    phase("custom loop with DistributedGradientTape")
    model = C.mlp(seed=7)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = C.LOSS(yb, model(xb, training=True))
        tape = hvd_tf.DistributedGradientTape(tape, mode=hvd.Sync(), name="sync-tape")
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for t in range(STEPS):
        step(xs[t * BATCH:(t + 1) * BATCH], ys[t * BATCH:(t + 1) * BATCH])
    leftover = len(hvd_tf.flush_gradients("sync-tape"))
    ref, ref_iters = reference(keras.optimizers.SGD(0.1, momentum=0.9), x, y, size * BATCH)
    out["tape"] = {"diff": max_diff(C.weights(model), ref), "iters": int(optimizer.iterations),
                   "ref_iters": ref_iters, "digest": C.state_digest(model, optimizer), "flush_updates": leftover}
    report(out)


main()
