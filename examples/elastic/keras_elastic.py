"""Elastic training with Keras 3 ``model.fit``: the survivors of a dead rank train on.

The shape of Horovod's examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py
(``hvd.elastic.KerasState``, ``@hvd.elastic.run`` around ``model.fit`` with
the three elastic callbacks, a reset callback that rescales the learning
rate), on synthetic data so that it runs offline, written for Keras 3.
Launch it with Open MPI 5::

    hvd-partial-run --elastic -np 4 python examples/elastic/keras_elastic.py

and kill one rank while it trains (``kill -9 PID``), or let the example kill
one: ``--kill-rank 2 --kill-at-batch 7`` (that rank SIGKILLs itself after its
7th batch). The survivors reset once, finish every epoch and end with bitwise
identical weights; the launcher exits 0 and names the rank lost. With 4 ranks
kill at most 1 (Open MPI 5.0's launcher ends the job once half died).

As in Horovod's example each rank draws batches from the whole (repeated,
shuffled) data set, ``steps_per_epoch`` batches an epoch: there is no sampler
to re-deal for Keras.
"""

import argparse
import hashlib
import json
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import hvd_partial  # noqa: E402
import hvd_partial.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser(description="Keras 3 elastic example (synthetic data)")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.001)
parser.add_argument("--batches-per-commit", type=int, default=5)
parser.add_argument("--kill-rank", type=int, help="this rank kills itself (SIGKILL) ...")
parser.add_argument("--kill-at-batch", type=int, default=7, help="... after this many batches")
parser.add_argument("--report", metavar="DIR", help="write each rank's summary to DIR/rankN.json")
args = parser.parse_args()

hvd.init()  # hvd-partial-run --elastic sets HVD_PARTIAL_ELASTIC=1
keras.utils.set_random_seed(42)  # the same initial weights on every rank

rng = np.random.default_rng(1)
templates = rng.normal(size=(10, 64)).astype("float32")
labels = rng.integers(0, 10, size=4096)
images = templates[labels] + 0.5 * rng.normal(size=(4096, 64)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat() \
    .shuffle(1024, seed=hvd.rank()).batch(args.batch_size)

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * hvd.size()))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

state = hvd.elastic.KerasState(model, batch=0, epoch=0)
resets = []


def on_state_reset():
    resets.append(hvd.size())
    model.optimizer.learning_rate.assign(args.lr * hvd.size())
    print(f"rank {hvd.rank()}: reset, now {hvd.size()} ranks", flush=True)


state.register_reset_callbacks([on_state_reset])


class KillAt(keras.callbacks.Callback):
    """--kill-rank's process dies after its --kill-at-batch-th batch."""

    batches = 0

    def on_train_batch_end(self, batch, logs=None):
        KillAt.batches += 1
        if args.kill_rank == hvd_partial.world().original_rank and KillAt.batches == args.kill_at_batch:
            print(f"rank {hvd.rank()}: killing myself after batch {KillAt.batches}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit), KillAt()]


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=args.steps_per_epoch, epochs=args.epochs - state.epoch,
                    callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)


started = time.monotonic()
train(state)
opt.flush()
seconds = time.monotonic() - started
digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.weights)).hexdigest()
if hvd.rank() == 0:
    print(f"done on {hvd.size()} ranks (lost {list(hvd_partial.world().lost)}), epoch {state.epoch}, "
          f"{seconds:.1f} s, model {digest[:12]}", flush=True)
if args.report:
    world = hvd_partial.world()
    with open(os.path.join(args.report, f"rank{world.original_rank}.json"), "w") as fh:
        json.dump({"fingerprint": digest, "size": hvd.size(), "resets": resets, "epoch": state.epoch,
                   "seconds": seconds, "world": {"version": world.version, "size": world.size,
                                                 "lost": list(world.lost), "original_rank": world.original_rank}}, fh)
hvd.shutdown()
