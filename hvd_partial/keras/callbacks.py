"""Keras callbacks with Horovod's names, plus the epoch flush and a
participation report.

Example::

    import hvd_partial.keras as hvd

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_rounds=200),
        hvd.callbacks.ParticipationReportCallback(),
    ]
    model.fit(x, y, epochs=5, callbacks=callbacks)
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .backend import require_tensorflow_backend

require_tensorflow_backend()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_partial as _core  # noqa: E402
from ..errors import ConfigError  # noqa: E402
from ..tensorflow.functions import broadcast_variables  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402

log = logging.getLogger("hvd_partial.keras")

_TRANSLATES = "_hvd_partial_translates_errors"


def _distributed_optimizer(model, who: str, required: bool = True):
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, DistributedOptimizer):
        return optimizer
    if required:
        raise ConfigError(f"{who} needs a model compiled with hvd_partial.keras.DistributedOptimizer, "
                          f"got {type(optimizer).__name__}")
    return None


class FlushCallback(keras.callbacks.Callback):
    """Flush the model's ``DistributedOptimizer`` before validation and at the
    end of every epoch, so evaluation, later callbacks and checkpoints see
    identical weights on every rank. At the start of training it checks that
    every rank has the same model (``verify_across_ranks``), and makes errors
    of the compiled train step's post come out of ``fit`` as the hvd_partial
    exceptions they are (not TensorFlow ``OpError`` exceptions). ``model.fit`` adds
    it by itself (first in the list); add it explicitly only to control its position.

    Example::

        model.fit(x, y, callbacks=[hvd.callbacks.FlushCallback(), my_checkpoint])
    """

    def __init__(self):
        super().__init__()
        self._training = False
        self._dirty = False
        self.flushes = 0

    def _optimizer(self):
        return _distributed_optimizer(self.model, "FlushCallback", required=False)

    def _flush(self) -> None:
        optimizer = self._optimizer()
        if optimizer is not None:
            optimizer.flush()
            self.flushes += 1
        self._dirty = False

    def on_train_begin(self, logs=None):
        self._training = True
        optimizer = self._optimizer()
        if optimizer is not None:
            # Every rank is in fit here: a safe place for a collective check that
            # turns a mismatched model into MismatchError before the first post.
            optimizer.verify_across_ranks(self.model.trainable_variables)
            optimizer._fit_flushes_epochs = True
            if getattr(self.model, "jit_compile", False):
                # XLA cannot compile the post (a tf.numpy_function). fit looks
                # train_function up at every step, so a rebuilt one takes over.
                log.warning("rank %d: the model was compiled with jit_compile=True (the default on GPUs); the "
                            "partial allreduce cannot run under XLA, so the train step runs without it",
                            _core.rank())
                self.model.jit_compile = False
                self.model.make_train_function(force=True)
            self._raise_our_errors(optimizer)

    def _raise_our_errors(self, optimizer) -> None:
        # TensorFlow turns an exception in the compiled step's post into an
        # OpError; fit looks train_function up at every step, so a thin wrapper
        # can raise the hvd_partial error (MismatchError, RankFailedError) instead.
        train_function = self.model.train_function
        if train_function is None or getattr(train_function, _TRANSLATES, False):
            return
        exchange = optimizer._exchange

        def translating(*args, **kwargs):
            try:
                return train_function(*args, **kwargs)
            except tf.errors.OpError as err:
                exchange.reraise(err)

        setattr(translating, _TRANSLATES, True)
        self.model.train_function = translating

    def on_epoch_begin(self, epoch, logs=None):
        self._dirty = True

    def on_test_begin(self, logs=None):
        # Inside fit, validation runs before on_epoch_end: flush first. A
        # standalone evaluate() (possibly on one rank only) must not flush.
        if self._training and self._dirty:
            self._flush()

    def on_epoch_end(self, epoch, logs=None):
        if self._dirty:
            self._flush()

    def on_train_end(self, logs=None):
        self._training = False
        optimizer = self._optimizer()
        if optimizer is not None:
            optimizer._fit_flushes_epochs = False


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, copy ``root_rank``'s model weights and
    optimizer variables to every rank (Horovod's callback). Ranks whose models
    differ in shape fail with ``MismatchError``.

    Example::

        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        variables = list(self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            variables += list(optimizer.variables)
        broadcast_variables(variables, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) over all ranks at the end of
    every epoch, so that every rank reports and acts on the same values. Put it
    before callbacks that read metrics (early stopping, checkpoints).

    Example::

        callbacks = [hvd.callbacks.MetricAverageCallback(), keras.callbacks.EarlyStopping()]
    """

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.number)))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = _core.allreduce(values, name=f"metrics[{','.join(keys)}]", op=_core.Average)
        for key, value in zip(keys, averaged):
            logs[key] = float(value)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Gradual learning-rate warmup driven by rounds, not local steps: update
    r (the r-th round applied, identical on every rank) uses
    ``initial_lr * (start + (1 - start) * r / warmup_rounds)`` until
    ``r = warmup_rounds``; later updates keep ``initial_lr`` (or whatever other
    callbacks set). ``start`` defaults to ``1 / size()`` as in Horovod.

    The rate is set inside the train step before each of the k updates, so
    ranks that catch up several rounds at once use the same rates as the
    others. ``warmup_epochs`` converts with ``steps_per_epoch`` (default: the
    steps of an epoch in ``fit``). Needs a ``DistributedOptimizer`` whose inner
    optimizer has a float learning rate.

    Example::

        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_rounds=500)
    """

    def __init__(self, initial_lr: float, warmup_rounds: int | None = None, warmup_epochs: float | None = None,
                 steps_per_epoch: int | None = None, start: float | None = None, verbose: int = 0):
        super().__init__()
        if warmup_rounds is not None and warmup_epochs is not None:
            raise ConfigError("give warmup_rounds or warmup_epochs, not both")
        if warmup_rounds is not None and (not isinstance(warmup_rounds, int) or warmup_rounds < 1):
            raise ConfigError(f"warmup_rounds must be an int >= 1, got {warmup_rounds!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_rounds = warmup_rounds
        self.warmup_epochs = 5 if warmup_rounds is None and warmup_epochs is None else warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.start = start
        self.verbose = verbose

    def on_train_begin(self, logs=None):
        optimizer = _distributed_optimizer(self.model, "LearningRateWarmupCallback")
        rounds = self.warmup_rounds
        if rounds is None:
            steps = self.steps_per_epoch or (self.params or {}).get("steps")
            if not steps:
                raise ConfigError("LearningRateWarmupCallback: warmup_epochs needs steps_per_epoch (fit does not "
                                  "know the epoch length); or pass warmup_rounds")
            rounds = max(1, int(round(self.warmup_epochs * steps)))
        start = 1.0 / _core.size() if self.start is None else float(self.start)
        initial, span = self.initial_lr, float(rounds)

        def schedule(r):
            return initial * (start + (1.0 - start) * r / span)

        optimizer.set_round_lr_schedule(schedule, until_round=rounds)
        self.warmup_rounds_used = rounds

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose:
            optimizer = _distributed_optimizer(self.model, "LearningRateWarmupCallback")
            log.info("rank %d epoch %d: learning rate %.6g after %d updates", _core.rank(), epoch,
                     float(optimizer.learning_rate), int(optimizer.iterations))


class ParticipationReportCallback(keras.callbacks.Callback):
    """Per epoch: rounds, rounds per second, fresh and stale contributions per
    rank, rounds initiated per rank, the largest staleness seen and the wait
    per post, for the model's ``DistributedOptimizer`` stream. Each epoch's
    report is appended to ``self.history`` and logged (logger
    ``hvd_partial.keras``, level ``log_level``).

    Example::

        report = hvd.callbacks.ParticipationReportCallback()
        model.fit(x, y, epochs=3, callbacks=[report])
        print(report.history[-1]["rounds_per_s"], report.history[-1]["stale"])
    """

    def __init__(self, log_level: int = logging.INFO):
        super().__init__()
        self.log_level = log_level
        self.history: list[dict] = []
        self._start = None
        self._before = None

    def _snapshot(self) -> dict:
        optimizer = _distributed_optimizer(self.model, "ParticipationReportCallback")
        return optimizer.stats()

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._before = self._snapshot()

    def on_epoch_end(self, epoch, logs=None):
        after = self._snapshot()
        elapsed = time.perf_counter() - (self._start or time.perf_counter())
        before = self._before or {}

        def delta(key):
            now = after.get(key, [])
            then = before.get(key, [0] * len(now))
            return [a - b for a, b in zip(now, then)]

        rounds = after.get("rounds", 0) - before.get("rounds", 0)
        report = {
            "epoch": epoch,
            "seconds": elapsed,
            "rounds": rounds,
            "rounds_per_s": rounds / elapsed if elapsed > 0 else 0.0,
            "fresh": delta("fresh"),
            "stale": delta("stale"),
            "initiated": delta("initiated"),
            "max_staleness_seen": after.get("max_staleness_seen", 0),
            "wait_mean_s": after.get("wait_mean_s", 0.0),
            "wait_p95_s": after.get("wait_p95_s", 0.0),
        }
        self.history.append(report)
        log.log(self.log_level, "rank %d epoch %d: %d rounds (%.1f/s), fresh %s, stale %s, initiated %s, "
                "max staleness %d, wait mean %.1f ms p95 %.1f ms", _core.rank(), epoch, rounds,
                report["rounds_per_s"], report["fresh"], report["stale"], report["initiated"],
                report["max_staleness_seen"], 1e3 * report["wait_mean_s"], 1e3 * report["wait_p95_s"])
