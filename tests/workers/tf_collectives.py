"""Horovod's TensorFlow helper collectives with their signatures, eagerly and
in tf.function: allreduce (op, average=, pre/postscale, IndexedSlices),
grouped_allreduce, allgather (uneven first dimensions), reducescatter,
alltoall (default and explicit splits), broadcast, topology; and a
mismatched allgather that fails on every rank instead of hanging. Horovod's
semantics beyond values: gradients through every collective, integer
prescaling, the error classes, TF1-graph execution order, in-place
broadcast in a graph and model-parallel local sources. Plus the
Keras learning-rate callbacks in solo mode: Horovod's per-batch callbacks and a
rate set by hand at every local batch keep the replicas identical (the rate
travels with the rounds)."""

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.tensorflow as hvd
import hvd_partial.tensorflow.keras as hvd_keras
from support import phase, report


def collectives(rank, size):
    out = {}
    x = tf.constant([1.0 + rank, 10.0 * rank], tf.float32)
    out["average"] = hvd.allreduce(x).numpy().tolist()
    out["sum_average_false"] = hvd.allreduce(x, average=False).numpy().tolist()
    out["min"] = hvd.allreduce(x, op=hvd.Min).numpy().tolist()
    out["max"] = hvd.allreduce(x, op=hvd.Max).numpy().tolist()
    out["product"] = hvd.allreduce(x, op=hvd.Product).numpy().tolist()
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5).numpy().tolist()
    out["fp16"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16).numpy().tolist()
    grouped = hvd.grouped_allreduce([x, tf.constant([[rank]], tf.float64)], op=hvd.Sum)
    out["grouped"] = [g.numpy().tolist() for g in grouped]
    out["allgather"] = hvd.allgather(tf.fill([rank + 1, 2], rank)).numpy().tolist()
    out["reducescatter"] = hvd.reducescatter(tf.ones([2 * size + 1, 2]) * (rank + 1), op=hvd.Sum).numpy().tolist()
    received = hvd.alltoall(tf.range(size * 2) + 100 * rank)  # Horovod: no splits given, none returned
    out["alltoall"] = received.numpy().tolist()
    ragged = [r + 1 for r in range(size)]  # rank i sends i+1 rows to every rank... per destination j: j+1 rows
    received, splits = hvd.alltoall(tf.fill([sum(ragged)], rank), splits=ragged)
    out["alltoall_splits"] = [received.numpy().tolist(), splits.numpy().tolist()]
    out["broadcast_bool"] = hvd.broadcast(tf.constant([rank == 0, rank != 0]), root_rank=0).numpy().tolist()
    sparse = tf.IndexedSlices(tf.constant([[1.0 * rank]]), tf.constant([rank]), dense_shape=tf.constant([size, 1]))
    reduced = hvd.allreduce(sparse, op=hvd.Sum)
    out["sparse"] = tf.convert_to_tensor(reduced).numpy().tolist()

    @tf.function
    def in_graph(v):
        return hvd.allreduce(v, op=hvd.Max), hvd.allgather(v)

    mx, gathered = in_graph(x)
    out["graph"] = [mx.numpy().tolist(), gathered.numpy().tolist()]
    out["keras_allreduce"] = hvd_keras.allreduce(np.array([float(rank)]), "k", False).numpy().tolist()
    out["topology"] = [hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous(), int(hvd.rank_op()),
                       int(hvd.size_op())]
    try:
        hvd.allgather(tf.zeros([1, 2 + (rank == 1)]))
        out["mismatch"] = None
    except Exception as err:  # noqa: BLE001 - the error as TensorFlow hands it over
        out["mismatch"] = f"{type(err).__name__}: {err}"
    out["join"] = hvd.join()
    return out


