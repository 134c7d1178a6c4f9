"""Process sets in hvd_partial.torch (4 ranks: evens and odds): tensor
collectives and their gradients among a set, sparse allreduce, and
DistributedOptimizer(process_set=) (Horovod's synchronous optimizer among the
set; ranks outside it step alone; a solo one on the set's members only)."""

from __future__ import annotations

import pytest

from mpi_run import run_mpi

pytestmark = pytest.mark.mpi


def _members(n, r):
    return [m for m in range(n) if m % 2 == r % 2]


def test_torch_collectives_and_optimizer_on_a_set():
    pytest.importorskip("torch")
    result = run_mpi("process_sets_cases.py", 4, "torch", timeout=180)
    for r, rep in result.results.items():
        ms = _members(4, r)
        assert rep["allreduce"] == [float(sum(ms))]
        assert rep["allgather_rows"] == sum(m + 1 for m in ms)
        assert rep["allgather_grad"] == [float(rep["allgather_rows"])] * (r + 1)  # averaged over the set
        expected = [0.0] * 4
        for m in ms:
            expected[m % 4] += 2.0
        assert rep["sparse"] == expected
        # SGD lr 1 from zero: the evens' average gradient (x = rank + 1), the odds' own
        x = sum(m + 1 for m in (0, 2)) / 2 if r % 2 == 0 else r + 1
        assert rep["weight"] == [-float(x)] * 3
        assert rep["solo_type"] == ("DistributedOptimizer" if r % 2 == 0 else "SetOptimizer")
