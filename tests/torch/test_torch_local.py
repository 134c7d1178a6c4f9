"""The torch adapter's pieces that need no MPI: staging, compression and the
optimizer wrapper's argument checks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hvd_partial  # noqa: E402
import hvd_partial.torch as hvd  # noqa: E402
from hvd_partial.torch.tensors import HostStaging, upload_slice, wire_dtype  # noqa: E402


def test_horovod_names_are_exported():
    for name in ["init", "shutdown", "rank", "size", "local_rank", "local_size", "DistributedOptimizer",
                 "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
                 "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "synchronize", "poll",
                 "broadcast", "broadcast_", "Compression", "Sync", "Solo", "Majority", "Average", "Sum"]:
        assert hasattr(hvd, name), name
    assert hvd.Compression.none is not hvd.Compression.fp16


def test_cpu_tensors_are_staged_without_copy():
    grads = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64)]
    arrays = HostStaging().to_host(grads)
    for g, a in zip(grads, arrays):
        assert np.shares_memory(a, g.numpy())
        assert a.flags.c_contiguous


def test_cpu_tensors_staged_during_backward_are_ready_at_once():
    grads = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64)]
    arrays, copied = HostStaging().to_host_async(grads)
    assert copied.query()  # nothing was queued: the bucket is posted from the same hook call
    copied.synchronize()
    for g, a in zip(grads, arrays):
        assert np.shares_memory(a, g.numpy())


def test_non_contiguous_and_bfloat16_are_converted():
    t = torch.randn(4, 6).t()  # a transposed view
    b = torch.randn(3).to(torch.bfloat16)
    a_t, a_b = HostStaging().to_host([t, b])
    assert a_t.flags.c_contiguous and np.array_equal(a_t, t.contiguous().numpy())
    assert a_b.dtype == np.float32 and np.array_equal(a_b, b.float().numpy())
    (back,) = HostStaging.from_host([a_b], [(torch.device("cpu"), torch.bfloat16, (3,))])
    assert back.dtype == torch.bfloat16 and torch.equal(back, b)


def test_results_come_back_as_views_of_the_result_buffer():
    fused = np.arange(10, dtype=np.float32)
    views = [fused[:6].reshape(2, 3), fused[6:]]
    tensors = HostStaging.from_host(views, [("cpu", torch.float32, (2, 3)), ("cpu", torch.float32, (4,))])
    assert [tuple(t.shape) for t in tensors] == [(2, 3), (4,)]
    fused[0] = 42.0  # zero-copy: the tensor sees the buffer
    assert tensors[0][0, 0].item() == 42.0


def test_device_upload_slices_the_fused_buffer_once():
    fused = np.arange(10, dtype=np.float64)
    uploads = {}
    a = upload_slice(fused[2:5], torch.device("cpu"), uploads)
    b = upload_slice(fused[5:10].reshape(5), torch.device("cpu"), uploads)
    assert a.tolist() == [2.0, 3.0, 4.0] and b.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert len(uploads) == 1


def test_wire_dtype_rejects_complex_with_the_tensor_name():
    assert wire_dtype(torch.bfloat16) == torch.float32
    assert wire_dtype(torch.float16) == torch.float16
    with pytest.raises(hvd.UnsupportedInputError, match="fc.weight.*complex64"):
        wire_dtype(torch.complex64, "fc.weight")


def test_fp16_compression_round_trip():
    t = torch.tensor([1.0 / 3.0, 2.5], dtype=torch.float64)
    wire, ctx = hvd.Compression.fp16.compress(t)
    assert wire.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(wire, ctx)
    assert back.dtype == torch.float64
    assert torch.allclose(back, t, atol=1e-3) and not torch.equal(back, t)
    ints = torch.tensor([1, 2])
    assert hvd.Compression.fp16.compress(ints)[0] is ints
    same, ctx = hvd.Compression.none.compress(t)
    assert same is t and hvd.Compression.none.decompress(same, ctx) is t


def test_optimizer_argument_checks():
    model = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hvd.DistributedOptimizer(model)
    with pytest.raises(hvd.UnsupportedInputError, match="LBFGS"):
        hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(hvd.ConfigError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(hvd.ConfigError, match="max_staleness"):
        hvd.DistributedOptimizer(sgd, max_staleness=-1)
    with pytest.raises(TypeError, match="mode"):
        hvd.DistributedOptimizer(sgd, mode="solo")
    with pytest.raises(ValueError, match="twice"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("w", model.weight), ("w", model.bias)])
    with pytest.raises(ValueError, match="1 of the optimizer's 2 parameters"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("w", model.weight)])
    wrapped = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), name="local")
    with pytest.raises(TypeError, match="already"):
        hvd.DistributedOptimizer(wrapped)
    assert wrapped.optimizer is sgd and wrapped.param_groups is sgd.param_groups
    assert wrapped.rounds == 0 and wrapped.name == "local" and isinstance(wrapped.mode, hvd.Solo)
    assert wrapped.flush() == []  # nothing was posted: no collective needed
    wrapped.close()


def test_state_dict_round_trip_keeps_the_round_counter():
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), name="sd")
    sd = opt.state_dict()
    assert sd["hvd_partial"]["rounds"] == 0 and sd["hvd_partial"]["flushed"]
    sd["hvd_partial"]["rounds"] = 41
    other = hvd.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.5), name="sd2")
    other.load_state_dict(sd)
    assert other.rounds == 41 and other.param_groups[0]["lr"] == 0.1
    plain = torch.optim.SGD(model.parameters(), lr=0.3)
    plain.load_state_dict(opt.state_dict())  # a plain optimizer ignores the extra key
    assert plain.param_groups[0]["lr"] == 0.1


def test_collectives_before_init_raise():
    if hvd_partial.is_initialized():
        pytest.skip("hvd_partial is initialized in this process")
    with pytest.raises(hvd.NotInitializedError):
        hvd.allreduce(torch.ones(2))
    with pytest.raises(hvd.NotInitializedError):
        hvd.broadcast_parameters({"w": torch.ones(2)}, root_rank=0)



def test_overlap_buckets_reverse_order_bounded_and_capped():
    from hvd_partial.torch.backward_buckets import MAX_BUCKETS, plan_buckets

    params = [torch.zeros(n) for n in (100, 10, 300, 10, 40)]  # float32: 400, 40, 1200, 40, 160 bytes
    plan = plan_buckets(params, [0, 1, 2, 3, 4], [4] * 5, 256)
    # from the last parameter back; 1200 bytes alone; within a bucket the stream's own order
    assert plan == [[[3, 4]], [[2]], [[1]], [[0]]]  # each bucket one group
    assert plan_buckets(params, [0, 1, 3, 4], [4] * 5, 10_000) == [[[0, 1, 3, 4]]]  # one bucket: no overlap
    many = [torch.zeros(1) for _ in range(1000)]
    capped = plan_buckets(many, list(range(1000)), [4] * 1000, 4)
    assert len(capped) <= MAX_BUCKETS and all(len(b) == 1 for b in capped)
    assert sorted(i for b in capped for g in b for i in g) == list(range(1000))


def test_bucket_plan_from_groups():
    """num_groups/groups are the buckets: the group a backward pass completes first goes first;
    sparse (allgathered) parameters are left out; beyond MAX_BUCKETS groups share a post, fused apart."""
    from hvd_partial.torch.backward_buckets import MAX_BUCKETS, plan_buckets, post_groups

    params = [torch.zeros(n) for n in (100, 10, 300, 10, 40)]
    plan = plan_buckets(params, [0, 1, 2, 3, 4], [4] * 5, 256, groups=[[0, 1], [2, 3, 4]])
    assert plan == [[[2, 3, 4]], [[0, 1]]]  # the threshold plays no part
    assert plan_buckets(params, [0, 2, 3, 4], [4] * 5, 256, groups=[[1], [3, 0], [2, 4]]) == [[[2, 4]], [[0, 3]]]
    many = [torch.zeros(1) for _ in range(100)]
    capped = plan_buckets(many, list(range(100)), [4] * 100, 4, groups=[[i] for i in range(100)])
    assert len(capped) == MAX_BUCKETS and sum(len(b) for b in capped) == 100
    assert [len(b) for b in capped][-1] == 100 - MAX_BUCKETS + 1 and capped[0] == [[99]]
    # a post's groups: positions in the post, the carried scalars in the last group
    assert post_groups([[0, 1], [2, 3, 4]], [0, 1, 2, 3, 4], 1) == [[0, 1], [2, 3, 4, 5]]
    assert post_groups([[3], [0, 1]], [0, 3], 0) == [[1], [0]]
    assert post_groups([[0, 1], [2]], [0, 1], 1) is None  # one group left: the plain post
    assert post_groups(None, [0, 1], 1) is None


def test_groups_arguments_resolved_and_checked():
    """Horovod's semantics: an int splits in order (the first groups one longer), a list names
    groups and every other parameter is a group of its own; frozen ones are left out."""
    from hvd_partial.errors import ConfigError

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    ps = list(model.parameters())  # 6: w0 b0 w1 b1 w2 b2

    def groups_of(**kw):
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters(), mode=hvd.Sync(), **kw)._groups

    assert groups_of() is None and groups_of(num_groups=0) is None and groups_of(groups=0) is None
    assert groups_of(num_groups=4) == [[0, 1], [2, 3], [4], [5]]
    assert groups_of(groups=4) == groups_of(num_groups=4)
    assert groups_of(groups=10) == [[i] for i in range(6)]  # more groups than parameters: the empty ones go
    assert groups_of(groups=[[ps[4], ps[0]], [ps[1]]]) == [[4, 0], [1], [2], [3], [5]]
    ps[2].requires_grad_(False)
    try:
        assert groups_of(groups=[[ps[2], ps[3]]]) == [[2], [0], [1], [3], [4]]  # indices of the 5 left
    finally:
        ps[2].requires_grad_(True)
    with pytest.raises(ConfigError, match=r"'0.weight' is in groups\[0\] and groups\[1\]"):
        groups_of(groups=[[ps[0]], [ps[1], ps[0]]])
    with pytest.raises(ConfigError, match="not a parameter of the wrapped optimizer"):
        groups_of(groups=[[ps[0], torch.nn.Parameter(torch.zeros(3))]])
    with pytest.raises(ConfigError, match="groups are lists of the optimizer's parameters"):
        groups_of(groups=[["0.weight"]])
    with pytest.raises(ConfigError, match="not both"):
        groups_of(num_groups=2, groups=2)
    with pytest.raises(ConfigError, match="groups must be an int >= 0 or a list of lists"):
        groups_of(groups=[ps[0]])
    with pytest.raises(ConfigError, match="num_groups must be an int >= 0"):
        groups_of(num_groups=-1)
