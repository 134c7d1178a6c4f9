"""Worker: process sets in hvd_partial.tensorflow (4 ranks: evens [0, 2] and
odds [1, 3], added at init): every collective on the rank's own set, eagerly,
in tf.function and in a TF1-style graph; their gradients (reduced within the
set); size_op / process_set_included_op; a rank calling a collective on the
other set (InvalidArgumentError) or on a set never added (ValueError);
DistributedGradientTape and the Keras DistributedOptimizer on a set (sync by
default; solo and majority on the set's own engine, with integer gradients
and Sum so that every post is counted exactly; a rank outside the set alone);
and the Keras PartialDistributedOptimizer (local layers not reduced). Every rank reports a dict the test asserts on."""

import tf_common as C  # noqa: F401,I001 (sets TensorFlow up first)

import keras
import numpy as np
import tensorflow as tf

import hvd_partial.tensorflow as hvd
import hvd_partial.keras as hvd_keras
from support import phase, report


def _error(fn) -> list:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the class the caller sees
        return [type(err).__name__, str(err)[:4000]]
    return [None, ""]


def collectives(r, mine, other) -> dict:
    out = {}
    x = tf.constant([float(r), 1.0])
    out["allreduce"] = hvd.allreduce(x, op=hvd.Sum, process_set=mine).numpy().tolist()
    out["average"] = hvd.allreduce(x, process_set=mine).numpy().tolist()
    out["grouped"] = [t.numpy().tolist() for t in hvd.grouped_allreduce(
        [x, tf.constant([[r]], tf.float64)], op=hvd.Sum, process_set=mine)]
    out["allgather"] = hvd.allgather(tf.fill([r + 1, 2], r), process_set=mine)[:, 0].numpy().tolist()
    out["grouped_allgather"] = [t.numpy().tolist() for t in hvd.grouped_allgather(
        [tf.constant([r]), tf.constant([[r, r]])], process_set=mine)]
    out["broadcast"] = hvd.broadcast(tf.constant([r * 10]), root_rank=mine.ranks[-1],
                                     process_set=mine).numpy().tolist()
    received, splits = hvd.alltoall(tf.range(2) + 100 * r, splits=[1, 1], process_set=mine)
    out["alltoall"] = [received.numpy().tolist(), splits.numpy().tolist()]
    out["reducescatter"] = hvd.reducescatter(tf.ones([4, 1]) * r, op=hvd.Sum, process_set=mine).numpy().tolist()
    out["grouped_reducescatter"] = [t.numpy().tolist() for t in hvd.grouped_reducescatter(
        [tf.ones([2]) * r, tf.ones([2, 2])], op=hvd.Sum, process_set=mine)]
    var = tf.Variable([float(r), float(r)])
    hvd.broadcast_variables([var], root_rank=mine.ranks[0], process_set=mine)
    out["broadcast_variables"] = var.numpy().tolist()
    inplace = tf.Variable([float(r)])
    hvd.broadcast_([inplace], root_rank=mine.ranks[-1], process_set=mine)
    out["broadcast_"] = inplace.numpy().tolist()
    out["object"] = hvd.broadcast_object({"from": r}, root_rank=mine.ranks[-1], process_set=mine)
    out["object_fn"] = hvd.broadcast_object_fn(root_rank=mine.ranks[0], process_set=mine)(r)
    out["objects"] = hvd.allgather_object(r, process_set=mine)
    hvd.barrier(process_set=mine)
    out["size_op"] = [int(hvd.size_op(process_set_id=s.process_set_id)) for s in (mine, other)] + [int(hvd.size_op())]
    out["included_op"] = [int(hvd.process_set_included_op(process_set_id=s.process_set_id)) for s in (mine, other)]
    out["size_op_unknown"] = _error(lambda: hvd.size_op(process_set_id=17))

    @tf.function
    def in_function(v):
        return hvd.allreduce(v, op=hvd.Max, process_set=mine), hvd.allgather(v, process_set=mine)

    top, gathered = in_function(x)
    out["function"] = [top.numpy().tolist(), gathered.numpy().tolist()]
    with tf.Graph().as_default():
        summed = hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, process_set=mine)
        with tf.compat.v1.Session() as session:
            out["graph"] = session.run(summed).tolist()
    return out


