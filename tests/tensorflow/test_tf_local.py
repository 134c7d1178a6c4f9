"""The TensorFlow / Keras adapter's pieces that need no MPI: argument checks,
serialization, compression, the backend check and the error before init."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import hvd_partial  # noqa: E402
import hvd_partial.keras as hvd  # noqa: E402
import hvd_partial.tensorflow as hvd_tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_horovod_names_are_exported():
    for name in ["init", "shutdown", "rank", "size", "local_rank", "local_size", "DistributedOptimizer",
                 "callbacks", "load_model", "allreduce", "broadcast", "broadcast_variables", "broadcast_object",
                 "Compression", "Sync", "Solo", "Majority", "Average", "Sum"]:
        assert hasattr(hvd, name), name
    for name in ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "ParticipationReportCallback", "FlushCallback"]:
        assert hasattr(hvd.callbacks, name), name
    for name in ["DistributedGradientTape", "broadcast_variables", "allreduce", "broadcast_object",
                 "flush_gradients", "flush_tapes", "Compression", "DistributedOptimizer", "allgather",
                 "grouped_allreduce", "reducescatter", "alltoall", "join", "Min", "Max", "Product", "cross_rank",
                 "cross_size", "broadcast_global_variables"]:
        assert hasattr(hvd_tf, name), name
    import hvd_partial.tensorflow.keras as hvd_tfk

    assert hvd_tfk.DistributedOptimizer is hvd.DistributedOptimizer
    for name in ["LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint",
                 "MetricAverageCallback", "BroadcastGlobalVariablesCallback"]:
        assert hasattr(hvd_tfk.callbacks, name), name


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kind", ["float", "schedule", "callable"])
def test_an_update_uses_the_rounds_learning_rate_and_the_rank_keeps_its_own(kind, compiled):
    from hvd_partial.keras.carried_rate import CarriedLearningRate

    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)
    lr = {"float": 0.5, "schedule": schedule, "callable": lambda: 0.5}[kind]
    inner = keras.optimizers.SGD(lr)
    var = keras.Variable([1.0])
    inner.build([var])
    rate = CarriedLearningRate(inner)
    assert rate.local().numpy().tolist() == [0.5]  # what a post carries: the rate held now

    def step(value):
        rate.apply_with(value, lambda: inner.apply([tf.constant([1.0])], [var]))

    (tf.function(step, autograph=False) if compiled else step)(tf.constant(0.125, tf.float64))
    assert var.numpy().tolist() == [0.875]  # the round's rate, not the rank's
    own = float(schedule(1)) if kind == "schedule" else 0.5
    assert float(inner.learning_rate) == own and rate.local().numpy().tolist() == [own]


def test_config_round_trip_keeps_every_setting():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.25, momentum=0.5), mode=hvd.Majority(seed=3, quorum=2),
                                   op=hvd.Sum, compression=hvd.Compression.fp16, backward_passes_per_step=2,
                                   average_aggregated_gradients=True, max_staleness=5, sparse_as_dense=True,
                                   name="roundtrip")
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(opt))
    assert type(again) is hvd.DistributedOptimizer
    assert again.get_config() == opt.get_config()
    assert again.mode == hvd.Majority(seed=3, quorum=2) and again.op is hvd.Sum
    assert again.compression is hvd.Compression.fp16 and again.max_staleness == 5
    assert isinstance(again.inner_optimizer, keras.optimizers.SGD)
    assert again.inner_optimizer.momentum == 0.5
    assert again.stream_name == "keras.roundtrip"


def test_learning_rate_and_iterations_are_the_inner_optimizers():
    inner = keras.optimizers.Adam(0.125)
    opt = hvd.DistributedOptimizer(inner)
    assert float(opt.learning_rate) == 0.125
    opt.learning_rate = 0.5
    assert float(inner.learning_rate) == 0.5
    assert opt.iterations is inner.iterations
    assert opt.mode == hvd.Solo()  # the default


def test_compute_gradients_returns_this_ranks_gradients_and_pairs():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    x = tf.Variable(3.0)
    (grad, var), = opt._compute_gradients(lambda: x * x, [x])  # Horovod's private name, read by its tests
    assert var is x and float(grad) == 6.0
    with tf.GradientTape() as tape:
        loss = 5.0 * x
    (grad, _), = opt._compute_gradients(loss, [x], tape=tape)
    assert float(grad) == 5.0
    with pytest.raises(hvd.UnsupportedInputError, match="tape"):
        opt._compute_gradients(tf.constant(1.0), [x])


@pytest.mark.parametrize("make, error, text", [
    (lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD())),
     hvd.UnsupportedInputError, "already a DistributedOptimizer"),
    (lambda: hvd.DistributedOptimizer(object()), hvd.UnsupportedInputError, "Keras 3 optimizer"),
    (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), device_dense="/gpu:0"), hvd.ConfigError,
     "device_dense"),
    (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0), hvd.ConfigError,
     "backward_passes_per_step"),
    (lambda: hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                      mode=hvd.Solo()), hvd.UnsupportedInputError, "mode=Sync()"),
    (lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), max_staleness=-1), hvd.ConfigError, "max_staleness"),
    (lambda: hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_rounds=0), hvd.ConfigError, "warmup_rounds"),
])
def test_bad_arguments_raise_named_errors(make, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_fp16_compression_travels_in_half_precision():
    c = hvd.Compression.fp16
    assert c.wire_dtype(tf.float32) == tf.float16 and c.wire_dtype(tf.float64) == tf.float16
    wire, ctx = c.compress(tf.constant([1.5, -2.25], tf.float32))
    assert wire.dtype == tf.float16
    back = c.decompress(wire, ctx)
    assert back.dtype == tf.float32 and np.array_equal(back.numpy(), [1.5, -2.25])
    assert hvd.Compression.none.wire_dtype(tf.float32) == tf.float32
    assert hvd.Compression.by_name("fp16") is c


def test_sparse_gradient_is_rejected_unless_densified():
    from hvd_partial.tensorflow.exchange import GradientExchange

    var = tf.Variable(tf.zeros((6, 2)))
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([3]), tf.constant([6, 2]))
    with pytest.raises(hvd.UnsupportedInputError, match="sparse_as_dense=True"):
        GradientExchange("sparse-check").make_plan([sparse], [var])
    plan = GradientExchange("sparse-ok", sparse_as_dense=True).make_plan([sparse], [var])
    assert plan.slots[0].shape == (6, 2)


def test_plan_fuses_by_wire_dtype_and_restores_shapes_and_none():
    from hvd_partial.tensorflow.exchange import GradientExchange

    variables = [tf.Variable(tf.zeros((2, 3))), tf.Variable(tf.zeros(4, tf.float64)), tf.Variable(tf.zeros(5))]
    grads = [tf.reshape(tf.range(6, dtype=tf.float32), (2, 3)), tf.ones(4, tf.float64), None]
    exchange = GradientExchange("plan-check")
    plan = exchange.make_plan(grads, variables)
    assert [g.wire for g in plan.groups] == ["float32", "float64"]
    back = plan.from_wire(plan.to_wire(grads, hvd.Compression.none))
    assert back[2] is None
    assert np.array_equal(back[0].numpy(), grads[0].numpy()) and back[1].dtype == tf.float64
    with pytest.raises(hvd.StreamConflictError, match="fixed set of gradients"):
        exchange.make_plan([grads[0], None, None], variables)


def test_fusion_threshold_bounds_the_fused_gradient_buffers():
    from hvd_partial.tensorflow.exchange import GradientExchange, GradientPlan, fusion_buckets

    variables = [tf.Variable(tf.zeros(n, dtype)) for n, dtype in
                 [(300, tf.float32), (300, tf.float32), (50, tf.float64), (2000, tf.float32), (10, tf.float32)]]
    grads = [tf.fill(v.shape, tf.cast(i + 1, v.dtype)) for i, v in enumerate(variables)]
    unbounded = GradientExchange("bucket-check").make_plan(grads, variables)  # no session: one buffer per dtype
    assert [g.wire for g in unbounded.groups] == ["float32", "float64"]
    order = {}
    for group in unbounded.groups:
        order.setdefault(group.wire, []).extend(group.slots)
    groups = list(fusion_buckets(order, 2048))  # two 300-float32 gradients (2400 B) do not fit together
    assert [[s.index for s in g.slots] for g in groups] == [[0], [1], [3], [4], [2]]
    for g in groups:
        assert g.size * np.dtype(g.wire).itemsize <= 2048 or len(g.slots) == 1
    bounded = GradientPlan(unbounded.count, tuple(groups))
    back = bounded.from_wire(bounded.to_wire(grads, hvd.Compression.none))
    for b, g in zip(back, grads):
        assert np.array_equal(b.numpy(), g.numpy())


def test_apply_before_init_raises_not_initialized():
    if hvd_partial.is_initialized():
        pytest.skip("another test initialized hvd_partial in this process")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="before_init")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(np.ones((2, 3), np.float32)))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(hvd.NotInitializedError, match="init"):
        opt.apply_gradients(zip(grads, model.trainable_variables))


@pytest.mark.parametrize("kwargs, text", [
    ({"gradient_predivide_factor": 2.0}, "gradient_predivide_factor=2.0"),
    ({"num_groups": 2}, "num_groups=2"),
    ({"groups": 3}, "groups=3"),
    ({"device_dense": "/gpu:0"}, "device_dense"),
    ({"process_set": hvd_tf.ProcessSet([0])}, "never added"),
    ({"op": hvd_tf.Max}, "op=Average or op=Sum"),
])
def test_wrappers_accept_horovod_arguments_only_at_their_defaults(kwargs, text):
    with tf.GradientTape() as tape:
        pass
    defaults = dict(device_dense="", device_sparse="", gradient_predivide_factor=1.0, num_groups=0, groups=None,
                    process_set=hvd_tf.global_process_set, scale_local_gradients=True)
    hvd_tf.DistributedGradientTape(tape, **defaults)
    hvd.DistributedOptimizer(keras.optimizers.SGD(), name=f"defaults_{len(text)}", **defaults)
    error = hvd_partial.ProcessSetError if "process_set" in kwargs else \
        hvd.UnsupportedInputError if "op" in kwargs else hvd.ConfigError
    with pytest.raises(error, match=text):
        hvd_tf.DistributedGradientTape(tape, **kwargs)
    with pytest.raises(error, match=text):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)


def test_helper_arguments_follow_horovod():
    from hvd_partial.tensorflow.basics import resolve_op

    assert resolve_op(None, True, "x") is hvd.Average and resolve_op(None, False, "x") is hvd.Sum
    assert resolve_op(None, None, "x") is hvd.Average and resolve_op(hvd_tf.Min, None, "x") is hvd_tf.Min
    with pytest.raises(hvd.ConfigError, match="not both"):
        resolve_op(hvd.Sum, True, "x")
    with pytest.raises(hvd.NotSupportedError, match="Adasum"):
        hvd_tf.allreduce(tf.constant([1.0]), op=hvd_tf.Adasum)
    with pytest.raises(hvd_partial.ProcessSetError, match="never added"):  # a ValueError, as Horovod raises
        hvd_tf.allgather(tf.constant([1.0]), process_set=hvd_tf.ProcessSet([0]))
    with pytest.raises(hvd.ConfigError, match="eager"):
        hvd_tf.broadcast_global_variables(0)
    with pytest.raises(hvd.ConfigError, match="comm"):
        hvd_tf.init(comm=[0])
    assert hvd_tf.mpi_built() and not hvd_tf.gloo_enabled() and hvd_tf.check_num_rank_power_of_2(4)


def test_a_hand_out_not_fully_applied_fails_the_next_post():
    from hvd_partial.tensorflow.exchange import GradientExchange, init_generation

    ex = GradientExchange("owed-check", mode=hvd.Solo())
    ex.owed = (init_generation(), 3, frozenset({0, 1}))
    ex.mark_applied(np.array([0]))
    with pytest.raises(hvd.ConfigError, match=r"took 3 rounds.*#1"):
        ex.check_owed()
    ex.owed = (init_generation(), 2, frozenset({0}))
    ex.mark_applied(np.array([0]))
    ex.check_owed()  # every gradient had its rounds applied


def _other_backends():
    out = []
    if importlib.util.find_spec("torch") is not None:
        out.append("torch")
    if importlib.util.find_spec("jax") is not None:
        out.append("jax")
    return out or ["numpy"]  # numpy: keras itself fails to import without jax, also reported clearly


@pytest.mark.parametrize("backend", _other_backends())
def test_non_tensorflow_keras_backend_fails_at_import(backend):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", "import hvd_partial.keras"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode != 0
    assert "KerasBackendError" in proc.stderr
    assert f"KERAS_BACKEND='{backend}'" in proc.stderr and "KERAS_BACKEND=tensorflow" in proc.stderr
