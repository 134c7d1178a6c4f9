"""Sync mode's overlap of reductions with the backward pass (``overlap_backward``).

The parameters with dense gradients are cut, in reverse registration order
(the order in which a sequential model's backward pass completes them, as
DDP does), into buckets of at most ``fusion_threshold_bytes`` of wire data;
where the optimizer has ``num_groups`` or ``groups`` (Horovod's), its groups
are the buckets instead (``plan_buckets`` makes both plans).
Bucket ``k`` travels on a sync stream of its own, ``<stream>.overlap.<k>``,
except the last bucket, which travels on the optimizer's stream itself with
the param groups' scalars (``round_hyperparameters.py``) appended, so that
they are read at ``step()`` as without overlap. Each stream is a sync stream:
a post starts its reduction at once (``core/rank_stream.py``), on the stream's
own communicator.

During ``backward()`` the post-accumulate-grad hook reports each parameter
whose gradient received its last pass of the step (``backward_passes_per_step``
of them); buckets are staged to the host in their fixed order, each as soon as
it and every bucket before it are complete, and posted in that order once
staged, so every rank posts the same streams in the same order, and every
gradient travels in exactly one round. CPU gradients are staged at once (numpy
views), so their bucket is posted from the same hook call; CUDA gradients are
copied on a side stream while the backward pass goes on, and their bucket is
posted from the first hook call (or ``finish``) that finds its copies done. ``finish``
(from ``synchronize()``) posts every bucket not yet posted (parameters
without a gradient as zeros, as without overlap), waits for all of them and
joins the K rounds of the step into one result in the stream's array order:
the optimizer applies it as one round, as it would a post of the whole
gradient (bitwise the same sums on 2 ranks; on more, equal to rounding, since
the buffers are cut differently).

With a single bucket (a model below ``fusion_threshold_bytes``) nothing is
posted before ``step()``: the post is the one made without overlap.

Example::

    buckets = BackwardBuckets(grads, "torch.DistributedOptimizer.0", mode, op, bucket_bytes=1 << 20)
    buckets.ready(param)                             # from the hook, after param's last pass of the step
    results, ctxs, changed = buckets.finish(hyper)   # in synchronize(): the step's rounds, joined
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np
import torch

import hvd_partial as _core
from ..core.overlap import MAX_OVERLAP_BUCKETS as MAX_BUCKETS
from ..core.overlap import cap_buckets, join_bucket_rounds
from ..core.round_result import RoundResult
from ..modes import Mode, ReduceOp
from .parameter_grads import ParameterGradients, rank_label
from .tensors import HostStaging

log = logging.getLogger("hvd_partial.torch")


def plan_buckets(params: list[torch.Tensor], dense: list[int], itemsizes: list[int], limit: int,
                 groups: list[list[int]] | None = None) -> list[list[list[int]]]:
    """The buckets of the ``dense`` parameters, in posting order, each a list
    of groups (parameter indices) fused apart within the bucket's post.

    Without ``groups``: cut in reverse order, each bucket one group of at most
    ``limit`` bytes (a parameter larger than that alone). With ``groups`` (the
    optimizer's ``num_groups``/``groups``): each group is a bucket, the group
    holding the latest-registered first parameter first (a backward pass
    completes it first). Either way at most ``MAX_BUCKETS`` buckets: beyond
    that the last ones merge (cut buckets into one group, the user's groups
    staying groups of one post)."""
    if groups is None:
        sizes = {i: params[i].numel() * itemsizes[i] for i in dense}
        limit = max(limit, -(-sum(sizes.values()) // MAX_BUCKETS))
        buckets: list[list[list[int]]] = []
        filled = 0
        for i in reversed(dense):
            if not buckets or (buckets[-1][0] and filled + sizes[i] > limit):
                buckets.append([[]])
                filled = 0
            buckets[-1][0].append(i)
            filled += sizes[i]
    else:
        member = set(dense)
        kept = [sorted(i for i in g if i in member) for g in groups]
        buckets = [[g] for g in sorted((g for g in kept if g), key=lambda g: -g[0])]
    cap_buckets(buckets)  # greedy cuts of uneven sizes: the last buckets merge
    if groups is None:  # one group per bucket
        buckets = [[sorted(i for g in b for i in g)] for b in buckets]
    return buckets


def post_groups(groups: list[list[int]] | None, indices: list[int], extra: int = 0) -> list[list[int]] | None:
    """The ``groups=`` of a grouped post of the parameters ``indices`` (in that
    order) followed by ``extra`` arrays (the carried hyperparameters), which
    join the last group: positions in the post, groups without a posted
    parameter left out; None where that leaves one group (the plain post)."""
    if groups is None:
        return None
    position = {i: n for n, i in enumerate(indices)}
    out = [[position[i] for i in g if i in position] for g in groups]
    out = [g for g in out if g]
    if len(out) <= 1:
        return None
    out[-1].extend(range(len(indices), len(indices) + extra))
    return out


class BackwardBuckets:
    """One sync-mode optimizer's buckets and what each step posted of them.

    ``grads`` is the optimizer's :class:`ParameterGradients` after its sparse
    layout is settled; ``stream`` the optimizer's stream name."""

    def __init__(self, grads: ParameterGradients, stream: str, mode: Mode, op: ReduceOp, bucket_bytes: int,
                 groups: list[list[int]] | None = None):
        self.grads = grads
        self.mode = mode
        self.op = op
        self.dense = grads.dense_indices()
        itemsizes = [grads.compressed_dtype(p.dtype).itemsize for p in grads.params]
        plan = plan_buckets(grads.params, self.dense, itemsizes, bucket_bytes, groups)
        self.buckets = [sorted(i for g in b for i in g) for b in plan]  # a bucket's arrays: the stream's order
        last = len(plan) - 1
        # each bucket's post: its groups fused apart (None: one group); the scalars join the last bucket's
        self.groups = [post_groups(b if len(b) > 1 else None, self.buckets[k], int(k == last))
                       for k, b in enumerate(plan)]
        last = len(self.buckets) - 1
        self.streams = [f"{stream}.overlap.{k}" for k in range(last)] + [stream]
        self.bucket_of = {id(grads.params[i]): k for k, bucket in enumerate(self.buckets) for i in bucket}
        side_streams: dict = {}  # the buckets' device copies queue on one stream per device, in order
        self._staging = [HostStaging(side_streams) for _ in self.buckets]  # a bucket's pinned buffers stay its own
        self._position = {i: n for n, i in enumerate(self.dense)}  # a parameter's place in the stream's arrays
        self.copying: deque = deque()  # (bucket, host arrays, CopyDone) staged and not yet posted, in order
        self.reset()

    @classmethod
    def for_optimizer(cls, grads: ParameterGradients, stream: str, mode: Mode, op: ReduceOp,
                      groups: list[list[int]] | None = None) -> "BackwardBuckets | None":
        """The buckets of an optimizer at its first step, or None where it posts
        at ``step()``: solo and majority, ``overlap_backward`` off, ``elastic``
        training, or no dense gradient. ``groups``: the optimizer's groups of
        parameter indices (``num_groups``/``groups``), which are then the buckets."""
        cfg = _core.config()
        if (mode.kind != "sync" or not cfg.overlap_backward or cfg.elastic
                or len(grads.sparse_indices) == len(grads.params)):
            return None
        buckets = cls(grads, stream, mode, op, cfg.fusion_threshold_bytes, groups)
        log.debug("rank %s: %s posts %d buckets during backward: %s", rank_label(), stream, len(buckets.buckets),
                  buckets.describe())
        return buckets

    def reset(self) -> None:
        """A new step: nothing posted, every bucket waiting for all its gradients."""
        for _, _, copied in self.copying:
            # A step given up with copies still queued: they must not write a pinned buffer the next step fills.
            try:
                copied.synchronize()
            except Exception as err:  # noqa: BLE001 (the error that gave the step up is the one to raise)
                log.debug("rank %s: a dropped bucket's copy failed: %s", rank_label(), err)
        self.missing = [len(b) for b in self.buckets]
        self.next = 0  # the next bucket to stage, in order
        self.copying = deque()
        self.handles: list = [None] * len(self.buckets)
        self.ctxs: list = [None] * len(self.buckets)
        self.versions: list = [None] * len(self.buckets)

    @property
    def posted(self) -> bool:
        """Some bucket of this step was staged (and so read, or posted) during backward."""
        return self.next > 0

    def ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient received its last pass of the step: stage the
        buckets that are now complete, in order (never the last: ``finish``),
        and post those whose copies to the host are done. A post that raises
        leaves the step as if nothing was posted."""
        k = self.bucket_of.get(id(param))
        if k is None:
            return
        self.missing[k] -= 1
        last = len(self.buckets) - 1
        try:
            while self.next < last and self.missing[self.next] <= 0:
                self._stage(self.next)
                self.next += 1
            self._post_copied(wait=False)
        except BaseException:
            self.reset()
            raise

    def finish(self, hyperparameters: np.ndarray) -> tuple[list[RoundResult], list, list[str]]:
        """Post every bucket not yet posted (the last with ``hyperparameters``),
        wait for all, and return the step's rounds, each joined over the buckets
        in the stream's array order, the compression contexts to load them, and
        the names of the parameters whose gradient changed after its bucket was
        posted during backward (the rounds hold them as they were then)."""
        try:
            self._post_copied(wait=True)
        except BaseException:
            self.reset()
            raise
        for k in range(self.next, len(self.buckets)):
            self._post(k, hyperparameters if k == len(self.buckets) - 1 else None)
        self.next = len(self.buckets)
        changed = [self.grads.names[i] for k in range(len(self.buckets) - 1)
                   for i, then, now in zip(self.buckets[k], self.versions[k], self._versions(k)) if then != now]
        try:
            # The optimizer's own stream first: where ranks disagree on the buckets (another
            # overlap_backward or fusion_threshold_bytes), its registration fails on every rank.
            last = _core.synchronize(self.handles[-1])
            per_bucket = [_core.synchronize(h) for h in self.handles[:-1]] + [last]
        finally:
            ctxs_by_bucket = self.ctxs
            self.reset()
        ctxs: list = [None] * len(self.dense)
        for bucket, bucket_ctxs in zip(self.buckets, ctxs_by_bucket):
            for i, ctx in zip(bucket, bucket_ctxs):
                ctxs[self._position[i]] = ctx
        return self._join(per_bucket), ctxs, changed

    def flush(self) -> list[RoundResult]:
        """Collective: flush every bucket's stream together; the rounds joined as in ``finish``."""
        handles = [_core.flush_async(s) for s in self.streams]
        return self._join([_core.synchronize(h) for h in handles])

    def describe(self) -> list:
        """(stream, parameter names) of every bucket, in posting order."""
        return [(s, [self.grads.names[i] for i in b]) for s, b in zip(self.streams, self.buckets)]

    # ===== internals ================================================================

    def _versions(self, k: int) -> list:
        params = self.grads.params
        return [(id(g), g._version) if (g := params[i].grad) is not None else None for i in self.buckets[k]]

    def _stage(self, k: int) -> None:
        """Stage bucket ``k`` to the host without waiting for device copies; posted by ``_post_copied``."""
        arrays, ctxs, copied = self.grads.pack_async(self.mode, self.buckets[k], self._staging[k])
        self.versions[k] = self._versions(k)
        self.ctxs[k] = ctxs
        self.copying.append((k, arrays, copied))

    def _post_copied(self, wait: bool) -> None:
        """Post the staged buckets, in order, while the next one's copies are done (``wait``: all of them)."""
        while self.copying and (wait or self.copying[0][2].query()):
            k, arrays, copied = self.copying.popleft()
            copied.synchronize()
            self._submit(k, arrays)

    def _post(self, k: int, hyperparameters: np.ndarray | None) -> None:
        """Stage bucket ``k`` (waiting for its copies) and post it, the last with ``hyperparameters``."""
        arrays, ctxs = self.grads.pack(self.mode, self.buckets[k], self._staging[k])
        if hyperparameters is not None:
            arrays.append(hyperparameters)
        self.versions[k] = self._versions(k)
        self.ctxs[k] = ctxs
        self._submit(k, arrays)

    def _submit(self, k: int, arrays: list) -> None:
        self.handles[k] = _core.grouped_partial_allreduce_async(arrays, self.streams[k], mode=self.mode, op=self.op,
                                                                groups=self.groups[k])

    def _join(self, per_bucket: list[list[RoundResult]]) -> list[RoundResult]:
        """The buckets' rounds, round by round, as the last bucket's results with
        every bucket's arrays in the stream's order (the scalars last)."""
        positions = [[self._position[i] for i in bucket] for bucket in self.buckets]
        return join_bucket_rounds(per_bucket, self.streams, positions, len(self.dense), rank_label())
