"""``DistributedOptimizer``: Horovod's Keras optimizer wrapper on partial collectives.

The wrapper holds the user's Keras 3 optimizer (composition: it is a Keras
``Optimizer`` so that ``model.compile`` accepts it, and it forwards to the
inner optimizer). Each ``apply_gradients`` posts this rank's gradients as one
fused stream and applies every round the post took, oldest first, through the
inner optimizer: a rank that was behind makes k updates at once (no forward or
backward pass), so weights and optimizer variables stay identical on every
rank. Each post also carries this rank's learning rate, and every rank
applies a round with the same rate (:mod:`.carried_rate`), so rates set per
local batch keep the replicas identical too. This works inside
``model.fit``'s compiled train step and in custom loops.

Example::

    import keras
    import hvd_partial.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), mode=hvd.Solo())
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    # model.fit flushed at the end of every epoch: weights are identical on every rank
"""

from __future__ import annotations

import logging

import numpy as np

from .backend import require_tensorflow_backend

require_tensorflow_backend()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_partial as _core  # noqa: E402
from .. import session as _session  # noqa: E402
from ..collectives.process_sets import set_engine  # noqa: E402
from ..errors import ConfigError, MismatchError, UnsupportedInputError  # noqa: E402
from ..modes import Majority, Mode, ReduceOp, Solo, Sync  # noqa: E402
from ..tensorflow.basics import check_usable, global_process_set, require_default  # noqa: E402
from ..tensorflow.compression import Compression, Compressor  # noqa: E402
from ..tensorflow import handoff  # noqa: E402
from ..tensorflow.exchange import (GradientExchange, apply_compiled, graph_builder, rank_label,  # noqa: E402
                                   set_mode)
from .accumulation import GradientAccumulation  # noqa: E402
from .carried_rate import CarriedLearningRate  # noqa: E402

log = logging.getLogger("hvd_partial.keras")


def mode_to_config(mode: Mode) -> dict:
    """A JSON-able description of ``mode`` (stored in saved models)."""
    config = {"kind": mode.kind}
    if isinstance(mode, Majority):
        config.update(seed=mode.seed, quorum=mode.quorum)
    return config


def mode_from_config(config) -> Mode:
    """The mode saved by :func:`mode_to_config`."""
    if isinstance(config, Mode):
        return config
    kind = config.get("kind")
    if kind == "sync":
        return Sync()
    if kind == "solo":
        return Solo()
    if kind == "majority":
        return Majority(seed=config.get("seed", 0), quorum=config.get("quorum"))
    raise ConfigError(f"unknown mode in a saved DistributedOptimizer config: {config!r}")


