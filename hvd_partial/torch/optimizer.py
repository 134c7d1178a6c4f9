"""``DistributedOptimizer``: Horovod's optimizer wrapper on partial collectives.

The wrapper is a ``torch.optim.Optimizer`` (so LR schedulers, ``swa_utils`` and
``GradScaler`` accept it) that holds the user's optimizer and shares its
``param_groups`` and ``state``. Each ``step()`` posts this rank's gradients,
with its hyperparameters, as one fused stream and applies every round it
takes, in round order, through the wrapped optimizer, with the round's
hyperparameters: a rank that was behind makes k update steps at once (no
forward or backward), so parameters and optimizer state stay bitwise
identical on every rank. In sync mode with ``overlap_backward`` the gradients
go out in buckets during ``backward()`` instead (``backward_buckets.py``), and
``step()`` posts the rest.

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), mode=hvd.Solo())
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    opt.flush()  # before evaluation or a checkpoint, on every rank
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import warnings
import weakref
from collections import deque

import torch

import hvd_partial as _core
from .. import session as _session
from ..api import post_grouped
from ..collectives.process_sets import check_process_set, global_process_set, set_engine
from ..core import carried_values
from ..core.round_result import RoundResult
from ..errors import ConfigError, HvdPartialError, MismatchError, UnsupportedInputError
from ..modes import Mode, ReduceOp
from .backward_buckets import BackwardBuckets, post_groups
from .compression import Compression
from .wrapped_optimizer import WrappedOptimizer
from .parameter_grads import ParameterGradients, rank_label
from .round_hyperparameters import RoundHyperparameters
from .set_optimizer import new_optimizer

log = logging.getLogger("hvd_partial.torch")

_wrapped_count = itertools.count()
STATE_KEY = "hvd_partial"


class SynchronizationError(HvdPartialError):
    """``step``, ``synchronize``, ``skip_synchronize`` or backward passes were
    used in an order that would make the replicas diverge or lose gradients."""


class _PassCounter:
    """Counts gradient accumulations per parameter since the last post (kept
    apart from the optimizer so the autograd hooks do not hold it alive).

    The check happens in ``step``, not in the hook: a parameter may be shared
    by several wrappers, and an unused wrapper must not break backward.
    ``on_last_pass(param)`` runs when a parameter received its last pass of
    the step (sync mode's overlap posts its bucket then)."""

    def __init__(self, limit: int, names: dict[int, str], on_last_pass=None):
        self.limit = limit
        self.names = names
        self.counts: dict[int, int] = {}
        self.on_last_pass = on_last_pass

    def __call__(self, param: torch.Tensor) -> None:
        n = self.counts[id(param)] = self.counts.get(id(param), 0) + 1
        if n == self.limit and self.on_last_pass is not None:
            self.on_last_pass(param)

    def check(self) -> None:
        for pid, n in self.counts.items():
            if n > self.limit:
                raise SynchronizationError(
                    f"rank {rank_label()}: parameter {self.names.get(pid, '?')!r} accumulated a gradient {n} times "
                    f"before optimizer.step(); backward_passes_per_step={self.limit}. Raise "
                    "backward_passes_per_step to accumulate gradients locally, or call step() (or zero_grad()) "
                    "in between")

    def reset(self) -> None:
        self.counts.clear()


class DistributedOptimizer(WrappedOptimizer):
    """Wrap ``optimizer`` so that ``step()`` reduces gradients across ranks with
    a partial (or synchronous) allreduce and applies every round's result.

    Arguments (Horovod's, in Horovod's order, plus keyword-only ``mode``,
    ``max_staleness`` and ``name``):

    - ``optimizer``: any ``torch.optim.Optimizer`` whose ``step()`` needs no
      closure (SGD, Adam, AdamW, RMSprop, ...). It stays reachable as ``.optimizer``.
    - ``named_parameters``: ``model.named_parameters()``, used in error messages.
    - ``mode``: ``Solo()``, ``Majority(seed, quorum)`` or ``Sync()``; default: ``hvd.default_mode()`` (``HVD_PARTIAL_MODE``, solo unless set)
      (Horovod's semantics exactly: one round per step, every rank's fresh gradient).
    - ``op``: ``Average`` (sum / world size) or ``Sum``.
    - ``compression``: ``Compression.none`` or ``Compression.fp16``.
    - ``backward_passes_per_step``: backward passes that accumulate into
      ``.grad`` before each ``step()``; more raises ``SynchronizationError``.
      Gradients are summed over the passes (scale the loss to average them).
    - ``max_staleness``: bound in rounds for solo and majority (default: the
      ``max_staleness`` given to ``init``).
    - ``sparse_as_dense``: reduce sparse gradients as dense tensors. Otherwise
      sync mode allgathers them (Horovod's way) and solo/majority raise
      ``UnsupportedInputError``.
    - ``gradient_predivide_factor``: Horovod's, checked; it does not change
      the result (the average is the same).
    - ``num_groups`` or ``groups`` (Horovod's): ``groups=n`` (or
      ``num_groups=n``) splits the parameters, in order, into n groups;
      ``groups=[[p, ...], ...]`` names them (a parameter in no group is a
      group of its own). Each group is reduced as fused buffers of its own
      (one reduction per dtype, at most ``fusion_threshold_bytes`` a buffer),
      in every mode, and every group is in every round: a round is still one
      decision for the whole gradient. In sync mode with ``overlap_backward``
      the groups are the buckets posted during ``backward()``. The result is
      the one without groups (bitwise where the sums are exact or on 2 ranks;
      an MPI reduction of other buffer sizes may add in another order).
      ``ConfigError`` for a parameter in two groups or not of ``optimizer``.
    - ``process_set``: ``global_process_set``, or a set added with
      ``add_process_set``: with ``mode`` left out or ``Sync()``, Horovod's
      synchronous optimizer among its ranks (:mod:`hvd_partial.torch.set_optimizer`);
      with ``Solo()`` or ``Majority(...)``, this optimizer on the set's own
      engine (:mod:`hvd_partial.collectives.set_engines`): rounds, staleness and
      quorum among the set's members only. A rank outside the set steps with
      its own gradients, as in Horovod.
    - ``name``: the stream's name; by default the n-th wrapped optimizer of the
      process is ``torch.DistributedOptimizer.n`` (wrap in the same order on
      every rank), and the n-th on a process set ``torch.DistributedOptimizer.set<id>.n``
      (wrap in the same order on its members).

    Parameters with ``requires_grad=False`` when wrapped are left out. A
    parameter without a gradient in a step contributes zeros (as in Horovod),
    since other ranks may have one, and receives the reduced value.

    The wrapper is a ``torch.optim.Optimizer`` sharing the wrapped one's
    ``param_groups`` and ``state``: build LR schedulers (any of
    ``torch.optim.lr_scheduler``, ``swa_utils.SWALR``) on it and step them when
    you like. Every numeric scalar of ``param_groups`` travels with the post,
    and each round is applied with the values its posts agree on (their mean
    where they differ), the same on every rank; after ``step()`` the param
    groups hold this rank's own values again.

    Example::

        opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters()), mode=hvd.Majority(seed=1))
        loss.backward()
        opt.step()
        print(opt.rounds, [r.contributors for r in opt.last_results])
    """

    __new__ = new_optimizer  # process_set= a set other than the global one: set_optimizer.SetOptimizer

    def __init__(self, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step: int = 1, op: ReduceOp = _core.Average,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                 sparse_as_dense: bool = False, process_set=global_process_set, *, mode: Mode | None = None,
                 max_staleness: int | None = None, name: str | None = None):
        check_process_set(process_set, "DistributedOptimizer")
        if op is ReduceOp.ADASUM:
            raise UnsupportedInputError("DistributedOptimizer(op=Adasum): Adasum is not implemented by hvd_partial; "
                                        "use op=Average (the default)")
        if not isinstance(gradient_predivide_factor, (int, float)) or gradient_predivide_factor <= 0:
            raise ConfigError(f"gradient_predivide_factor must be a number > 0, got {gradient_predivide_factor!r}")
        if gradient_predivide_factor != 1.0 and op is not ReduceOp.AVERAGE:
            raise ConfigError("gradient_predivide_factor is only supported with op=Average (as in Horovod)")
        if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 0:
            raise ConfigError(f"num_groups must be an int >= 0, got {num_groups!r}")
        if groups is not None and num_groups:
            raise ConfigError("pass either num_groups or groups, not both (num_groups is Horovod's older name "
                              "for groups=<int>)")
        if groups is not None and not (isinstance(groups, int) and not isinstance(groups, bool) and groups >= 0) \
                and not (isinstance(groups, (list, tuple))
                         and all(isinstance(g, (list, tuple)) for g in groups)):
            raise ConfigError(f"groups must be an int >= 0 or a list of lists of parameters, got {groups!r}")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise UnsupportedInputError("LBFGS re-evaluates its closure inside step(); a partial round cannot be "
                                        "applied that way. Use an optimizer whose step() needs no closure")
        mode = _core.stream_options(mode, op, max_staleness)
        if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise TypeError(f"compression must be Compression.none, Compression.fp16 or a Compressor, "
                            f"got {compression!r}")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ConfigError(f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str, got {name!r}")

        self._inner = optimizer
        self._predivide = float(gradient_predivide_factor)
        self._mode = mode
        self._op = op
        self._compression = compression
        self._backward_passes = backward_passes_per_step
        self._max_staleness = max_staleness
        self._sparse_as_dense = bool(sparse_as_dense)
        # The engine the stream runs on: the session's, or a process set's own (members only).
        self._process_set = None if process_set.process_set_id == 0 else process_set
        if self._process_set is None:
            self._name = name or f"torch.DistributedOptimizer.{next(_wrapped_count)}"
        else:
            set_engines = _session.require().set_engines
            set_engine(process_set)  # started here: collective over its members
            set_id = process_set.process_set_id
            self._name = name or f"torch.DistributedOptimizer.set{set_id}.{set_engines.next_name(set_id)}"
        self._named = None if named_parameters is None else list(named_parameters)
        self._queue: deque[RoundResult] = deque()
        self._synchronized = False
        self._should_sync = True
        self._posted = False
        self._dirty = False  # contributions of this rank may still be pending
        self._taken = 0  # rounds of this stream taken in this process
        self._round_base = 0  # rounds taken before a checkpoint was loaded
        self._first_round: int | None = None  # the stream's number of the first round this process took
        self._updates = 0
        self._loaded: tuple | None = None  # (round, [(id, version) of each grad]) after synchronize()
        self._carried = RoundHyperparameters(optimizer)  # the param groups' scalars, posted with the gradients
        self._busy = False  # in step(), synchronize() or flush(): rounds taken after a collective wait for it
        self._listening_to = None  # the engine whose unpark listener applies rounds completed while parked
        self._parked_rounds: list[RoundResult] = []  # ... taken between synchronize() and step()
        self.last_results: list[RoundResult] = []
        self._hook_handles: list = []
        self._overlap: BackwardBuckets | None = None  # sync mode: buckets posted during backward
        self._overlap_settled = False  # whether the first synchronize() decided on overlap
        self._groups_spec = groups if groups is not None else num_groups  # 0: no groups
        self._collect_parameters()

    # ===== parameters ======================================================================

    def _collect_parameters(self) -> None:
        self._grads = ParameterGradients(self._inner, self._named, self._compression, self._sparse_as_dense,
                                         self._name)
        # Horovod's private map from parameter to name (Horovod's own tests read it).
        self._parameter_names = {p: self._grads.names_by_id[id(p)] for g in self._inner.param_groups
                                 for p in g["params"]}
        self._groups = parameter_groups(self._groups_spec, self._inner, self._grads)
        for handle in self._hook_handles:
            handle.remove()
        me = weakref.ref(self)

        def last_pass(param):
            # Sync mode with overlap: param received its last pass of the step; post what is complete.
            optimizer = me()
            if optimizer is None or optimizer._overlap is None:
                return
            if optimizer._synchronized:  # a backward pass after synchronize() without step(): that step was skipped
                optimizer._drop_skipped_rounds()
            optimizer._overlap.ready(param)

        self._passes = _PassCounter(self._backward_passes, self._grads.names_by_id, last_pass)
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._passes) for p in self._grads.params]

    # ===== Horovod's interface ============================================================

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # torch.amp.GradScaler.step() reads this: True makes it hand its scale to step() (which
        # refuses it in solo and majority); False (sync) makes it unscale and skip steps itself.
        return self._mode.kind != "sync"

    @property
    def name(self) -> str:
        """The stream's name (identical on every rank)."""
        return self._name

    @property
    def rounds(self) -> int:
        """Rounds taken so far (identical on every rank after each applied round,
        and kept across ``state_dict``/``load_state_dict``). Drive learning-rate
        schedules from this counter, never from a rank's local step count.

        While a round is applied (in step hooks) it counts that round too.
        """
        return self._round_base + self._taken

    @property
    def updates(self) -> int:
        """Rounds applied through the wrapped optimizer (rounds that carried no
        contribution from any rank are taken but not applied)."""
        return self._updates

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._overlap is not None and self._overlap.posted:
            raise SynchronizationError(
                f"rank {rank_label()}: optimizer.zero_grad() after backward() posted gradient buckets "
                "(overlap_backward) but before optimizer.step() or optimizer.synchronize(): those reductions are "
                "under way on every rank. Call step() (or synchronize()) first, as Horovod requires")
        if self._overlap is not None:
            self._overlap.reset()
        self._passes.reset()
        self._inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Post this rank's gradients, then apply every round taken, in order.

        ``closure`` (optional) is called once first, with grad enabled, to
        compute the gradients; its value is returned.
        """
        refuse_grad_scaler(self)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._synchronized:
            if self._should_sync:
                # Horovod warns the same way (scripts filter or catch it).
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(); applying the rounds already taken. Use "
                              "'with optimizer.skip_synchronize(): optimizer.step()' after synchronize()",
                              UserWarning, stacklevel=2)
        elif not self._should_sync:
            raise SynchronizationError(
                f"rank {rank_label()}: step() inside skip_synchronize() without a prior synchronize() would apply this "
                "rank's local gradient alone and the replicas would diverge; call optimizer.synchronize() first")
        else:
            self.synchronize()
        self._apply_queue()
        return loss

    def synchronize(self) -> list[RoundResult]:
        """Post this rank's gradients and take the rounds that are ready; the
        first taken round's result is left in each ``p.grad``.

        Horovod's pattern for gradient clipping works in every mode::

            loss.backward()
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with opt.skip_synchronize():
                opt.step()

        In solo and majority modes a rank may take several rounds at once, and an
        edit of ``p.grad`` could only apply to the first: ``step()`` then raises
        ``SynchronizationError``. Clip per round instead, with a hook that runs
        before every applied round on every rank::

            def clip(optimizer, args, kwargs):  # a step hook must return None
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

            opt.register_step_pre_hook(clip)

        Returns the taken rounds' facts (round, initiator, contributors, staleness).
        """
        if self._synchronized:
            if not self._passes.counts:
                return self.last_results
            self._drop_skipped_rounds()
        self._listen_for_unpark()
        self._passes.check()
        self._grads.settle_sparse_layout(self._mode)
        if not self._overlap_settled:  # at the first step, once the sparse layout is settled
            self._overlap_settled = True
            self._overlap = BackwardBuckets.for_optimizer(self._grads, self._name, self._mode, self._op,
                                                          self._groups)
        overlap = self._overlap
        try:
            if overlap is not None:
                results, ctxs, changed = overlap.finish(self._carried.encode())
                if changed:
                    raise SynchronizationError(
                        f"rank {rank_label()}: the gradients of {changed[:5]}{' ...' if len(changed) > 5 else ''} "
                        "changed after backward() posted them (overlap_backward, sync mode): the step's round holds "
                        "them as they were then, so the change would be lost. Edit gradients after "
                        "optimizer.synchronize() (Horovod's pattern), or set HVD_PARTIAL_OVERLAP_BACKWARD=0")
            else:
                arrays, ctxs = self._grads.pack(self._mode)
                arrays.append(self._carried.encode())  # last: ParameterGradients.load zips the others with params
                # num_groups/groups: each group fused apart, every group in every round of the one stream
                groups = post_groups(self._groups, self._grads.dense_indices(), 1)
                engine = self._engine()
                results = engine.wait(post_grouped(engine, arrays, self._name, self._mode, self._op,
                                                   self._max_staleness, groups=groups))
        except MismatchError as err:
            raise explain_mismatch(self._grads, self._name, err, self._process_set) from err
        results = self._parked_rounds + results
        self._parked_rounds = []
        self._grads.reduce_sparse(self._op)
        self._ctxs = ctxs
        self._posted = True
        self._dirty = self._mode.kind != "sync"
        self._passes.reset()
        self._queue = deque(results)
        self.last_results = [r.facts_only() for r in results]
        first = next((r for r in results if r.has_data), None)
        if first is not None:
            self._load_round(first, ctxs)
            self._loaded = (first.round, self._grads.versions())
        self._synchronized = True
        return self.last_results

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this context ``step()`` applies the rounds taken by an earlier
        ``synchronize()`` without posting again.

        Example::

            with opt.skip_synchronize():
                opt.step()
        """
        self._should_sync = False
        try:
            yield
        finally:
            self._should_sync = True

    def flush(self) -> list[RoundResult]:
        """Collective: apply every round not yet taken plus a final synchronous
        round that empties every rank's pending gradients; afterwards every
        rank's parameters and optimizer state are bitwise identical.

        Call it on every rank before evaluation, checkpoints and the end of
        training.

        Example::

            opt.flush()
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
        """
        if self._synchronized:
            self._apply_queue()
        if not self._posted:
            return []  # round 0 needs every rank's first post: nobody has posted
        if self._overlap is not None and self._overlap.posted:
            raise SynchronizationError(
                f"rank {rank_label()}: optimizer.flush() after backward() posted gradient buckets "
                "(overlap_backward) but before optimizer.step(): call step() first")
        self._busy = True
        try:
            if self._overlap is not None:
                results = self._overlap.flush()
            else:
                engine = self._engine()
                results = engine.wait(engine.submit_flush(self._name))
        except MismatchError as err:
            raise explain_mismatch(self._grads, self._name, err, self._process_set) from err
        finally:
            self._busy = False
        results = self._parked_rounds + results
        self._parked_rounds = []
        self._queue = deque(results)
        self.last_results = [r.facts_only() for r in results]
        self._loaded = None
        self._apply_queue()
        self._dirty = False
        return self.last_results

    # ===== state =============================================================================

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus ``"hvd_partial"``: the round
        counter and protocol facts needed to resume. Take it after ``flush()``
        (on every rank): contributions still pending in the engine are not in it.

        Example::

            opt.flush()
            torch.save(opt.state_dict(), "opt.pt")
        """
        if self._dirty:
            log.warning("rank %s: state_dict() of %s without flush() since the last step: this rank's gradients "
                        "still pending in the engine are not saved; call optimizer.flush() on every rank first",
                        rank_label(), self._name)
        sd = self._inner.state_dict()
        sd[STATE_KEY] = {"format": 1, "rounds": self.rounds, "updates": self._updates, "stream": self._name,
                         "mode": list(self._mode.describe()), "flushed": not self._dirty}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from :meth:`state_dict` (or a plain optimizer's);
        the round counter resumes from the saved one."""
        state_dict = dict(state_dict)
        extra = state_dict.pop(STATE_KEY, None)
        self._inner.load_state_dict(state_dict)
        if extra is not None:
            self._round_base = int(extra["rounds"]) - self._taken
            self._updates = int(extra.get("updates", 0))
            if not extra.get("flushed", True):
                log.warning("rank %s: loading a state dict saved without flush(); gradients that were pending "
                            "when it was saved are lost", rank_label())

    def add_param_group(self, param_group: dict) -> None:
        if self._posted:
            raise UnsupportedInputError(
                f"rank {rank_label()}: add_param_group() after the first step: the stream {self._name!r} has a fixed "
                "layout. Add every group before the first step, or wrap a new optimizer")
        self._inner.add_param_group(param_group)
        self._collect_parameters()

    # ===== per-round hooks and schedules ========================================================

    def register_step_pre_hook(self, hook):
        """Run ``hook(optimizer, args, kwargs)`` before every applied round (on
        every rank, in round order): the place for per-round gradient clipping."""
        return self._inner.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        """Run ``hook(optimizer, args, kwargs)`` after every applied round."""
        return self._inner.register_step_post_hook(hook)

    def stats(self) -> dict:
        """This stream's participation report (see ``hvd_partial.stats``)."""
        if self._process_set is not None:
            return self._engine().stats.snapshot().get(self._name, {})
        return _core.stats().get(self._name, {})

    def close(self) -> None:
        """Remove the autograd hooks that count backward passes."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner.__class__.__name__}, mode={self._mode}, stream={self._name!r})"

    # ===== internals ================================================================================

    def _engine(self):
        """The engine this optimizer's stream runs on: the session's, or its process set's own."""
        if self._process_set is None:
            return _session.require().engine
        return set_engine(self._process_set)

    def _listen_for_unpark(self) -> None:
        if self._mode.kind == "sync":
            return
        engine = self._engine()
        if self._listening_to is not None and self._listening_to() is engine:
            return
        self._listening_to = weakref.ref(engine)
        me = weakref.ref(self)

        def apply_after_park():
            optimizer = me()
            if optimizer is not None:
                optimizer._apply_parked_rounds()

        engine.unpark_listeners.append(apply_after_park)

    def _apply_parked_rounds(self) -> None:
        """This rank waited in a call that needs every rank (``hvd.allreduce``,
        ``barrier``, ``join``, another stream's flush), holding nobody back: take
        the rounds completed meanwhile. Under ``torch.no_grad()`` (evaluation)
        apply them now, so that the model has them. With autograd on, a
        forward pass's graph may still need the parameters as they are (Horovod's
        ImageNet example allreduces a metric between forward and backward), and
        between ``synchronize()`` and ``step()`` rounds are loaded for ``step()``:
        there they are applied at the next ``step()``, before its own rounds."""
        if self._busy or not self._posted:
            return
        engine = self._engine()
        self._parked_rounds.extend(engine.wait(engine.submit_take(self._name)))
        if not self._parked_rounds or self._synchronized or torch.is_grad_enabled():
            return
        results, self._parked_rounds = self._parked_rounds, []
        params = self._grads.params
        grads = [p.grad for p in params]  # the user's local gradients stay as they were
        try:
            self._queue = deque(results)
            self._loaded = None
            self._apply_queue()
        finally:
            for p, g in zip(params, grads):
                p.grad = g
        self.last_results = [r.facts_only() for r in results]

    def _apply_queue(self) -> None:
        queue = self._queue
        loaded = self._loaded
        self._loaded = None
        self._synchronized = False
        applicable = sum(1 for r in queue if r.has_data)
        if loaded is not None and applicable > 1 and self._grads.versions() != loaded[1]:
            queue.clear()
            raise SynchronizationError(
                f"rank {rank_label()}: p.grad was changed between synchronize() and step(), but this rank took "
                f"{applicable} rounds at once (solo/majority) and the change could apply to only one of them; "
                "the replicas would diverge. Use optimizer.register_step_pre_hook(...) for per-round clipping")
        if not any(r.has_data for r in queue):  # nobody contributed (a sync flush round): taken, not applied
            self._took(take_all(queue))
            return
        local = self._carried.read()  # this rank's own values: back in param_groups after the rounds
        try:
            while queue:
                result = queue.popleft()
                self._took(result.round)
                if not result.has_data:
                    # Nobody contributed: applying zeros would still move momentum
                    # and weight decay, which no gradient asked for.
                    continue
                if loaded is None or result.round != loaded[0]:
                    self._load_round(result, self._ctxs)
                applied = self._carried.of_round(result, self._op is ReduceOp.AVERAGE)
                self._carried.write(applied)
                self._inner.step()
                self._updates += 1
                after = self._carried.read()
                if after != applied:  # a step hook set them (a schedule by rounds): that setting stays
                    local = [a if a != b else old for a, b, old in zip(after, applied, local)]
        finally:
            self._carried.write(local)

    def _load_round(self, result: RoundResult, ctxs: list) -> None:
        """Every ``p.grad`` set to ``result``'s gradient as one step applies it (``cap_round_step``)."""
        scale = carried_values.step_scale(result, self._op is ReduceOp.AVERAGE, _core.config().cap_round_step)
        self._grads.load(result, ctxs, scale)

    def _took(self, round_number: int | None) -> None:
        """Rounds up to ``round_number`` of the stream are taken here. ``_taken`` counts
        the rounds taken in this process: a process that joined a grown world
        (docs/elastic.md, "Growing back") takes its first round at the number the
        stream had reached, and the round counter it loaded at ``state.sync()``
        (``broadcast_optimizer_state``) already counts the rounds before it."""
        if round_number is None:
            return
        if self._first_round is None:
            self._first_round = round_number
        self._taken = round_number + 1 - self._first_round

    def _drop_skipped_rounds(self) -> None:
        """A backward pass after ``synchronize()`` without ``step()``: the step was skipped.

        In sync mode every rank took the same one round and skips it alike when
        the skip depends on the reduced gradient (``GradScaler`` finding inf/nan
        in it): the round is dropped, as Horovod drops it. In solo and majority
        the taken rounds must be applied on every rank: refused."""
        if self._mode.kind != "sync":
            raise SynchronizationError(
                f"rank {rank_label()}: a backward pass after synchronize() without step(): the rounds this rank "
                f"took ({[r.round for r in self.last_results]}) must be applied on every rank in "
                f"{self._mode.kind} mode. Call 'with optimizer.skip_synchronize(): optimizer.step()' first")
        log.debug("rank %s: %s: round(s) %s were not stepped (GradScaler skipped them?): dropped on every rank",
                  rank_label(), self._name, [r.round for r in self.last_results])
        self._took(take_all(self._queue))
        self._loaded = None
        self._synchronized = False


