"""The learning rate travels with the rounds (Keras ``DistributedOptimizer``),
for each mode named in argv[1] (comma-separated), on every rank:

- ``callbacks``: ``model.fit`` with Horovod's per-batch warm-up and schedule
  callbacks on a float rate; in solo and majority each rank runs its own
  number of steps per epoch (so its warm-up differs) and rank 3 is slow;
- ``schedule``: ``model.fit`` with a ``LearningRateSchedule`` on the inner
  optimizer, uneven step counts as above;
- ``alone`` (solo and majority): after a flush, rank 0 alone takes three
  steps, each with a rate of its own, while the others wait in a barrier;
  then every rank flushes;
- ``piled`` (with majority): unit gradients at rate 1 in a custom loop, so
  that each call's step counts its rounds' posts over their divisors.

Reported per scenario: every round applied (round, posts summed, rate,
contributors), the rate each step posted and the rate read back after it,
and a digest of weights and optimizer variables.
"""

import sys
import time

import tf_common as C  # noqa: I001 (sets TensorFlow up first)

import keras
import numpy as np

import hvd_partial
import hvd_partial.keras as hvd
from support import phase, report

BATCH = 4


class Recorder(keras.callbacks.Callback):
    """Last in the list: the rate each step posts (what the callbacks before it
    left), the rate read back after the step, and every round applied."""

    def __init__(self, slow: bool):
        super().__init__()
        self.slow = slow
        self.posted, self.read_back, self.rounds = [], [], {}
        self.steps_per_epoch = []

    def collect(self):
        opt = self.model.optimizer
        contributors = {r.round: r.contributors for r in opt.last_results}
        for (rnd, posts, values), (same, rate) in zip(opt.exchange.last_values, opt.applied_learning_rates):
            assert rnd == same and values[0] == rate
            entry = [posts, rate, contributors[rnd]]
            assert self.rounds.setdefault(rnd, entry) == entry, (rnd, entry, self.rounds[rnd])

    def on_train_batch_begin(self, batch, logs=None):
        if self.slow:
            time.sleep(0.005)
        self.posted.append(float(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None):
        self.read_back.append(float(self.model.optimizer.learning_rate))
        self.collect()

    def on_epoch_end(self, epoch, logs=None):
        self.collect()  # the epoch flush (the FlushCallback is first) applied these


def shard(rank, size, mode, seed):
    """Every rank's rows: the same count in sync mode, 4 + 2 * rank batches per epoch otherwise."""
    x, y = C.classification_data(BATCH * 64, seed=seed)
    count = 6 if mode == "sync" else 4 + 2 * rank
    rows = np.arange(count * BATCH) * size + rank
    return x[rows], y[rows]


def digest(model, opt):
    """Weights and optimizer variables but the learning rate: each rank's own."""
    own = opt.learning_rate
    return C.digest([np.asarray(v) for v in model.weights] + [np.asarray(v) for v in opt.variables if v is not own])


def result(recorder, model, opt):
    return {"rounds": sorted([r, *e] for r, e in recorder.rounds.items()), "posted": recorder.posted,
            "read_back": recorder.read_back, "digest": digest(model, opt), "lr": float(opt.learning_rate),
            "iterations": int(opt.iterations)}


def callbacks_case(rank, size, mode):
    xs, ys = shard(rank, size, mode, seed=1)
    model = C.mlp(seed=rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), mode=hvd_partial.mode_from_name(mode),
                                   name=f"callbacks_{mode}")
    model.compile(optimizer=opt, loss=C.LOSS)
    recorder = Recorder(slow=mode != "sync" and rank == size - 1)
    model.fit(xs, ys, batch_size=BATCH, epochs=3, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=2),
                         hvd.callbacks.LearningRateScheduleCallback(0.2, multiplier=0.5, start_epoch=2,
                                                                    staircase=False),
                         recorder])
    return model, opt, recorder


def schedule_case(rank, size, mode):
    xs, ys = shard(rank, size, mode, seed=2)
    model = C.mlp(seed=7)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=4, decay_rate=0.5)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(schedule), mode=hvd_partial.mode_from_name(mode),
                                   name=f"schedule_{mode}")
    model.compile(optimizer=opt, loss=C.LOSS)
    recorder = Recorder(slow=mode != "sync" and rank == size - 1)
    model.fit(xs, ys, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, callbacks=[recorder])
    out = result(recorder, model, opt)
    # Read back: this rank's own schedule at the update count, evaluated eagerly.
    out["own_schedule"] = float(schedule(int(opt.iterations)))
    out["schedule_at"] = [float(schedule(u)) for u in range(len(out["rounds"]))]  # at each update
    return out


def alone_case(rank, model, opt, recorder, xs, ys):
    """After fit's flush nobody holds data: rank 0's steps are rounds of its own."""
    rates = [0.011, 0.012, 0.013]
    recorder.rounds = {}
    steps = []
    if rank == 0:
        for rate in rates:
            opt.learning_rate = rate
            model.train_on_batch(xs[:BATCH], ys[:BATCH])
            recorder.collect()
            steps.append([[r, posts, values[0]] for r, posts, values in opt.exchange.last_values])
    hvd.barrier()
    opt.flush()
    recorder.collect()
    return {"rounds": sorted([r, *e] for r, e in recorder.rounds.items()), "steps": steps,
            "rates": [float(np.float32(r)) for r in rates], "digest": digest(model, opt)}


def piled_case(rank, size):
    """Majority rounds of unit gradients with SGD at rate 1 (custom loop, eager), the
    last rank slow at every third step: each call's step is the sum over its rounds
    of posts / divisor (``cap_round_step``: the larger of posts and world size)."""
    w = keras.Variable(np.zeros(1, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), mode=hvd.Majority(seed=3), name="piled")
    calls = []
    for i in range(60):
        if rank == size - 1 and i % 3 == 0:
            time.sleep(0.02)  # imbalance, not ordering: posts of the others pile up in some rounds
        before = float(w.numpy()[0])
        opt.apply_gradients([(np.ones(1, np.float32), w)])
        calls.append([before - float(w.numpy()[0]), [posts for _, posts, _ in opt.exchange.last_values]])
    before = float(w.numpy()[0])
    opt.flush()
    calls.append([before - float(w.numpy()[0]), [posts for _, posts, _ in opt.exchange.last_values]])
    return {"calls": calls, "weight": float(w.numpy()[0]), "posts": 60}


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {}
    for mode in sys.argv[1].split(","):
        phase(f"{mode}: callbacks")
        model, opt, recorder = callbacks_case(rank, size, mode)
        out[mode] = {"callbacks": result(recorder, model, opt)}
        if mode != "sync":
            phase(f"{mode}: alone")
            xs, ys = shard(rank, size, mode, seed=1)
            out[mode]["alone"] = alone_case(rank, model, opt, recorder, xs, ys)
        phase(f"{mode}: schedule")
        out[mode]["schedule"] = schedule_case(rank, size, mode)
    if "majority" in sys.argv[1].split(","):
        phase("piled")
        out["piled"] = piled_case(rank, size)
    report(out)
    hvd.shutdown()


main()
