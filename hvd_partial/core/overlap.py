"""What the frameworks' overlap of reductions with the backward pass share
(``overlap_backward``; PyTorch's ``torch/backward_buckets.py``, TensorFlow's
``tensorflow/overlap.py``): the cap on buckets, and joining a step's rounds
of every bucket into the rounds of the stream they came from.

A stream posted in buckets puts bucket k on a sync stream of its own and the
last bucket on the stream itself, whose post may carry more arrays (the
optimizer's scalars). Every bucket is posted once per step, so every bucket's
stream takes the same rounds.

Example::

    rounds = join_bucket_rounds(per_bucket, streams, positions=[[2, 3], [1], [0]], size=4, rank="0")
"""

from __future__ import annotations

from ..errors import HvdPartialError
from .round_result import RoundResult

# Each bucket is a stream with its own communicator, and MPI caps communicators
# (MPICH about 2,000 per process): beyond this many buckets, buckets merge.
MAX_OVERLAP_BUCKETS = 64


def cap_buckets(buckets: list[list]) -> list[list]:
    """``buckets`` (in posting order) with the last ones merged into one until at most
    ``MAX_OVERLAP_BUCKETS`` remain."""
    while len(buckets) > MAX_OVERLAP_BUCKETS:
        last = buckets.pop()
        buckets[-1].extend(last)
    return buckets


def join_bucket_rounds(per_bucket: list[list[RoundResult]], streams: list[str], positions: list[list[int]],
                       size: int, rank: str) -> list[RoundResult]:
    """The last bucket's rounds (``per_bucket[-1]``), each holding ``size``
    arrays: bucket k's arrays at ``positions[k]``, then what the last bucket's
    post carried beyond its own arrays. Raises ``HvdPartialError`` (naming
    ``rank`` and the two streams) where two buckets took different rounds."""
    final = per_bucket[-1]
    for stream, results in zip(streams, per_bucket):
        if [r.round for r in results] != [r.round for r in final]:
            raise HvdPartialError(
                f"rank {rank}: overlap streams {stream!r} and {streams[-1]!r} took rounds "
                f"{[r.round for r in results]} and {[r.round for r in final]}; every bucket of a step must "
                "take the same rounds")
    carried_from = len(positions[-1])
    for n, result in enumerate(final):
        if result.arrays is None or not result.has_data:
            continue
        arrays: list = [None] * size
        for places, results in zip(positions, per_bucket):
            for place, array in zip(places, results[n].arrays):
                arrays[place] = array
        result.arrays = arrays + result.arrays[carried_from:]
    return final
