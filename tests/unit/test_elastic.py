"""hvd.elastic without MPI: the states' save/restore/commit/sync, run's
restore/reset/skip_sync paths and the reset limit against fake collectives,
and the epoch dealing across size changes."""

from __future__ import annotations

import pytest

import hvd_partial
from hvd_partial.core.world import World
from hvd_partial.elastic import (ElasticCollectives, EpochShards, HorovodInternalError, HostsUpdatedInterrupt,
                                 ObjectState, ResetLimitError, run)
from hvd_partial.elastic.collectives import CHECK_NAME


class FakeWorld:
    """One rank's view: a world that a test shrinks, helper calls recorded,
    and helper calls refused after a change until it is acknowledged."""

    def __init__(self, size: int = 4):
        self.current = World.initial(0, size)
        self.acknowledged = 0
        self.calls: list[str] = []
        self.acks = 0

    def shrink(self, failed=(1,)):
        self.current = self.current.shrunk(tuple(failed), 0)

    def _helper(self, name):
        self.calls.append(name)
        if self.acknowledged != self.current.version:
            raise HorovodInternalError(f"{name}: the world changed")

    def broadcast(self, obj, name):
        self._helper(name)
        return obj

    def allgather(self, obj, name):
        self._helper(name)
        return [obj]

    def acknowledge(self):
        self.acks += 1
        self.acknowledged = self.current.version

    def collectives(self) -> ElasticCollectives:
        return ElasticCollectives(self.broadcast, self.allgather, lambda: self.current, self.acknowledge)


@pytest.fixture
def world():
    return FakeWorld()


# ----- ObjectState ---------------------------------------------------------------------------

def test_object_state_restores_the_last_commit_as_copies(world):
    state = ObjectState(world.collectives(), epoch=0, history=[1])
    state.history.append(2)
    state.epoch = 3
    state.commit()
    state.history.append(99)
    state.epoch = 7
    state.restore()
    assert (state.epoch, state.history) == (3, [1, 2])
    state.history.append(5)  # the restored value is a copy: a second restore gives the saved one again
    state.restore()
    assert state.history == [1, 2]


def test_object_state_sync_broadcasts_the_saved_values(world):
    sent = []
    collectives = ElasticCollectives(lambda obj, name: sent.append((name, obj)) or {"epoch": 5},
                                     world.allgather, lambda: world.current, world.acknowledge)
    state = ObjectState(collectives, epoch=1)
    state.sync()
    assert state.epoch == 5 and sent == [("hvd_partial.elastic.sync.objects", {"epoch": 1})]


def test_commit_saves_then_checks_with_one_helper_collective(world):
    state = ObjectState(world.collectives(), batch=0)
    state.batch = 4
    state.commit()
    assert world.calls == [CHECK_NAME]
    state.batch = 6
    state.restore()
    assert state.batch == 4


def test_a_change_fails_the_check_on_every_survivor_until_acknowledged(world):
    state = ObjectState(world.collectives(), batch=0)
    state.commit()
    world.shrink()
    state.batch = 8
    with pytest.raises(HorovodInternalError):
        state.commit()
    state.restore()  # the save ran before the check: nothing committed is lost
    assert state.batch == 8


def test_a_change_acknowledged_elsewhere_raises_hosts_updated_with_skip_sync(world):
    state = ObjectState(world.collectives(), batch=0)
    state.check_host_updates()
    world.shrink()
    world.acknowledge()
    with pytest.raises(HostsUpdatedInterrupt) as caught:
        state.check_host_updates()
    assert caught.value.skip_sync is True
    state.check_host_updates()  # seen now: no second interrupt


def test_a_grow_at_the_check_raises_hosts_updated_that_syncs_the_new_ranks(world):
    grows = []

    def grow():
        if world.current.size < 4:
            world.current = world.current.grown(4 - world.current.size)
            world.acknowledge()
            grows.append(world.current)
            return 1
        return 0

    collectives = ElasticCollectives(world.broadcast, world.allgather, lambda: world.current, world.acknowledge, grow)
    state = ObjectState(collectives, batch=0)
    state.commit()  # the world has max_np ranks: nothing to grow
    world.shrink()
    world.acknowledge()
    with pytest.raises(HostsUpdatedInterrupt) as caught:
        state.commit()  # below: the grow starts one rank, whose sync needs the state
    assert caught.value.skip_sync is False and "1 rank(s) joined" in str(caught.value)
    assert grows[0].size == 4 and grows[0].joined == (4,) and grows[0].members == (0, 2, 3, 4)
    state.commit()  # grown and seen: no second interrupt


def test_a_grown_world_numbers_new_ranks_after_every_earlier_one():
    world = World.initial(2, 4).shrunk((1,), 1).grown(2)
    assert (world.version, world.rank, world.size, world.original_rank) == (2, 1, 5, 2)
    assert world.members == (0, 2, 3, 4, 5) and world.lost == (1,) and world.joined == (4, 5)
    new = world.as_rank(4)
    assert (new.rank, new.original_rank, new.members) == (4, 5, world.members)
    assert world.shrunk((0,), 0).joined == (4, 5)  # a later failure keeps who joined


# ----- run -----------------------------------------------------------------------------------

class RecordingState(ObjectState):
    def __init__(self, world, **kwargs):
        super().__init__(world.collectives(), **kwargs)
        self.events: list[str] = []

    def sync(self):
        self.events.append("sync")
        super().sync()

    def restore(self):
        self.events.append("restore")
        super().restore()

    def reset(self):
        self.events.append("reset")


