"""Pure parts of the negotiated collectives: mismatch texts, Horovod's integer
average and reducescatter split, and the refusal of Adasum (no MPI)."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_partial.collectives.execute import scatter_rows
from hvd_partial.collectives.reduce_ops import check_op, finish_reduction
from hvd_partial.collectives.requests import differences
from hvd_partial.errors import UnsupportedInputError
from hvd_partial.modes import ReduceOp


def test_differences_names_the_first_differing_field_and_groups_ranks():
    sig = lambda shape, dtype: (("collective", "allreduce"), ("dtype", dtype), ("shape", shape))  # noqa: E731
    text = differences("x", "allreduce", {0: sig((3,), "<f4"), 1: sig((4,), "<f8"), 2: sig((3,), "<f4")})
    assert text.startswith("allreduce 'x': ranks disagree on dtype (ranks 0, 2: '<f4'; rank 1: '<f8')")
    assert differences("x", "allreduce", {0: sig((3,), "<f4"), 1: sig((3,), "<f4")}) is None
    # A field one rank lacks (another collective's signature) is a difference too.
    other = (("collective", "broadcast"), ("dtype", "<f4"), ("shape", (3,)), ("root", 0))
    assert "disagree on collective" in differences("x", "allreduce", {0: sig((3,), "<f4"), 1: other})


def test_integer_average_truncates_toward_zero():
    summed = np.array([5, -5, 7, -7, 0], dtype=np.int32)
    out = finish_reduction(summed.copy(), ReduceOp.AVERAGE, 2, 1.0, np.dtype(np.int32))
    assert out.tolist() == [2, -2, 3, -3, 0] and out.dtype == np.int32
    out = finish_reduction(np.array([3.0, 1.0]), ReduceOp.AVERAGE, 2, 1.0, np.dtype(np.float64))
    assert out.tolist() == [1.5, 0.5]
    widened = finish_reduction(np.array([1.5], dtype=np.float32), ReduceOp.SUM, 2, 2.0, np.dtype(np.float16))
    assert widened.dtype == np.float16 and widened.tolist() == [3.0]


def test_reducescatter_rows_follow_horovods_split():
    assert scatter_rows(5, 2) == [3, 2]
    assert scatter_rows(7, 3) == [3, 2, 2]
    assert scatter_rows(2, 3) == [1, 1, 0]


def test_adasum_is_refused_naming_the_alternative():
    with pytest.raises(UnsupportedInputError, match="use op=Average"):
        check_op(ReduceOp.ADASUM, "allreduce(x)")
    with pytest.raises(TypeError):
        check_op("sum", "allreduce(x)")


def test_process_set_objects_follow_horovod_before_they_are_added():
    import hvd_partial as hvd
    from hvd_partial.collectives.negotiator import _Entry, _on_set

    ps = hvd.ProcessSet(range(3, 0, -1))
    assert ps.ranks == [1, 2, 3] and ps.process_set_id is None and ps.size() is None and ps.rank() is None
    assert str(ps) == "ProcessSet(process_set_id=None, ranks=[1, 2, 3], mpi_comm=None)"
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.remove_process_set(ps) is False and hvd.remove_process_set(hvd.global_process_set) is False
    with pytest.raises(hvd.ProcessSetError, match="ints"):
        hvd.ProcessSet([0, True])
    with pytest.raises(hvd.NotSupportedError, match="list of ranks"):
        hvd.ProcessSet(7)
    # A set's collective reads its entry numbered by set rank, a broadcast's root too.
    entry = _Entry("b", "broadcast", 1)
    entry.sigs = {1: (("root", 3), ("dtype", "<f8")), 3: (("root", 3), ("dtype", "<f8"))}
    entry.infos = {1: 5, 3: 6}
    local = _on_set(entry, [1, 3])
    assert local.sigs == {0: (("root", 1), ("dtype", "<f8")), 1: (("root", 1), ("dtype", "<f8"))}
    assert local.infos == {0: 5, 1: 6}
