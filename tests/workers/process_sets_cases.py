"""Worker: process sets (hvd.add_process_set and process_set=) under mpiexec, numpy and torch.

Usage: process_sets_cases.py CASE   (numpy, misuse, torch)
Every rank reports a dict the test asserts on.
"""

from __future__ import annotations

import sys

import numpy as np

import hvd_partial as hvd
from workers.support import phase, report


def _sets():
    n = hvd.size()
    evens = hvd.add_process_set(range(0, n, 2))
    odds = hvd.add_process_set(range(1, n, 2))
    return evens, odds, (evens if hvd.rank() % 2 == 0 else odds)


def numpy_case() -> dict:
    r, n = hvd.rank(), hvd.size()
    phase("add")
    evens, odds, mine = _sets()
    out = {"ids": [evens.process_set_id, odds.process_set_id], "str": str(mine), "set_rank": mine.rank(),
           "set_size": mine.size(), "included": [evens.included(), odds.included()]}
    phase("collectives on the set")
    out["allreduce"] = hvd.allreduce(np.array([r, 1], np.int64), op=hvd.Sum, process_set=mine).tolist()
    out["average"] = hvd.allreduce(np.array([float(r)]), process_set=mine).tolist()
    out["grouped"] = [a.tolist() for a in hvd.grouped_allreduce([np.ones(2) * r, np.array([1])], op=hvd.Sum,
                                                                 process_set=mine)]
    out["allgather"] = hvd.allgather(np.full((r + 1, 2), r), process_set=mine)[:, 0].tolist()
    out["broadcast"] = hvd.broadcast(np.array([r * 10]), root_rank=mine.ranks[-1], process_set=mine).tolist()
    out["object"] = hvd.broadcast_object({"from": r}, root_rank=mine.ranks[-1], process_set=mine)
    out["objects"] = hvd.allgather_object(r, process_set=mine)
    recv, splits = hvd.alltoall(np.arange(mine.size()) + 100 * r, splits=[1] * mine.size(), process_set=mine)
    out["alltoall"] = [recv.tolist(), splits.tolist()]
    out["reducescatter"] = hvd.reducescatter(np.ones((2 * mine.size() + 1, 2)), op=hvd.Sum,
                                             process_set=mine).tolist()
    hvd.barrier(process_set=mine)
    phase("same name on both sets, async, then the global set")
    handle = hvd.allreduce_async(np.array([1.0]), name="same", op=hvd.Sum, process_set=mine)
    out["global"] = hvd.allreduce(np.array([1.0]), name="same", op=hvd.Sum).tolist()
    out["same_name"] = hvd.synchronize(handle).tolist()
    phase("remove and add again")
    out["removed"] = [hvd.remove_process_set(odds), hvd.remove_process_set(evens),
                      hvd.remove_process_set(hvd.global_process_set)]
    out["cleared"] = [evens.process_set_id, odds.process_set_id]
    again = hvd.add_process_set(hvd.ProcessSet([0, n - 1]))
    out["again"] = [again.process_set_id, again.ranks]
    if again.included():
        out["again_sum"] = hvd.allreduce(np.array([1]), op=hvd.Sum, process_set=again).tolist()
    hvd.remove_process_set(again)
    out["after"] = hvd.allreduce(np.array([1]), op=hvd.Sum).tolist()
    return out


def _error(call) -> list | None:
    try:
        call()
    except hvd.HvdPartialError as err:
        return [type(err).__name__, str(err), isinstance(err, ValueError)]
    return None


def misuse() -> dict:
    r, n = hvd.rank(), hvd.size()
    evens, odds, mine = _sets()
    other = odds if mine is evens else evens
    out = {}
    phase("a rank outside the set")
    out["outside"] = _error(lambda: hvd.allreduce(np.ones(1), process_set=other))
    out["root_outside"] = _error(lambda: hvd.broadcast(np.ones(1), root_rank=other.ranks[0], process_set=mine))
    out["never_added"] = _error(lambda: hvd.allgather(np.ones(1), process_set=hvd.ProcessSet([r])))
    phase("duplicates (collective: every rank raises)")
    out["duplicate"] = _error(lambda: hvd.add_process_set(list(reversed(evens.ranks))))
    out["duplicate_global"] = _error(lambda: hvd.add_process_set(range(n)))
    out["out_of_range"] = _error(lambda: hvd.add_process_set([0, n]))
    out["comm"] = _error(lambda: hvd.ProcessSet(object()))
    phase("mismatched ranks under one add")
    out["mismatch"] = _error(lambda: hvd.add_process_set([r]))
    hvd.remove_process_set(odds)
    out["removed_use"] = _error(lambda: hvd.allreduce(np.ones(1), process_set=odds))
    out["after"] = hvd.allreduce(np.array([1]), op=hvd.Sum).tolist()
    return out


def torch_case() -> dict:
    import torch

    import hvd_partial.torch as hvdt

    r = hvdt.rank()
    evens, odds, mine = _sets()
    out = {}
    phase("torch collectives on the set")
    out["allreduce"] = hvdt.allreduce(torch.tensor([float(r)]), op=hvdt.Sum, process_set=mine).tolist()
    t = torch.full((r + 1, 2), float(r), requires_grad=True)
    gathered = hvdt.allgather(t, process_set=mine)
    (gathered * gathered.shape[0]).sum().backward()
    out["allgather_rows"] = gathered.shape[0]
    out["allgather_grad"] = t.grad[:, 0].tolist()
    sparse = torch.zeros(4, 2)
    sparse[r % 4] = 1.0
    out["sparse"] = hvdt.synchronize(hvdt.sparse_allreduce_async(sparse.to_sparse(), "sp", hvdt.Sum,
                                                                 process_set=mine)).to_dense().sum(1).tolist()
    phase("optimizer on the evens")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    opt = hvdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), process_set=evens)
    model.weight.data.fill_(0.0)
    model(torch.full((1, 3), float(r + 1))).sum().backward()
    opt.step()
    out["weight"] = model.weight.data[0].tolist()
    phase("a solo optimizer on the evens: the odds' is local")
    solo = hvdt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), process_set=evens,
                                     mode=hvdt.Solo())
    out["solo_type"] = type(solo).__name__
    return out


def init_sets() -> dict:
    """hvd.init(process_sets=[...]) adds the listed sets, in order."""
    sets = [hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 2])]
    hvd.init(process_sets=sets)
    out = {"ids": [s.process_set_id for s in sets], "global": hvd.global_process_set.ranks}
    out["sums"] = [hvd.allreduce(np.array([hvd.rank()]), op=hvd.Sum, process_set=s).tolist() if s.included() else None
                   for s in sets]
    return out


CASES = {"numpy": numpy_case, "misuse": misuse, "torch": torch_case, "init_sets": init_sets}


if __name__ == "__main__":
    if sys.argv[1] != "init_sets":
        hvd.init()
    report(CASES[sys.argv[1]]())
    hvd.shutdown()