@keras.saving.register_keras_serializable(package="hvd_partial")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wrap a Keras 3 ``optimizer`` so that gradients are reduced across ranks
    with a partial (or synchronous) allreduce, and every taken round is applied.

    Arguments (Horovod's, plus ``mode``, ``max_staleness`` and ``name``):

    - ``optimizer``: any Keras 3 optimizer (SGD, Adam, AdamW, RMSprop, ...);
      reachable as ``.inner_optimizer``.
    - ``mode``: ``Solo()``, ``Majority(seed, quorum)`` or ``Sync()``; default ``hvd.default_mode()`` (``HVD_PARTIAL_MODE``, solo unless set)
      (Horovod's semantics exactly: one round per step, every rank's fresh gradient).
    - ``op``: ``Average`` (sum / world size) or ``Sum``.
    - ``compression``: ``Compression.none`` or ``Compression.fp16``.
    - ``backward_passes_per_step``: local steps whose gradients are summed
      (averaged with ``average_aggregated_gradients=True``) before one post.
    - ``max_staleness``: bound in rounds for solo and majority (default: the
      ``max_staleness`` given to ``init``).
    - ``sparse_as_dense``: reduce ``IndexedSlices`` gradients (Embedding) as
      dense tensors; otherwise they raise ``UnsupportedInputError``.
    - ``name``: the optimizer's name; its stream is ``"keras." + name``
      (``distributed_<inner name>`` by default: create optimizers in the same
      order on every rank; solo or majority on a process set with ``name``
      left out: ``"keras.distributed_<inner name>.set<id>.<n>"``, n counting
      the unnamed streams on the set's engine, as PyTorch's optimizer does).
    - ``process_set``: Horovod's; a set other than the global one reduces
      among its members only (``mode`` left out means ``Sync()``;
      ``Solo()`` and ``Majority(...)`` run on the set's own engine, a world
      of its members, started here: collective over the members; ``flush()``
      and the epoch flush are then collective over the members only); a
      rank outside the set applies its own gradients, as in Horovod.
    - ``device_dense``, ``device_sparse``, ``gradient_predivide_factor``,
      ``num_groups``, ``groups``, ``scale_local_gradients``,
      ``use_locking``: Horovod's, accepted at their default values only
      (``ConfigError`` otherwise; see ``PartialDistributedOptimizer`` for
      ``scale_local_gradients``).

    Attributes besides Horovod's, to read: ``exchange`` (the stream's
    :class:`~hvd_partial.tensorflow.GradientExchange`: posts, updates, rounds
    taken), ``model_variables`` (what the optimizer was built with),
    ``post_variables`` (what the latest post's gradients belong to; None
    before the first post) and ``fit_flushes_epochs`` (set by the
    ``FlushCallback`` while ``model.fit`` runs, which flushes every epoch).

    ``iterations`` is the inner optimizer's: the number of updates applied,
    identical on every rank after the same rounds. The learning rate travels
    with the rounds: each post carries the rate the inner optimizer holds
    then (a ``LearningRateSchedule`` evaluated on ``iterations``), every rank
    applies round r with the same rate (the posts' rate where they agree bit
    for bit, else their mean), and ``learning_rate`` reads this rank's own.
    Call ``flush()`` (collective) before reading weights in a custom loop;
    ``model.fit`` flushes by itself.

    Example::

        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                       mode=hvd.Majority(seed=1, quorum=2))
        model.compile(optimizer=opt, loss="mse")
    """

    def __init__(self, optimizer, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                 compression: Compressor = Compression.none, sparse_as_dense: bool = False,
                 gradient_predivide_factor: float = 1.0, op: ReduceOp = _core.Average,
                 backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False, num_groups: int = 0,
                 groups=None, process_set=global_process_set, scale_local_gradients: bool = True,
                 use_locking: bool = False, *, mode: Mode | None = None, max_staleness: int | None = None, **kwargs):
        if kwargs:
            raise ConfigError(
                f"DistributedOptimizer does not support argument(s) {', '.join(sorted(kwargs))}; supported: Horovod's "
                "(name, compression, sparse_as_dense, op, backward_passes_per_step, average_aggregated_gradients, "
                "process_set; device_dense, device_sparse, gradient_predivide_factor, num_groups, groups, "
                "scale_local_gradients and use_locking at their defaults) and mode, max_staleness")
        require_default("DistributedOptimizer", device_dense=(device_dense, ""), device_sparse=(device_sparse, ""),
                        gradient_predivide_factor=(gradient_predivide_factor, 1.0), num_groups=(num_groups, 0),
                        groups=(groups, None), scale_local_gradients=(scale_local_gradients, True),
                        use_locking=(use_locking, False))
        process_set = check_usable(process_set, "DistributedOptimizer")
        if isinstance(optimizer, DistributedOptimizer):
            raise UnsupportedInputError("the optimizer is already a DistributedOptimizer; wrap it only once")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise UnsupportedInputError(
                f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.*), got "
                f"{type(optimizer).__module__}.{type(optimizer).__name__}; for tf.keras 2 / tf_keras optimizers "
                "use hvd_partial.tensorflow.DistributedGradientTape")
        mode = set_mode(mode, process_set)
        mode = _core.default_mode() if mode is None else mode
        if not isinstance(mode, Mode):
            raise TypeError(f"mode must be hvd_partial.Sync(), Solo() or Majority(...), got {mode!r}")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and mode.kind != "sync":
            # Its loss scale changes from step to step: a round that carries
            # gradients scaled at different steps cannot be unscaled correctly.
            raise UnsupportedInputError(
                f"a LossScaleOptimizer (dynamic loss scaling, mixed precision) can only be wrapped with mode=Sync(); "
                f"got mode={mode!r}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ConfigError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        #: The stream's :class:`~hvd_partial.tensorflow.GradientExchange` (posts, updates, rounds taken).
        stream = f"keras.{self.name}"
        if name is None and not process_set.is_global and mode.kind != "sync":
            set_id = process_set.process_set_id
            stream += f".set{set_id}"
            if process_set.included():  # the members number the set engine's unnamed streams alike
                set_engine(process_set)  # started here: collective over the set's members
                stream += f".{_session.require().set_engines.next_name(set_id)}"
        self.exchange = GradientExchange(stream, mode, op, compression, max_staleness,
                                         sparse_as_dense, owner=f"DistributedOptimizer({self.name!r})", carries=1,
                                         process_set=process_set)
        self._rate = CarriedLearningRate(optimizer)
        self._accumulation = GradientAccumulation(self.exchange, backward_passes_per_step,
                                                  self.average_aggregated_gradients, self._rate.local)
        # Set through __dict__: Keras would track a list of variables assigned as an
        # attribute as this optimizer's own variables (and save the model's weights with it).
        self.__dict__["model_variables"] = None  # what the optimizer was built with
        self.__dict__["post_variables"] = None  # what the posts' gradients belong to (flush applies to these)
        #: True while model.fit's epoch-flush callback runs (it flushes; finalize_variable_values need not).
        self.fit_flushes_epochs = False

    # -- what the wrapper is ---------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self.exchange.mode

    @property
    def op(self) -> ReduceOp:
        return self.exchange.op

    @property
    def compression(self) -> Compressor:
        return self.exchange.compression

    @property
    def max_staleness(self) -> int | None:
        return self.exchange.max_staleness

    @property
    def sparse_as_dense(self) -> bool:
        return self.exchange.sparse_as_dense

    @property
    def stream_name(self) -> str:
        """The name of this optimizer's stream in ``hvd_partial.stats()``."""
        return self.exchange.name

    @property
    def rounds(self) -> int:
        """Rounds this rank has taken (including flush rounds with no data)."""
        return self.exchange.rounds_taken

    @property
    def last_results(self) -> list:
        """The ``RoundResult``s (facts and arrays) of the latest post or flush."""
        return self.exchange.last_results

    @property
    def applied_learning_rates(self) -> list:
        """``(round, learning rate)`` of each update the latest post or flush
        applied, in order: the same for a round on every rank."""
        return [(r, values[0]) for r, _, values in self.exchange.last_values]

    def stats(self) -> dict:
        """This stream's participation report (see ``hvd_partial.stats()``)."""
        return self.exchange.stats()

    # -- forwarded to the inner optimizer ----------------------------------------------

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def variables(self):
        return self._variables[:] + self.inner_optimizer.variables

    def get_weights(self):
        return [v.numpy() for v in self.variables]

    def set_weights(self, weights):
        # Keras's own set_weights covers only the wrapper's variables; a legacy
        # .h5 file holds the inner optimizer's too (iterations, moments).
        weights = [np.array(w) for w in weights]  # h5py datasets are read now, while the file is open
        if self.built and self.inner_optimizer.built:
            assign_weights(self.variables, weights, self.name)
            return
        # Keras's .h5 loader builds the optimizer with the model's own variables,
        # an empty list for Sequential and functional models: set what exists
        # now (both iteration counts and learning rates come first), the rest
        # once the optimizer is built with the model's variables.
        for variable, weight in zip(self._variables[:] + self.inner_optimizer.variables, weights):
            if tuple(variable.shape) == tuple(np.shape(weight)):
                variable.assign(weight)
        self.__dict__["_pending_weights"] = weights

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def build(self, var_list):
        var_list = list(var_list)
        if not var_list:
            # Keras's .h5 loader builds with a Sequential or functional model's
            # own variables, none: build at the first update, with the real ones.
            return
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        if self.backward_passes_per_step > 1:
            # Local gradient sums between posts: optimizer state, so they are
            # checkpointed; every flush leaves them at zero on every rank.
            self._accumulation.track([self.add_variable_from_reference(v, name="hvd_accumulated") for v in var_list],
                                     self.add_variable(shape=(), dtype="int32", name="hvd_passes"))
        self.__dict__["model_variables"] = var_list
        super().build(var_list)
        pending = self.__dict__.pop("_pending_weights", None)
        if pending is not None:
            assign_weights(self.variables, pending, self.name)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise UnsupportedInputError("DistributedOptimizer has no stateless_apply (it runs on TensorFlow only)")

    # -- applying --------------------------------------------------------------------

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Horovod's name for this rank's gradients of ``loss`` (a tensor
        recorded on ``tape``, or a callable) as ``[(grad, var), ...]``. They are
        local: the reduction happens in :meth:`apply_gradients`, which posts
        them (Horovod reduces here already; a partial round cannot be
        taken before the post)."""
        var_list = list(var_list() if callable(var_list) else var_list)
        if tape is None:
            if not callable(loss):
                raise UnsupportedInputError(
                    "DistributedOptimizer._compute_gradients: a loss tensor needs the tape that recorded it "
                    "(tape=...); or pass the loss as a callable")
            with tf.GradientTape() as tape:
                tape.watch(var_list)
                loss = loss()
        elif callable(loss):
            with tape:
                loss = loss()
        grads = tape.gradient(loss, var_list, grad_loss)
        return list(zip(grads, var_list))

    @graph_builder
    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        self.apply(grads, variables)
        return self.iterations

    @graph_builder
    def apply(self, grads, trainable_variables=None):
        """Post ``grads`` and apply every round taken (k inner updates)."""
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise UnsupportedInputError(
                    "DistributedOptimizer.apply(grads) without variables needs a built optimizer; "
                    "call optimizer.build(model.trainable_variables) first")
            variables = list(self.model_variables)
        else:
            variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
        self.__dict__["post_variables"] = variables
        try:
            if handoff.claimed_by_tape(grads):
                raise ConfigError(
                    f"rank {rank_label()}: DistributedOptimizer {self.name!r} got gradients that a "
                    "DistributedGradientTape already reduced; use one of the two (a plain Keras optimizer with the "
                    "tape)")
            if self.backward_passes_per_step == 1:
                rounds = self.exchange.exchange(grads, variables, carried=self._rate.local())
                rounds.apply_with(self._apply_one, variables)
            else:
                self._accumulation.add(grads, variables, self.model_variables, self._apply_one)
        except tf.errors.OpError as err:
            if not tf.executing_eagerly():
                raise
            self.exchange.reraise(err)

    def _apply_one(self, grads, variables, values):
        # One round: the inner update with the round's learning rate (values[0]).
        self._rate.apply_with(values[0], lambda: self.inner_optimizer.apply(grads, variables))

    def verify_across_ranks(self, variables=None) -> None:
        """Collective (every rank, eagerly): check that every rank wraps the same
        settings and variables of the same shapes and dtypes, and raise
        ``MismatchError`` on every rank naming the first difference. ``model.fit``
        runs it at the start of training (before the first post).

        Example::

            opt.build(model.trainable_variables)
            opt.verify_across_ranks()
        """
        variables = list(variables if variables is not None else (self.model_variables or []))
        settings = (mode_to_config(self.mode), self.op.value, self.compression.name, self.max_staleness,
                    self.sparse_as_dense, self.backward_passes_per_step, self.average_aggregated_gradients)
        # The optimizer's name, not its stream's: members of different sets number theirs apart.
        mine = (f"keras.{self.name}", settings, [(tuple(v.shape), str(v.dtype)) for v in variables])
        everyone = _core.allgather_object(mine)
        me = _core.rank()
        for other, theirs in enumerate(everyone):
            if theirs == mine:
                continue
            if theirs[0] != mine[0]:
                problem = f"optimizer {mine[0]!r} here, {theirs[0]!r} on rank {other}"
            elif theirs[1] != mine[1]:
                problem = f"settings {mine[1]} here, {theirs[1]} on rank {other}"
            elif len(theirs[2]) != len(mine[2]):
                problem = f"{len(mine[2])} trainable variables here, {len(theirs[2])} on rank {other}"
            else:
                i = next(i for i, (a, b) in enumerate(zip(mine[2], theirs[2])) if a != b)
                path = getattr(variables[i], "path", f"#{i}")
                problem = (f"trainable variable #{i} ({path!r} here) has shape/dtype {mine[2][i]} here and "
                           f"{theirs[2][i]} on rank {other}")
            raise MismatchError(f"rank {me}: DistributedOptimizer {self.name!r} differs across ranks: {problem}; "
                                "every rank must build the same model and optimizer")

    # -- flushing --------------------------------------------------------------------

    def flush(self) -> int:
        """Collective (every rank, eagerly): take and apply every outstanding
        round plus a final synchronous round that empties every rank's pending
        gradients. Afterwards weights and optimizer variables are identical on
        every rank. Returns the number of updates applied.

        Example::

            opt.flush()          # custom loop: before evaluation or a checkpoint
        """
        if self.post_variables is None:
            return 0  # nothing was ever posted from here
        variables = self.post_variables
        try:
            applied = 0
            if self.backward_passes_per_step > 1:
                # Gradients of the last incomplete group of passes are not lost.
                applied += self._accumulation.flush_pending(variables, self.model_variables, self._apply_one)
            rounds = self.exchange.flush(variables)
            applied += apply_compiled(rounds, self._apply_one, variables, self.__dict__.setdefault("_compiled", {}),
                                      tuple(id(v) for v in variables))
        except tf.errors.OpError as err:
            self.exchange.reraise(err)
        log.debug("rank %s: flushed %s, %d updates applied", rank_label(), self.stream_name, applied)
        return applied

    def finalize_variable_values(self, var_list):
        # model.fit calls this once after its last epoch, on every rank.
        if not self.fit_flushes_epochs:
            self.flush()
        self.inner_optimizer.finalize_variable_values(var_list)

    # -- serialization ------------------------------------------------------------------

    def get_config(self):
        return {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "mode": mode_to_config(self.mode),
            "op": self.op.value,
            "compression": self.compression.name,
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "max_staleness": self.max_staleness,
            "sparse_as_dense": self.sparse_as_dense,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        config["mode"] = mode_from_config(config.get("mode", {"kind": "solo"}))
        config["op"] = ReduceOp(config.get("op", "average"))
        config["compression"] = Compression.by_name(config.get("compression", "none"))
        return cls(inner, **config)


def assign_weights(variables: list, weights: list, name: str) -> None:
    """Assign saved ``weights`` to an optimizer's ``variables``, checking their count and shapes."""
    if len(weights) != len(variables):
        raise UnsupportedInputError(f"set_weights() got {len(weights)} arrays for the {len(variables)} variables "
                                    f"of DistributedOptimizer {name!r}")
    for variable, weight in zip(variables, weights):
        if tuple(variable.shape) != tuple(np.shape(weight)):
            raise UnsupportedInputError(f"optimizer variable {variable.path!r} has shape {tuple(variable.shape)}, "
                                        f"the saved value {tuple(np.shape(weight))}")
        variable.assign(weight)
