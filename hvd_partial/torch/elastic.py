"""``hvd.elastic`` for PyTorch: Horovod's ``run``, ``TorchState`` and
``ElasticSampler``. With ``hvd.init(elastic=True)`` the survivors of a dead
rank go on in the same processes; ``run`` brings every survivor back to a
state they agree on (docs/elastic.md, "Horovod's elastic API").

Example::

    sampler = hvd.elastic.ElasticSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader):
                ...
                state.optimizer.step()
                state.sampler.record_batch(state.batch, 32)
                if state.batch % 10 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)
            state.batch = 0

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: set_lr(base_lr * hvd.size())])
    train(state)
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ..elastic import (ElasticCollectives, EpochShards, HorovodInternalError, HostsUpdatedInterrupt, ObjectState,
                       State, run)
from .functions import broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer


def _hvd_placement() -> tuple[int, int]:
    import hvd_partial

    return hvd_partial.rank(), hvd_partial.size()


class ElasticSampler(torch.utils.data.Sampler):
    """Deals the samples of the epoch not yet processed by any rank over the
    current ranks (Horovod's sampler, tracking indices, not counts: ranks in
    solo mode need not be at the same batch).

    Record what this rank processed with ``record_batch(batch_idx,
    batch_size)`` (the batch's indices in this rank's current share) or
    ``record_indices``; call ``set_epoch(e)`` when epoch ``e`` begins (at the
    end of the previous one, so that a reset mid-epoch keeps its progress).
    Kept in a :class:`TorchState`, the processed indices of every rank are
    gathered at each ``sync()`` and the rest dealt again over the new size.

    ``placement``: a function returning ``(rank, size)``, read at each
    ``reset()`` (default ``hvd.rank()``, ``hvd.size()``)."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0,
                 placement: Callable[[], tuple[int, int]] | None = None):
        self.dataset = dataset
        self._shards = EpochShards(len(dataset), shuffle, seed)
        self._placement = placement or _hvd_placement
        self.rank, self.num_replicas = 0, 1
        self.indices: list[int] = []
        self.reset()

    @property
    def shuffle(self) -> bool:
        return self._shards.shuffle

    @property
    def seed(self) -> int:
        return self._shards.seed

    @property
    def epoch(self) -> int:
        return self._shards.epoch

    @property
    def processed_indices(self) -> set[int]:
        return self._shards.processed

    @property
    def remaining_indices(self) -> list[int]:
        return self._shards.remaining()

    def set_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: its own order, nothing processed."""
        self._shards.start_epoch(epoch)
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch ``batch_idx`` (of ``batch_size``) of this rank's share processed."""
        start = batch_idx * batch_size
        self.record_indices(self.indices[start:start + batch_size])

    def record_indices(self, indices) -> None:
        """Mark ``indices`` (dataset indices) processed."""
        self._shards.mark_processed(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` of this rank's share."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict:
        return self._shards.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._shards.load_state_dict(state_dict)
        self.reset()

    def sync(self, collectives: ElasticCollectives) -> None:
        """Collective: every rank's processed indices (of rank 0's epoch), then deal the rest again."""
        reports = collectives.allgather_object((self._shards.epoch, sorted(self._shards.processed)),
                                               "hvd_partial.elastic.sync.sampler")
        self._shards.merge(reports)
        self.reset()

    def reset(self) -> None:
        """Deal the remaining indices over the current ranks."""
        self.rank, self.num_replicas = self._placement()
        self.indices = self._shards.shard(self.rank, self.num_replicas)

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return len(self.indices)


# ----- what TorchState keeps, by kind -------------------------------------------------------

def _flush(optimizer) -> None:
    flush = getattr(optimizer, "flush", None)
    if callable(flush):
        flush()  # every rank's parameters and optimizer state bitwise alike before they are copied


class _StateDictPart:
    """A part of the state saved and restored through its ``state_dict``."""

    def __init__(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def reset(self):
        pass


class _ModelPart(_StateDictPart):
    def sync(self, collectives):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerPart(_StateDictPart):
    def flush(self):
        _flush(self.value)

    def sync(self, collectives):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerPart(_StateDictPart):
    def sync(self, collectives):
        self.value.sync(collectives)

    def reset(self):
        self.value.reset()


_PARTS = [(torch.nn.Module, _ModelPart), ((torch.optim.Optimizer, DistributedOptimizer), _OptimizerPart),
          (ElasticSampler, _SamplerPart)]


def _part_for(value):
    for kind, part in _PARTS:
        if isinstance(value, kind):
            return part(value)
    return None


class TorchState(ObjectState):
    """Models, optimizers (plain or :class:`DistributedOptimizer`), elastic
    samplers and plain values, each given as a keyword argument and kept as
    an attribute (assigning a new model or optimizer to it saves it at once).

    - ``save()``: ``flush()`` every optimizer that has one (a collective: every
      rank's replica bitwise alike), then deep copies of each ``state_dict()``
      and of the plain values.
    - ``restore()``: loads the copies back.
    - ``sync()``: flushes, then ``broadcast_parameters`` and
      ``broadcast_optimizer_state`` from rank 0, the samplers' processed
      indices of every rank gathered and the rest dealt again, the plain
      values broadcast from rank 0.

    Example::

        state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    """

    def __init__(self, model=None, optimizer=None, collectives: ElasticCollectives | None = None, **kwargs):
        kwargs = {"model": model, "optimizer": optimizer, **kwargs}  # models first: their broadcasts lead the sync
        parts = {name: _part_for(value) for name, value in kwargs.items()}
        object.__setattr__(self, "_parts", {name: part for name, part in parts.items() if part is not None})
        for name, part in self._parts.items():
            object.__setattr__(self, name, part.value)
        plain = {name: value for name, value in kwargs.items() if name not in self._parts}
        super().__init__(collectives, **plain)

    def __setattr__(self, name, value):
        parts = self.__dict__.get("_parts", {})
        if name in parts:
            part = _part_for(value)
            if part is None:
                raise TypeError(f"TorchState.{name} holds a {type(parts[name].value).__name__}; "
                                f"cannot assign a {type(value).__name__}")
            parts[name] = part  # saved at once, as Horovod's does
        super().__setattr__(name, value)

    def _flush_optimizers(self) -> None:
        for part in self._parts.values():
            if isinstance(part, _OptimizerPart):
                part.flush()

    def save(self) -> None:
        self._flush_optimizers()
        for part in self._parts.values():
            part.save()
        super().save()

    def restore(self) -> None:
        for part in self._parts.values():
            part.restore()
        super().restore()

    def sync(self) -> None:
        self._flush_optimizers()
        for part in self._parts.values():
            part.sync(self._collectives)
        super().sync()

    def reset(self) -> None:
        for part in self._parts.values():
            part.reset()
        super().reset()


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