def gradients(r, mine) -> dict:
    out = {}
    v = tf.Variable(tf.ones([4]) * (r + 1))
    with tf.GradientTape(persistent=True) as tape:
        summed = hvd.allreduce(v, op=hvd.Sum, process_set=mine)
        gathered = hvd.allgather(v, process_set=mine)
        sent = hvd.broadcast(v, root_rank=mine.ranks[0], process_set=mine)
        scattered = hvd.reducescatter(v, op=hvd.Sum, process_set=mine)
        swapped = hvd.alltoall(v, process_set=mine)
    out["allreduce"] = tape.gradient(summed, v).numpy().tolist()
    out["allgather"] = tape.gradient(gathered, v).numpy().tolist()
    out["broadcast"] = tape.gradient(sent, v).numpy().tolist()
    out["reducescatter"] = tape.gradient(scattered, v).numpy().tolist()
    out["alltoall"] = tape.gradient(swapped, v, output_gradients=tf.range(4.0) + 10 * r).numpy().tolist()
    with tf.Graph().as_default():
        t = tf.constant([1.0, 2.0]) * (r + 1)
        y = hvd.allreduce(t, op=hvd.Sum, process_set=mine)
        g = tf.gradients(y, t, tf.ones([2]))[0]
        with tf.compat.v1.Session() as session:
            out["graph_allreduce"] = session.run(g).tolist()
    return out


def outside(r, mine, other) -> dict:
    out = {"eager": _error(lambda: hvd.allreduce(tf.ones(2), process_set=other))}

    @tf.function
    def in_function():
        return hvd.allgather(tf.ones([1]), process_set=other)

    out["function"] = _error(in_function)
    with tf.Graph().as_default():
        op = hvd.broadcast(tf.ones(2), root_rank=other.ranks[0], process_set=other)
        with tf.compat.v1.Session() as session:
            out["graph"] = _error(lambda: session.run(op))
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10
    out["fake"] = _error(lambda: hvd.allreduce(tf.ones(2), process_set=fake))
    return out


STEPS = 5


def _grad(r, step) -> float:
    return float((r + 1) * (step + 1))  # integers: sums in float32 are exact


def _posted(ranks) -> float:
    """Minus every post of ``ranks`` summed: SGD(1.0) from zero with op=Sum."""
    return -sum(_grad(m, s) for m in ranks for s in range(STEPS))


def _bits(variable) -> str:
    return variable.numpy().tobytes().hex()


def set_modes(r, mine, evens) -> dict:
    """Solo and majority on each rank's own set: a Keras DistributedOptimizer (steps
    eager and compiled, then flush()) and a DistributedGradientTape (gradient() to a
    Keras optimizer, then hvd.flush_tapes()); and a Keras optimizer on ``evens``, that
    odd ranks are outside of (they step alone)."""
    out = {}
    for label, mode in (("solo", hvd.Solo()), ("majority", hvd.Majority(seed=3, quorum=1))):
        w = tf.Variable(tf.zeros([3]))
        opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), mode=mode, op=hvd.Sum, process_set=mine)

        @tf.function
        def compiled(g):
            opt.apply_gradients([(g, w)])

        for step in range(STEPS):
            g = tf.ones([3]) * _grad(r, step)
            if step % 2:
                compiled(g)
            else:
                opt.apply_gradients([(g, w)])
        opt.flush()
        stats = opt.stats()
        keras_out = {"weight": w.numpy().tolist(), "bits": _bits(w), "name": opt.stream_name,
                     "mode": repr(opt.mode), "rounds": opt.rounds, "stats_ranks": len(stats.get("fresh", [])),
                     "contributions": sum(stats.get("fresh", [])) + sum(stats.get("stale", []))}

        v = tf.Variable(tf.zeros([2]))
        plain = keras.optimizers.SGD(1.0)
        tape_name = None
        for step in range(STEPS):
            with tf.GradientTape() as g:
                loss = tf.reduce_sum(v) * _grad(r, step)
            tape = hvd.DistributedGradientTape(g, mode=mode, op=hvd.Sum, process_set=mine)
            plain.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
            tape_name = tape.stream_name
        flushed = hvd.flush_tapes()
        tape_out = {"weight": v.numpy().tolist(), "bits": _bits(v), "name": tape_name, "flush_updates": flushed}

        alone = tf.Variable(tf.zeros([1]))
        outside = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), mode=mode, op=hvd.Sum,
                                                 process_set=evens, name=f"on_evens_{label}")
        for step in range(STEPS):
            outside.apply_gradients([(tf.ones([1]) * _grad(r, step), alone)])
        outside.flush()
        out[label] = {"keras": keras_out, "tape": tape_out,
                      "evens": {"weight": alone.numpy().tolist(), "name": outside.stream_name}}
    # model.fit: the epoch flush (FlushCallback) runs among the set's members
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01), mode=hvd.Solo(),
                                                           process_set=mine), loss="mse")
    xs = np.random.default_rng(r).normal(size=(8, 3)).astype(np.float32)
    model.fit(xs, xs.sum(axis=1, keepdims=True), epochs=2, batch_size=4, verbose=0)
    out["fit"] = {"bits": "".join(_bits(v) for v in model.trainable_variables),
                  "updates": int(model.optimizer.iterations.numpy())}
    return out


