"""hvd.elastic for PyTorch without MPI: TorchState's save/restore/commit and
what it hands to each part, and ElasticSampler's dealing with an injected
placement (sizes 4 then 3 mid-epoch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hvd_partial.torch as hvd  # noqa: E402
from hvd_partial.core.world import World  # noqa: E402
from hvd_partial.elastic import ElasticCollectives  # noqa: E402


def _collectives(calls):
    def broadcast(obj, name):
        calls.append(name)
        return obj

    def allgather(obj, name):
        calls.append(name)
        return [obj]

    return ElasticCollectives(broadcast, allgather, lambda: World.initial(0, 1), lambda: None)


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer


def _train_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()


def test_names_of_horovod_torch_elastic_exist():
    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
                 "HostsUpdatedInterrupt"):
        assert hasattr(hvd.elastic, name), name
    assert issubclass(hvd.elastic.HorovodInternalError, hvd.HorovodInternalError)
    assert hvd.HostsUpdatedInterrupt is hvd.elastic.HostsUpdatedInterrupt


def test_torch_state_restores_model_optimizer_and_values_of_the_last_commit():
    calls = []
    model, optimizer = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, optimizer, collectives=_collectives(calls), epoch=0)
    _train_step(model, optimizer)
    state.epoch = 1
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    _train_step(model, optimizer)
    state.epoch = 2
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert state.epoch == 1 and state.model is model and state.optimizer is optimizer


def test_torch_state_flushes_an_optimizer_with_flush_before_saving_and_syncing(monkeypatch):
    calls = []
    model, optimizer = _model_and_optimizer()
    flushes = []
    optimizer.flush = lambda: flushes.append(len(calls))  # as DistributedOptimizer.flush
    monkeypatch.setattr("hvd_partial.torch.elastic.broadcast_parameters", lambda sd, root_rank: calls.append("params"))
    monkeypatch.setattr("hvd_partial.torch.elastic.broadcast_optimizer_state",
                        lambda opt, root_rank: calls.append("optimizer"))
    sampler = hvd.elastic.ElasticSampler(range(8), placement=lambda: (0, 1))
    state = hvd.elastic.TorchState(model, optimizer, collectives=_collectives(calls), sampler=sampler, epoch=0)
    state.save()
    assert flushes == [0]
    state.sync()
    assert flushes == [0, 0]  # before any broadcast
    assert calls == ["params", "optimizer", "hvd_partial.elastic.sync.sampler", "hvd_partial.elastic.sync.objects"]


def test_assigning_a_new_model_saves_it():
    model, optimizer = _model_and_optimizer()
    state = hvd.elastic.TorchState(model, optimizer, collectives=_collectives([]))
    other = torch.nn.Linear(3, 2)
    state.model = other
    saved = other.weight.detach().clone()
    with torch.no_grad():
        other.weight.add_(1.0)
    state.restore()
    assert torch.equal(other.weight, saved)
    with pytest.raises(TypeError):
        state.model = 3


def test_sampler_deals_the_epoch_again_when_the_size_drops_from_4_to_3():
    data = list(range(50))
    placement = {"size": 4}
    samplers = [hvd.elastic.ElasticSampler(data, shuffle=True, seed=5,
                                           placement=lambda r=r: (min(r, placement["size"] - 1), placement["size"]))
                for r in range(4)]
    for s in samplers:
        s.set_epoch(3)
    seen = []
    batch = 4
    for s in samplers:  # two batches on every rank
        for b in range(2):
            seen += s.get_indices(b, batch)
            s.record_batch(b, batch)
    survivors = [samplers[0], samplers[2], samplers[3]]  # rank 1 died after its commit
    reports = [(s.epoch, sorted(s.processed_indices)) for s in samplers]
    placement["size"] = 3
    for new_rank, s in enumerate(survivors):
        s._placement = lambda r=new_rank: (r, 3)
        s.sync(ElasticCollectives(None, lambda obj, name: reports, None, None))
    lengths = {len(s) for s in survivors}
    assert len(lengths) == 1
    for s in survivors:
        seen += list(s)
    counts = {i: seen.count(i) for i in data}
    assert min(counts.values()) == 1 and sum(counts.values()) - len(data) < 3


def test_sampler_state_dict_and_epochs():
    sampler = hvd.elastic.ElasticSampler(range(10), shuffle=False, placement=lambda: (1, 2))
    assert list(sampler) == [1, 3, 5, 7, 9] and len(sampler) == 5
    sampler.record_batch(0, 2)
    assert sampler.processed_indices == {1, 3}
    copy = hvd.elastic.ElasticSampler(range(10), shuffle=False, placement=lambda: (0, 2))
    copy.load_state_dict(sampler.state_dict())
    assert list(copy) == [0, 4, 6, 8] and list(copy.remaining_indices) == [0, 2, 4, 5, 6, 7, 8, 9]
    copy.set_epoch(1)
    assert copy.epoch == 1 and not copy.processed_indices and len(copy) == 5
