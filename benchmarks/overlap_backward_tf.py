"""Balanced step time of a Keras ``DistributedOptimizer`` in sync mode with and
without ``overlap_backward``, on an MLP whose gradient is large enough to cut
into several buckets (the TensorFlow side of ``overlap_backward.py``).

One launch trains both methods in blocks, in an order rotated from block to
block, each under a fresh ``hvd.init(overlap_backward=...)``. Each block times
``--steps`` compiled train steps (``model.train_on_batch``; no injected delay)
after ``--warmup`` untimed ones. The block's figures are the slowest rank's
medians of: the step; the time this rank spent in the post that returns the
step's reduced gradients (with overlap, the post of the last bucket, which
waits for every bucket: the reductions not hidden behind the backward pass);
and how long before that post the first bucket went out (0 without overlap).
Printed: each method's medians over the blocks, and the median over the
blocks of each method's step time over ``off``'s in the same block.

    mpiexec -n 2 python benchmarks/overlap_backward_tf.py
    mpiexec -n 4 python benchmarks/overlap_backward_tf.py --width 512 --bucket-mb 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_partial.keras as hvd  # noqa: E402
from overlap_blocks import print_medians, run_blocks  # noqa: E402

METHODS = ["on", "off"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--width", type=int, default=1024, help="hidden width (each layer width^2 float32)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=4.0, help="fusion_threshold_bytes")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="TensorFlow's intra-op threads per rank")
    return p.parse_args(argv)


def make_model(args) -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.width,))]
    layers += [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


class PostClock:
    """Times the exchange's posts from the numpy side (benchmark instrumentation)."""

    def __init__(self, exchange):
        self.first_bucket = None
        self.samples: list[tuple[float, float]] = []  # (in the final post, first bucket before it)
        post_bucket, post_and_take = exchange._post_bucket, exchange._post_and_take

        def timed_bucket(k, *flats):
            if k == 0:
                self.first_bucket = time.perf_counter()
            return post_bucket(k, *flats)

        def timed_final(*inputs):
            start = time.perf_counter()
            out = post_and_take(*inputs)
            lead = 0.0 if self.first_bucket is None else start - self.first_bucket
            self.samples.append((time.perf_counter() - start, lead))
            self.first_bucket = None
            return out

        exchange._post_bucket, exchange._post_and_take = timed_bucket, timed_final  # before the step is traced


def block(method: str, args, rank: int) -> tuple[float, float, float]:
    """This rank's median step time, time in the final post, and first bucket's lead (seconds)."""
    model = make_model(args)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), mode=hvd.Sync(),
                                   name=f"overlap-{method}")
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    clock = PostClock(opt.exchange)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(args.batch, args.width)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    steps = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        if step >= args.warmup:
            steps.append(time.perf_counter() - start)
    timed = clock.samples[args.warmup:]
    return (statistics.median(steps), statistics.median(s[0] for s in timed), statistics.median(s[1] for s in timed))


def main(argv=None):
    args = parse_args(argv)
    methods = args.methods.split(",")
    threshold = int(args.bucket_mb * 1024 * 1024)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    hvd.shutdown()
    per_block = run_blocks(hvd, methods, args.blocks, threshold, lambda method: block(method, args, rank))
    if rank != 0:
        return
    params = make_model(args).count_params()
    print(f"\n{size} ranks, {params * 4 / 2**20:.1f} MiB of float32 gradients, buckets of {args.bucket_mb} MiB, "
          f"batch {args.batch}, {args.blocks} blocks of {args.steps} steps")
    print_medians(per_block, methods, ["step ms", "in final post ms", "first bucket before it ms"])


if __name__ == "__main__":
    main()
