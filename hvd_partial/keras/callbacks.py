"""Keras callbacks with Horovod's names, plus the epoch flush and a
participation report.

Example::

    import hvd_partial.keras as hvd

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3),
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
from ..tensorflow.basics import require_default  # noqa: E402
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
            optimizer.fit_flushes_epochs = True
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
        exchange = optimizer.exchange

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
            optimizer.fit_flushes_epochs = False


def attach_epoch_flush(callback_list, model) -> None:
    """Put a :class:`FlushCallback` first in the callback list ``fit`` builds
    for ``model``, when its optimizer is a ``DistributedOptimizer`` and the
    list has no ``FlushCallback`` yet (installed as
    :mod:`~hvd_partial.keras.fit_hooks`' ``attach``)."""
    if not isinstance(getattr(model, "optimizer", None), DistributedOptimizer):
        return
    if any(isinstance(cb, FlushCallback) for cb in callback_list.callbacks):
        return
    flush = FlushCallback()
    flush.set_model(model)
    if getattr(callback_list, "params", None):
        flush.set_params(callback_list.params)
    # First, so that later callbacks (checkpoints, metric averaging) see flushed weights.
    callback_list.callbacks.insert(0, flush)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, copy ``root_rank``'s model weights and
    optimizer variables to every rank (Horovod's callback; Horovod does it
    after the first batch, here it happens before the first post, or after
    the first batch for a model that has no weights before its first step). Variables
    in ``local_variables`` (or registered with ``register_local_var``) are
    left alone. ``device`` is accepted at its default only. Ranks whose
    models differ in shape fail with ``MismatchError``.

    Example::

        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
        super().__init__()
        require_default("BroadcastGlobalVariablesCallback", device=(device, ""))
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars = {id(v) for v in (local_variables or [])}

    def register_local_var(self, var) -> None:
        """Leave ``var`` out of the broadcast (a worker-local variable)."""
        self._local_vars.add(id(var))

    def _broadcast(self) -> None:
        variables = list(self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            variables += list(optimizer.variables)
        broadcast_variables([v for v in variables if id(v) not in self._local_vars], root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        # A model built without an input shape has no weights until its first
        # step: then broadcast after that step, as Horovod always does (its
        # first post was round 0, which every rank takes alone, so the ranks
        # are identical from the broadcast on).
        if not self.broadcast_done and self.model.weights:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) over all ranks at the end of
    every epoch, so that every rank reports and acts on the same values. Put it
    before callbacks that read metrics (early stopping, checkpoints).
    ``device`` is accepted at its default only.

    Example::

        callbacks = [hvd.callbacks.MetricAverageCallback(), keras.callbacks.EarlyStopping()]
    """

    def __init__(self, device: str = ""):
        super().__init__()
        require_default("MetricAverageCallback", device=(device, ""))
        self.device = device

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


def _steps_per_epoch(callback, given):
    if given:
        return given
    params = callback.params or {}
    if params.get("steps"):
        return params["steps"]
    if params.get("samples") and params.get("batch_size"):
        return params["samples"] // params["batch_size"]
    raise ConfigError(f"{type(callback).__name__}: cannot tell the number of steps per epoch; pass steps_per_epoch=")


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's schedule: from ``start_epoch`` until ``end_epoch`` (exclusive),
    the learning rate is ``initial_lr * multiplier(epoch)``; ``multiplier`` is
    a function of the epoch or a number (then ``multiplier ** (epoch -
    start_epoch)``). With ``staircase=True`` the rate is set at the first
    batch of each epoch; with ``staircase=False`` at every batch, with the
    fractional epoch ``epoch + batch / steps_per_epoch``.

    As in Horovod the rate is this rank's, set per local batch. With a
    ``DistributedOptimizer`` each post carries the rate its rank held, and
    every rank applies a round with the same rate (the posts' rate where they
    agree, else their mean), so replicas stay identical in every mode.
    Horovod's ``momentum_correction`` is accepted and not applied (Keras 3
    compiles the momentum into the train step).

    Example::

        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.1, start_epoch=30, end_epoch=60)
    """

    def __init__(self, initial_lr, multiplier, start_epoch: int = 0, end_epoch: int | None = None,
                 staircase: bool = True, momentum_correction: bool = True, steps_per_epoch: int | None = None):
        super().__init__()
        if initial_lr is None:
            raise ConfigError("LearningRateScheduleCallback: initial_lr is required")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier ** (epoch - start_epoch))
        self.current_epoch = None

    def rate(self, batch: int):
        """The rate of local batch ``batch`` of the current epoch, or None outside the schedule."""
        epoch = self.current_epoch
        if epoch is None or epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return None
        if self.staircase:
            return self.initial_lr * self.multiplier(epoch)
        return self.initial_lr * self.multiplier(epoch + batch / self.steps_per_epoch)

    def on_train_begin(self, logs=None):
        if not self.staircase:
            self.steps_per_epoch = _steps_per_epoch(self, self.steps_per_epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase and batch != 0:
            return
        rate = self.rate(batch)
        if rate is not None:
            self.model.optimizer.learning_rate = rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warmup: over the first ``warmup_epochs`` the rate
    grows from ``initial_lr / size()`` to ``initial_lr``, batch by batch
    (Horovod's formula, set per local batch as in
    :class:`LearningRateScheduleCallback`; the rate travels with the rounds).

    hvd_partial's own variant, ``warmup_rounds=n``, is driven by the update
    count r (``optimizer.iterations`` at the batch): the batch's rate is
    ``initial_lr * (start + (1 - start) * min(r, n) / n)`` until a batch
    finds ``r >= n`` and sets ``initial_lr`` (``start`` defaults to ``1 / size()``).

    Example::

        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=3, verbose=1)
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_rounds=500)
    """

    def __init__(self, initial_lr, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0, *, warmup_rounds: int | None = None,
                 start: float | None = None):
        if warmup_rounds is not None and (not isinstance(warmup_rounds, int) or warmup_rounds < 1):
            raise ConfigError(f"warmup_rounds must be an int >= 1, got {warmup_rounds!r}")

        def multiplier(epoch):
            size = _core.size()
            epoch += 1.0 / self.steps_per_epoch  # the epoch's last batch reaches the round value
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.warmup_rounds = warmup_rounds
        self.start = start
        self.verbose = verbose
        self.warmup_done = False

    def on_train_begin(self, logs=None):
        if self.warmup_rounds is None:
            super().on_train_begin(logs)

    def on_train_batch_begin(self, batch, logs=None):
        if self.warmup_rounds is None:
            super().on_train_batch_begin(batch, logs)
            return
        if self.warmup_done:
            return
        start = 1.0 / _core.size() if self.start is None else float(self.start)
        updates = int(self.model.optimizer.iterations)
        span = self.warmup_rounds
        self.model.optimizer.learning_rate = self.initial_lr * (start + (1.0 - start) * min(updates, span) / span)
        self.warmup_done = updates >= span

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.verbose:
            log.info("rank %d epoch %d: learning rate %.6g after %d updates", _core.rank(), epoch,
                     float(self.model.optimizer.learning_rate), int(self.model.optimizer.iterations))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's callback: a ``ModelCheckpoint`` that keeps only the best
    model (``save_best_only=True``). Horovod's has no ``filepath`` argument
    (its Spark estimator sets it); set ``filepath=`` here or the attribute
    before training. With a ``DistributedOptimizer`` the epoch flush runs
    first, so every rank would save the same model: add it on rank 0 only.

    Example::

        if hvd.rank() == 0:
            callbacks.append(hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath="best.keras"))
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq="epoch", *, filepath: str | None = None):
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise ConfigError("BestModelCheckpoint has no filepath: pass filepath= or set .filepath before fit")
        super().on_train_begin(logs)


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