def tape_and_optimizer(r, mine) -> dict:
    out = {}
    x = tf.constant(float(r))
    with tf.GradientTape() as g:
        g.watch(x)
        y = x * x
    tape = hvd.DistributedGradientTape(g, process_set=mine)
    out["tape_mode"] = repr(tape.mode)
    out["tape"] = float(tape.gradient(y, [x])[0])

    w = tf.Variable(tf.zeros([3]))

    @tf.function
    def step_in_function(tape_set):
        with tf.GradientTape() as g2:
            loss = tf.reduce_sum(w * (r + 1.0))
        t2 = hvd.DistributedGradientTape(g2, process_set=tape_set, name="set_tape_fn")
        return t2.gradient(loss, [w])[0]

    out["tape_function"] = step_in_function(mine).numpy().tolist()

    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=mine)
    out["optimizer_mode"] = repr(opt.mode)
    opt.apply_gradients([(tf.ones([3]) * (r + 1), w)])  # eager

    @tf.function
    def applied():
        opt.apply_gradients([(tf.ones([3]) * (r + 1), w)])

    applied()  # compiled
    out["optimizer_weight"] = w.numpy().tolist()
    out["optimizer_flush"] = opt.flush()
    return out


def partial_optimizer(r, size) -> dict:
    out = {}
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    for v in model.trainable_variables:  # weights differ between ranks, as local layers may
        v.assign(v + 0.1 * r)
    x = np.full((4, 3), 1.0 + r, np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    everyone = hvd.allgather_object([g.numpy() for g in grads])
    local = {id(v) for v in model.layers[0].trainable_weights}
    expected = []
    for i, (v, g) in enumerate(zip(variables, grads)):
        step = g.numpy() / size if id(v) in local else np.mean([e[i] for e in everyone], axis=0)
        expected.append(v.numpy() - step)
    opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[model.layers[0]])
    out["mode"] = repr(opt.mode)
    opt.apply_gradients(zip(grads, variables))
    out["max_diff"] = max(float(np.max(np.abs(v.numpy() - e))) for v, e in zip(variables, expected))
    kernels = hvd.allgather_object(variables[0].numpy().tolist())
    out["local_kernel_differs"] = kernels[0] != kernels[1]
    # in model.fit's compiled train step: the shared layer stays identical on every rank, the local one not
    keras.utils.set_random_seed(3)
    fitted = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    fitted.compile(optimizer=hvd_keras.PartialDistributedOptimizer(keras.optimizers.Adam(0.01),
                                                                   local_layers=fitted.layers[0]), loss="mse")
    xs = np.random.default_rng(r).normal(size=(8, 3)).astype(np.float32)
    fitted.fit(xs, xs.sum(axis=1, keepdims=True), epochs=1, batch_size=4, verbose=0)
    weights = hvd.allgather_object([v.numpy().tolist() for v in fitted.trainable_variables])
    out["fit_shared_equal"] = all(w[2:] == weights[0][2:] for w in weights)
    out["fit_local_differ"] = weights[0][0] != weights[1][0]
    # a local layer of another shape on every rank passes the check that every rank built the same model
    local_layer, shared_layer = keras.layers.Dense(2 + r), keras.layers.Dense(1)
    local_layer.build((None, 3))
    shared_layer.build((None, 3))
    checked = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=local_layer)
    checked.build(local_layer.trainable_weights + shared_layer.trainable_weights)
    out["verify_local_shapes"] = _error(checked.verify_across_ranks)
    plain = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), mode=hvd.Sync())
    plain.build(local_layer.trainable_weights + shared_layer.trainable_weights)
    out["verify_plain"] = _error(plain.verify_across_ranks)
    out["solo"] = _error(lambda: hvd_keras.PartialDistributedOptimizer(
        keras.optimizers.SGD(1.0), local_layers=[model.layers[0]], mode=hvd.Solo()))
    return out


def main():
    evens, odds = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
    hvd.init(process_sets=[evens, odds])
    r, size = hvd.rank(), hvd.size()
    mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
    out = {"ids": [evens.process_set_id, odds.process_set_id]}
    phase("collectives")
    out["collectives"] = collectives(r, mine, other)
    phase("gradients")
    out["gradients"] = gradients(r, mine)
    phase("outside the set")
    out["outside"] = outside(r, mine, other)
    phase("solo and majority on the sets")
    out["set_modes"] = set_modes(r, mine, evens)
    phase("tape and optimizer")
    out["sets"] = tape_and_optimizer(r, mine)
    phase("partial optimizer")
    out["partial"] = partial_optimizer(r, size)
    hvd.barrier()
    report(out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
