"""Which samples of an epoch each rank takes, when ranks come and go mid-epoch.

Pure index logic (no framework, no MPI): the epoch's order is fixed by the
seed and the epoch; the samples already processed by any rank are left out;
the rest are dealt round-robin to the current ranks, padded (from the start
of the remainder, as ``DistributedSampler`` does) so that every rank has as
many. After a size change the remainder is dealt again over the new size, so
no sample of the epoch is skipped and none is taken twice except padding.

Example::

    shards = EpochShards(length=10, shuffle=False, seed=0)
    shards.shard(rank=1, size=4)           # [1, 5, 9]
    shards.mark_processed([0, 1, 2, 3])
    shards.shard(rank=1, size=3)           # [5, 8]: 4..9 over three ranks
"""

from __future__ import annotations

import math
import random


class EpochShards:
    """The epoch number, the processed indices and the dealing of the rest."""

    def __init__(self, length: int, shuffle: bool = True, seed: int = 0):
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed: set[int] = set()

    def order(self) -> list[int]:
        """Every index of the epoch in the epoch's order (the same on every rank)."""
        indices = list(range(self.length))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        return indices

    def remaining(self) -> list[int]:
        """The indices not processed yet, in the epoch's order."""
        return [i for i in self.order() if i not in self.processed]

    def shard(self, rank: int, size: int) -> list[int]:
        """Rank ``rank``'s share of the remaining indices among ``size`` ranks."""
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank {rank} of size {size}: need 0 <= rank < size")
        rest = self.remaining()
        per_rank = math.ceil(len(rest) / size)
        padded = rest + (rest * size)[:per_rank * size - len(rest)]
        return padded[rank::size]

    def padding(self, size: int) -> int:
        """How many indices the dealing among ``size`` ranks repeats."""
        rest = len(self.remaining())
        return math.ceil(rest / size) * size - rest

    def mark_processed(self, indices) -> None:
        self.processed.update(int(i) for i in indices)

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: nothing processed in it yet."""
        self.epoch = epoch
        self.processed = set()

    def merge(self, reports) -> None:
        """Take the union of the processed indices of every rank's
        ``(epoch, processed)`` that is in the first report's epoch (rank 0's),
        and that epoch."""
        epoch = reports[0][0]
        self.epoch = epoch
        self.processed = set().union(*(set(done) for e, done in reports if e == epoch))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed = set(int(i) for i in state_dict["processed_indices"])
