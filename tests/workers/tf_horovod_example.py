"""Run one of Horovod's TensorFlow 2 / Keras example scripts (its import
already switched to hvd_partial) and check the replicas afterwards.

Usage (under mpiexec): tf_horovod_example.py SCRIPT [script arguments...]

What the harness provides, since the machine has no network and two cores:

- ``keras.datasets.mnist.load_data`` returns synthetic digits (1,024 per rank,
  28x28 uint8, seeded by the rank) instead of downloading;
- ``HVD_EXAMPLE_MAX_STEPS`` (default 12) caps ``tf.data.Dataset.take`` and
  ``fit``'s ``steps_per_epoch``, ``HVD_EXAMPLE_MAX_EPOCHS`` (default 2) its
  epochs, so an example meant for GPUs ends in a minute.

When the script returns, every ``DistributedGradientTape`` stream is flushed
(``flush_tapes``) and every Keras ``DistributedOptimizer`` flushed; the ranks
then compare a digest of the trainable weights and optimizer state each
optimizer updates. Rank 0 prints one line per optimizer (with
``HVD_EXAMPLE_DEBUG=1`` also the variables that differ); the exit status is 1
if any replica differs. Reports to the test harness when ``HVD_TEST_OUT`` is set.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import sys

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import hvd_partial.keras as hvd_keras  # noqa: E402
import hvd_partial.tensorflow as hvd  # noqa: E402

MAX_STEPS = int(os.environ.get("HVD_EXAMPLE_MAX_STEPS", "12"))
MAX_EPOCHS = int(os.environ.get("HVD_EXAMPLE_MAX_EPOCHS", "2"))

_built = []
_optimizers = []
_Original = hvd_keras.DistributedOptimizer


def _synthetic_mnist(path="mnist.npz"):
    from mpi4py import MPI

    rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
    labels = rng.integers(0, 10, size=1024).astype(np.uint8)
    images = (rng.random((1024, 28, 28)) * 64 + labels[:, None, None] * 19).astype(np.uint8)
    return (images, labels), (images[:256], labels[:256])


def _install_caps() -> None:
    take = tf.data.Dataset.take

    def capped_take(self, count, name=None):
        return take(self, min(int(count), MAX_STEPS), name=name)

    tf.data.Dataset.take = capped_take
    fit = keras.Model.fit

    def capped_fit(self, *args, **kwargs):
        kwargs["epochs"] = min(kwargs.get("epochs", 1), MAX_EPOCHS)
        if kwargs.get("steps_per_epoch"):
            kwargs["steps_per_epoch"] = min(kwargs["steps_per_epoch"], MAX_STEPS)
        return fit(self, *args, **kwargs)

    keras.Model.fit = capped_fit
    keras.datasets.mnist.load_data = _synthetic_mnist
    tf.keras.datasets.mnist.load_data = _synthetic_mnist
    # Every Keras optimizer the script builds, with the variables it updates.
    owner = next(c for c in keras.optimizers.Optimizer.__mro__ if "build" in c.__dict__ and c.__name__ == "BaseOptimizer")
    build = owner.build

    def recorded_build(self, variables):
        _optimizers.append((self, list(variables)))
        return build(self, variables)

    owner.build = recorded_build


class _Recorded(_Original):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _built.append(self)


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def prepare() -> None:
    """Install the caps and the synthetic data, and record every optimizer the script builds."""
    _install_caps()
    hvd_keras.DistributedOptimizer = _Recorded


def replica_results() -> list[dict]:
    """Collective: flush every stream the script used, then compare each optimizer's
    variables and state across the ranks (one entry per optimizer, with this rank's digest)."""
    results = []
    updated = hvd.flush_tapes()
    inner = {id(opt.inner_optimizer) for opt in _built}
    for optimizer, variables in _optimizers:
        if isinstance(optimizer, _Original) or id(optimizer) in inner or not variables:
            continue
        mine = _digest(list(variables) + list(optimizer.variables))
        digests = hvd.allgather_object(mine)
        results.append({"what": f"optimizer {optimizer.name} (DistributedGradientTape)",
                        "iterations": int(optimizer.iterations), "flushed": updated,
                        "identical": len(set(digests)) == 1, "digest": mine})
    for opt in _built:
        if opt.post_variables is None:
            continue
        flushed = opt.flush()
        mine = _digest(list(opt.model_variables) + list(opt.variables))
        digests = hvd.allgather_object(mine)
        if os.environ.get("HVD_EXAMPLE_DEBUG"):
            each = hvd.allgather_object([(v.path, _digest([v])) for v in list(opt.model_variables) + list(opt.variables)])
            if hvd.rank() == 0:
                print("DIFFER:", [a[0] for a, b in zip(each[0], each[1]) if a[1] != b[1]], flush=True)
        results.append({"what": f"DistributedOptimizer {opt.stream_name} ({opt.mode.kind})",
                        "iterations": int(opt.iterations), "flushed": flushed, "identical": len(set(digests)) == 1,
                        "digest": mine})
    return results


def main() -> int:
    script, args = sys.argv[1], sys.argv[2:]
    prepare()
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    results = replica_results()
    if hvd.rank() == 0:
        for r in results:
            print(f"{r['what']}: {r['iterations']} updates, replicas {'identical' if r['identical'] else 'DIFFER'}",
                  flush=True)
    if os.environ.get("HVD_TEST_OUT"):
        from support import report

        report(results)
    return 0 if results and all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