def parameter_groups(spec, optimizer: torch.optim.Optimizer, grads: ParameterGradients) -> list[list[int]] | None:
    """Horovod's ``num_groups``/``groups`` as lists of indices into ``grads.params``
    (the parameters with ``requires_grad``), or None for no groups (0).

    An int n splits the parameters, in order, into n groups of nearly equal
    counts (the first ones one longer); a list of lists of parameters gives
    the groups, and every parameter in none is a group of its own, after
    them. Frozen parameters are left out of both; empty groups are dropped.
    ``ConfigError`` for a parameter listed twice or not the optimizer's."""
    params = grads.params
    if isinstance(spec, int):
        if spec == 0:
            return None
        count, extra = divmod(len(params), spec)
        bounds = [n * count + min(n, extra) for n in range(spec + 1)]
        return [list(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]
    index = {id(p): i for i, p in enumerate(params)}
    of_optimizer = {id(p) for g in optimizer.param_groups for p in g["params"]}
    seen: dict[int, int] = {}
    out = []
    for n, group in enumerate(spec):
        kept = []
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ConfigError(f"groups[{n}] holds a {type(p).__name__}; groups are lists of the optimizer's "
                                  "parameters")
            if id(p) not in of_optimizer:
                raise ConfigError(f"groups[{n}] holds a tensor of shape {list(p.shape)} that is not a parameter of "
                                  "the wrapped optimizer")
            if id(p) in seen:
                raise ConfigError(f"parameter {grads.names_by_id[id(p)]!r} is in groups[{seen[id(p)]}] and "
                                  f"groups[{n}]; a parameter may be in one group only")
            seen[id(p)] = n
            if id(p) in index:  # requires_grad: reduced
                kept.append(index[id(p)])
        if kept:
            out.append(kept)
    out += [[i] for i, p in enumerate(params) if id(p) not in seen]
    return out


def explain_mismatch(grads: ParameterGradients, stream: str, err: MismatchError, process_set=None) -> MismatchError:
    """Every rank (of ``process_set``, None: the global set) got ``err`` (the stream was
    rejected everywhere): compare the parameters across ranks to say which one differs."""
    mine = grads.describe()
    try:
        everyone = _core.allgather_object(mine, process_set=process_set or global_process_set)
    except HvdPartialError:
        return err
    ranks = process_set.ranks if process_set is not None else range(len(everyone))
    problems = []
    first = ranks[0]
    for rank, theirs in zip(ranks, everyone):
        if rank == first or theirs == everyone[0]:
            continue
        if len(theirs) != len(everyone[0]):
            problems.append(f"rank {rank} has {len(theirs)} parameters with gradients, rank {first} has "
                            f"{len(everyone[0])}")
            continue
        for a, b in zip(theirs, everyone[0]):
            if a != b:
                problems.append(f"rank {rank} has parameter {a[0]!r} {a[1]} {a[2]} where rank {first} has "
                                f"{b[0]!r} {b[1]} {b[2]}")
                break
    if not problems:
        return err
    return MismatchError(f"rank {rank_label()}: DistributedOptimizer stream {stream!r}: the model differs across "
                         f"ranks: {'; '.join(problems)}. Every rank must wrap the same parameters "
                         f"(same order, shapes and dtypes)")


def take_all(queue) -> int | None:
    """Take the rounds of ``queue`` without applying them; the last one's number (None: none)."""
    last = None
    while queue:
        last = queue.popleft().round
    return last


def refuse_grad_scaler(optimizer: DistributedOptimizer) -> None:
    """``torch.amp.GradScaler.step()`` in solo or majority: it set ``grad_scale`` and
    ``found_inf`` on the optimizer before calling ``step()`` (see ``_step_supports_amp_scaling``)."""
    if "grad_scale" not in optimizer.__dict__ and "found_inf" not in optimizer.__dict__:
        return
    optimizer.__dict__.pop("grad_scale", None)
    optimizer.__dict__.pop("found_inf", None)
    raise UnsupportedInputError(
        f"rank {rank_label()}: torch.amp.GradScaler with DistributedOptimizer in {optimizer.mode.kind} mode: each "
        "rank's loss scale and its decision to skip a step on inf/nan would differ, so posts scaled "
        "differently would be summed and the replicas would diverge. Use mode=hvd.Sync() with Horovod's "
        "pattern (synchronize(), scaler.unscale_(opt), then 'with opt.skip_synchronize(): "
        "scaler.step(opt)'), or train without loss scaling (bfloat16 autocast needs none)")