def test_run_syncs_once_and_returns_the_result(world):
    state = RecordingState(world, n=0)
    assert run(lambda s, x, y=0: (x, y))(state, 1, y=2) == (1, 2)
    assert state.events == ["sync"]


def test_internal_error_restores_resets_then_syncs_again(world):
    state = RecordingState(world, step=0)
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append(world.acknowledged)])

    @run
    def train(s):
        s.events.append("train")
        if s.step == 0:
            s.step = 1
            s.commit()                   # committed: step 1
            s.step = 2
            world.shrink()               # a rank dies
            s.collectives.broadcast_object("metric", "loss")  # a helper call: HorovodInternalError
        return s.step

    assert train(state) == 1
    assert state.events == ["sync", "train", "restore", "reset", "sync", "train"]
    assert world.acks == 1 and callbacks == [1]


def test_hosts_updated_resets_without_restore_and_skips_the_sync_when_told(world):
    state = RecordingState(world, step=0)
    raised = []

    @run
    def train(s):
        s.events.append("train")
        if not raised:
            raised.append(True)
            s.step = 3
            raise HostsUpdatedInterrupt(skip_sync=True)
        return s.step

    assert train(state) == 3
    assert state.events == ["sync", "train", "reset", "train"]
    assert world.acks == 1


def test_hosts_updated_without_skip_sync_syncs_again(world):
    state = RecordingState(world, step=0)
    raised = []

    @run
    def train(s):
        s.events.append("train")
        if not raised:
            raised.append(True)
            raise HostsUpdatedInterrupt(skip_sync=False)

    train(state)
    assert state.events == ["sync", "train", "reset", "sync", "train"]


def test_other_errors_propagate_without_reset(world):
    state = RecordingState(world)

    @run
    def train(s):
        raise hvd_partial.MismatchError("ranks disagree")

    with pytest.raises(hvd_partial.MismatchError):
        train(state)
    assert state.events == ["sync"] and world.acks == 0


def test_reset_limit(world, monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_RESET_LIMIT", "2")
    state = RecordingState(world)

    @run
    def train(s):
        raise HostsUpdatedInterrupt(skip_sync=True)

    with pytest.raises(ResetLimitError, match="HOROVOD_ELASTIC_RESET_LIMIT=2"):
        train(state)
    assert world.acks == 2
    monkeypatch.setenv("HOROVOD_ELASTIC_RESET_LIMIT", "-1")
    with pytest.raises(hvd_partial.ConfigError):
        train(state)


def test_default_collectives_read_hvd_partial_world_at_each_call(monkeypatch):
    worlds = iter([World.initial(0, 2), World.initial(0, 2).shrunk((1,), 0)])
    monkeypatch.setattr(hvd_partial, "world", lambda: next(worlds))
    collectives = ElasticCollectives.default()
    assert [collectives.world().version, collectives.world().version] == [0, 1]


# ----- the epoch dealing ---------------------------------------------------------------------

def _deal(shards, size):
    return {rank: shards.shard(rank, size) for rank in range(size)}


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("length, batch, batches_before", [(40, 3, 2), (37, 2, 3), (12, 1, 1), (9, 4, 0)])
def test_size_4_to_3_mid_epoch_neither_repeats_nor_skips(shuffle, length, batch, batches_before):
    shards = EpochShards(length, shuffle=shuffle, seed=7)
    shards.start_epoch(2)
    taken = []
    before = _deal(shards, 4)
    for shard in before.values():  # every rank runs batches_before batches, then rank 1 dies
        done = shard[:batch * batches_before]
        shards.mark_processed(done)
        taken += done
    assert len(set(taken)) == len(taken)
    after = _deal(shards, 3)
    assert len({len(s) for s in after.values()}) == 1  # as many batches on every rank
    for shard in after.values():
        taken += shard
    counts = {i: taken.count(i) for i in range(length)}
    assert min(counts.values()) == 1  # nothing skipped
    assert sum(counts.values()) - length == shards.padding(3) < 3  # repeated: only the padding


def test_ranks_at_different_batches_are_merged_by_index():
    shards = [EpochShards(20, shuffle=True, seed=1) for _ in range(4)]
    for s in shards:
        s.start_epoch(1)
    for rank, s in enumerate(shards):  # solo: rank r has done r + 1 batches of 2
        s.mark_processed(s.shard(rank, 4)[:2 * (rank + 1)])
    reports = [(s.epoch, sorted(s.processed)) for s in shards]
    survivors = [shards[0], shards[2], shards[3]]
    for s in survivors:
        s.merge(reports)
    rest = sorted(i for rank in range(3) for i in survivors[rank].shard(rank, 3))
    done = sorted(i for _, p in reports for i in p)
    assert sorted(set(rest) | set(done)) == list(range(20)) and not set(rest) & set(done)


def test_epoch_order_depends_on_seed_and_epoch_and_merge_takes_rank0s_epoch():
    a, b = EpochShards(50, seed=3), EpochShards(50, seed=3)
    assert a.order() == b.order()
    b.start_epoch(1)
    assert a.order() != b.order() and sorted(b.order()) == list(range(50))
    a.merge([(4, [1, 2]), (4, [3]), (3, [9])])
    assert a.epoch == 4 and a.processed == {1, 2, 3}
    restored = EpochShards(50, seed=3)
    restored.load_state_dict(a.state_dict())
    assert (restored.epoch, restored.processed) == (4, {1, 2, 3})