def horovod_semantics(rank, size):
    out = {}
    x = tf.Variable([1.0, 2.0, 3.0] * size)
    with tf.GradientTape(persistent=True) as tape:
        ys = {"allreduce_sum": hvd.allreduce(x * (rank + 1), op=hvd.Sum),
              "allreduce_scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
              "grouped": hvd.grouped_allreduce([x, x * 2.0], op=hvd.Average),
              "allgather": hvd.allgather(x),
              "broadcast": hvd.broadcast(x, root_rank=1),
              "reducescatter": hvd.reducescatter(x, op=hvd.Sum),
              "alltoall": hvd.alltoall(x)}
    out["grads"] = {name: tape.gradient(y, x).numpy().tolist() for name, y in ys.items()}
    # Integers are scaled in double precision and truncated on each rank before the sum.
    out["int_prescale"] = hvd.allreduce(tf.constant([3, 5], tf.int32), op=hvd.Sum, prescale_factor=0.5).numpy().tolist()
    out["alltoall_no_splits_type"] = type(hvd.alltoall(tf.range(size))).__name__
    errors = {}
    for what, call in {"mismatch": lambda: hvd.allreduce(tf.ones([2 + rank])),
                       "bad_split": lambda: hvd.alltoall(tf.ones([size + 1]))}.items():
        try:
            call()
            errors[what] = None
        except Exception as err:  # noqa: BLE001 - the class TensorFlow hands over is what is checked
            errors[what] = type(err).__name__
    out["errors"] = errors
    with tf.Graph().as_default():
        # Built in one order, run in one session.run: each rank's graph runs them in the order built.
        values = [tf.fill([n + 1], float(n * (rank + 1))) for n in range(6)]
        reduced = [hvd.allreduce(v, op=hvd.Sum) for v in values]
        var = tf.compat.v1.Variable([float(rank)] * 2)
        assigned, = hvd.broadcast_([var], root_rank=size - 1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            out["graph_order"] = [r.tolist() for r in session.run(reduced)]
            out["graph_broadcast_"] = session.run(assigned).tolist()
    local = tf.Variable(tf.ones([2 + rank, 2]))  # a shape of this rank's own

    @tf.function
    def model_parallel_step():
        with tf.GradientTape() as tape:
            loss = (tf.reduce_sum(local) + tf.reduce_sum(x)) * (rank + 1)
        tape = hvd.DistributedGradientTape(tape, mode=hvd.Sync(), name="model_parallel")
        tape.register_local_source(local)
        return tape.gradient(loss, [local, x])

    g_local, g_shared = model_parallel_step()
    out["local_source"] = [g_local.numpy().tolist(), g_shared.numpy().tolist()]
    return out


class PerBatchRate(keras.callbacks.Callback):
    """Horovod-style: sets the rate at every local batch."""

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate = 0.01 * (1 + batch)


def schedules(rank, size):
    x, y = C.classification_data(size * 48, seed=3)
    xs, ys = x[rank::size], y[rank::size]
    out = {}
    model = C.mlp(seed=5)
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), mode=hvd.Solo(), name="sched")
    model.compile(optimizer=opt, loss=C.LOSS)
    slow = rank == 1

    class Slow(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if slow:
                import time
                time.sleep(0.01)

    callbacks = [Slow(), hvd_keras.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1),
                 hvd_keras.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda e: 0.5 ** e, start_epoch=1,
                                                                  staircase=False)]
    model.fit(xs, ys, batch_size=4, epochs=3, verbose=0, callbacks=callbacks)
    out["digest"] = C.state_digest(model, opt)
    out["lr"] = float(opt.learning_rate)
    model2 = C.mlp(seed=6)
    opt2 = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), mode=hvd.Solo(), name="per_batch")
    model2.compile(optimizer=opt2, loss=C.LOSS)
    model2.fit(xs, ys, batch_size=4, epochs=1, verbose=0, callbacks=[Slow(), PerBatchRate()])
    out["per_batch"] = {"digest": C.state_digest(model2, opt2), "lr": float(opt2.learning_rate),
                        "batches": len(xs) // 4}
    return out


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    phase("collectives")
    out = {"collectives": collectives(rank, size)}
    phase("horovod_semantics")
    out["semantics"] = horovod_semantics(rank, size)
    phase("schedules")
    out["schedules"] = schedules(rank, size)
    report(out)


main()
