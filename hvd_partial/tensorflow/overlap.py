"""Sync mode's overlap of reductions with the backward pass, for TensorFlow
(``overlap_backward``).

A stream's gradients are fused into the plan's groups (at most
``fusion_threshold_bytes`` each, :class:`~hvd_partial.tensorflow.exchange.GradientPlan`).
With overlap, each group is a bucket posted by a ``tf.numpy_function`` of its
own that reads only that group's gradients, so inside a ``tf.function`` (a
Keras train step, a custom step with ``DistributedGradientTape``) TensorFlow's
executor runs it as soon as those gradients are computed, while the rest of
the backward pass goes on. Buckets go out in reverse variable order (a
backward pass computes the last layers' gradients first), each post
control-dependent on the previous one, so every rank posts the same streams in
the same order. Bucket ``k`` travels on a sync stream of its own,
``<stream>.overlap.<k>``; the last bucket (the first variables' gradients,
with the carried values) on the stream itself, whose post also waits for
every bucket and joins the step's rounds into the stream's layout
(:meth:`OverlapBuckets.join`). Eagerly the same posts run one after the other.

Example::

    overlap = OverlapBuckets.for_plan("keras.SGD", 4, "sync", on_set=False)   # None where it does not apply
    overlap.buckets    # [[3], [2], [1], [0]]: group indices, in posting order
    overlap.streams    # ['keras.SGD.overlap.0', 'keras.SGD.overlap.1', 'keras.SGD.overlap.2', 'keras.SGD']
"""

from __future__ import annotations

import hvd_partial as _core
from ..core.overlap import cap_buckets, join_bucket_rounds
from ..core.round_result import RoundResult


def overlap_buckets(groups: int) -> list[list[int]]:
    """The plan's ``groups`` fused buffers as buckets in posting order: the last
    group first, one group a bucket, at most ``MAX_OVERLAP_BUCKETS`` (the first groups
    then share the last bucket)."""
    return cap_buckets([[j] for j in reversed(range(groups))])


class OverlapBuckets:
    """One stream's buckets and the handles of the step's bucket posts."""

    def __init__(self, stream: str, groups: int):
        self.buckets = overlap_buckets(groups)
        last = len(self.buckets) - 1
        self.streams = [f"{stream}.overlap.{k}" for k in range(last)] + [stream]
        #: Handles of this step's posts of every bucket but the last.
        self.handles: list = [None] * last

    @classmethod
    def for_plan(cls, stream: str, groups: int, mode_kind: str, on_set: bool) -> "OverlapBuckets | None":
        """The buckets of a stream whose plan has ``groups`` fused buffers, or None
        where its post is one: solo and majority (a round would wait for its
        initiator's backward pass), a stream on a process set (a grouped allreduce
        among the members), ``elastic`` training (a failure in the middle of a
        backward pass would leave part of a step posted), ``overlap_backward`` off,
        or a single group."""
        if mode_kind != "sync" or on_set or groups < 2 or not _core.is_initialized():
            return None
        cfg = _core.config()
        if cfg.elastic or not cfg.overlap_backward:
            return None
        return cls(stream, groups)

    def join(self, final: list[RoundResult], per_bucket: list[list[RoundResult]], groups: int,
             rank: str) -> list[RoundResult]:
        """The stream's rounds with every bucket's arrays in the plan's group order
        (then the carried values, where the last bucket's post has them):
        ``final`` are the last bucket's rounds, ``per_bucket`` the others'."""
        return join_bucket_rounds(per_bucket + [final], self.streams, self.buckets, groups, rank)
