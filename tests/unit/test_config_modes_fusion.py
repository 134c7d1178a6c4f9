import mmap
import subprocess
import sys

import numpy as np
import pytest

from hvd_partial.config import Config, load_config
from hvd_partial.core.buffer_pool import MAPPED_MIN_BYTES, BufferPool, allocate
from hvd_partial.core.fusion import Layout
from hvd_partial.errors import ConfigError
from hvd_partial.modes import Majority, designated_initiator, mode_from_name


def test_env_sets_fields_and_explicit_arguments_win():
    env = {"HVD_PARTIAL_MAX_STALENESS": "3", "HVD_PARTIAL_FAILURE_TIMEOUT_SECONDS": "2.5",
           "HVD_PARTIAL_ABORT_ON_EXCEPTION": "false", "OTHER": "x"}
    cfg = load_config({"max_staleness": 5}, environ=env)
    assert cfg.max_staleness == 5
    assert cfg.failure_timeout_seconds == 2.5
    assert cfg.abort_on_exception is False
    assert load_config(environ={}) == Config()


@pytest.mark.parametrize("env, word", [
    ({"HVD_PARTIAL_MAX_STALENES": "3"}, "HVD_PARTIAL_MAX_STALENES"),
    ({"HVD_PARTIAL_MAX_STALENESS": "three"}, "HVD_PARTIAL_MAX_STALENESS='three'"),
    ({"HVD_PARTIAL_MAX_STALENESS": "-1"}, "max_staleness must be >= 0"),
    ({"HVD_PARTIAL_LOG_LEVEL": "LOUD"}, "log_level"),
])
def test_bad_environment_values_name_the_variable(env, word):
    with pytest.raises(ConfigError, match=word.replace("(", r"\(")):
        load_config(environ=env)


def test_unknown_keyword_is_rejected():
    with pytest.raises(ConfigError, match="unknown configuration field 'max_stale'"):
        load_config({"max_stale": 1}, environ={})


def test_the_removed_control_plane_setting_is_an_error_that_says_so():
    with pytest.raises(ConfigError, match="HVD_PARTIAL_CONTROL_PLANE: the option is gone"):
        load_config(environ={"HVD_PARTIAL_CONTROL_PLANE": "decentral"})
    with pytest.raises(ConfigError, match="control_plane=: the option is gone"):
        load_config({"control_plane": "central"}, environ={})
    assert not hasattr(Config(), "control_plane")


def test_designated_initiator_is_identical_across_processes_and_varies():
    code = ("from hvd_partial.modes import designated_initiator as d;"
            "print([d(7, 'grads', r, 5) for r in range(50)])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    mine = [designated_initiator(7, "grads", r, 5) for r in range(50)]
    assert other.strip() == str(mine)  # not Python's salted hash()
    assert len(set(mine)) == 5
    assert mine != [designated_initiator(8, "grads", r, 5) for r in range(50)]


def test_mode_names_and_validation():
    assert mode_from_name("Majority", seed=2, quorum=3) == Majority(seed=2, quorum=3)
    with pytest.raises(ConfigError, match="unknown mode 'eager'"):
        mode_from_name("eager")
    with pytest.raises(ConfigError, match="quorum must be a positive int"):
        Majority(quorum=0)
    assert issubclass(ConfigError, ValueError)  # what code written against ValueError still catches


def test_layout_packs_by_dtype_and_unpacks_views():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.float64),
              np.arange(4, dtype=np.float32)]
    layout = Layout.of(arrays)
    buffers, owned = layout.pack(arrays)
    assert [b.dtype.name for b in buffers] == ["float32", "float64"]
    assert [b.size for b in buffers] == [10, 3]
    assert owned == [True, False]  # float32 concatenated (a copy), the lone float64 a view
    assert np.shares_memory(buffers[1], arrays[1])
    back = layout.unpack(buffers)
    for a, b in zip(arrays, back):
        assert np.array_equal(a, b) and a.shape == b.shape
        assert b.base is not None  # a view, not a copy
    single, owned_single = Layout.of(arrays[:1]).pack(arrays[:1])
    assert owned_single == [False] and np.shares_memory(single[0], arrays[0])


def test_buffer_pool_reuses_only_released_buffers():
    pool = BufferPool(keep=2)
    (first,) = pool.take([(8, "float32")])
    view = first.reshape(2, 4)
    del first
    (second,) = pool.take([(8, "float32")])
    assert second is not view.base  # still referenced through the view
    del view
    (third,) = pool.take([(8, "float32")])
    assert pool.reused == 1 and third is not second


def _mapped(array) -> bool:
    base = array.base
    return isinstance(getattr(base, "obj", base), mmap.mmap)


def test_large_buffers_are_mapped_zeroed_and_pooled_like_small_ones():
    n = MAPPED_MIN_BYTES // 4  # float32: exactly the threshold
    big = allocate(n, "float32", zero=True)
    assert _mapped(big) and big.dtype == np.float32 and big.size == n
    assert big.flags.writeable and not big.any()
    small = allocate(n - 1, "float32", zero=True)
    assert not _mapped(small) and not small.any()
    assert _mapped(Layout.of([np.zeros(n, np.float32)]).zeros()[0])

    pool = BufferPool(keep=2)
    first = pool.take_one(n, "float32")
    first[:] = 1.0
    view = first[10:20].reshape(2, 5)  # what unpack hands out as a result
    del first
    second = pool.take_one(n, "float32")
    assert second is not view.base  # a view of a mapped buffer still holds it
    del view
    third = pool.take_one(n, "float32")
    assert pool.reused == 1 and third is not second and third[0] == 1.0


def test_poll_settings_are_validated():
    with pytest.raises(ConfigError, match="reduce_poll_us must be >= 0, or -1"):
        load_config(environ={"HVD_PARTIAL_REDUCE_POLL_US": "-2"})
    assert load_config(environ={"HVD_PARTIAL_REDUCE_POLL_US": "-1"}).reduce_poll_us == -1.0
    assert load_config(environ={"HVD_PARTIAL_REDUCE_POLL_US": "0"}).reduce_poll_us == 0.0
    with pytest.raises(ConfigError, match="doorbell_poll_ms must be > 0"):
        load_config(environ={"HVD_PARTIAL_DOORBELL_POLL_MS": "0"})
    assert load_config({"doorbell_poll_ms": 5}, environ={"HVD_PARTIAL_DOORBELL_POLL_MS": "50"}).doorbell_poll_ms == 5


def test_fusion_threshold_bounds_every_fused_buffer():
    rng = np.random.default_rng(3)
    arrays = [rng.random(n).astype(d) for n, d in
              [(300, np.float32), (300, np.float32), (50, np.float64), (2000, np.float32), (300, np.float32),
               (10, np.float64), (200, np.float64)]]
    limit = 2048  # bytes: two 300-float32 arrays (2400 B) do not fit together
    layout = Layout.of(arrays, bucket_bytes=limit)
    buffers, owned = layout.pack(arrays)
    sizes = layout.sizes()
    assert len(buffers) == len(layout.groups) > 2
    for (dtype, idx), buf, mine in zip(layout.groups, buffers, owned):
        assert buf.dtype == np.dtype(dtype)
        assert buf.nbytes <= limit or len(idx) == 1, (idx, buf.nbytes)  # a larger array travels alone
        assert buf.size == sum(sizes[i] for i in idx) and mine == (len(idx) > 1)
    # Every array is in exactly one bucket, in order within its dtype.
    placed = sorted(i for _, idx in layout.groups for i in idx)
    assert placed == list(range(len(arrays)))
    for back, a in zip(layout.unpack(buffers), arrays):
        assert back.shape == a.shape and np.array_equal(back, a)
    # Unbounded: one buffer per dtype, as before; the bound is part of what ranks must agree on.
    assert len(Layout.of(arrays).groups) == 2
    assert Layout.of(arrays).described != layout.described


def test_groups_are_fused_apart_and_checked():
    """A stream's groups (the torch optimizer's num_groups/groups): no buffer mixes two groups,
    each group is cut per dtype and by the threshold, and the groups are part of the signature."""
    arrays = [np.arange(n, dtype=d) for n, d in [(4, np.float32), (3, np.float32), (5, np.float64), (2, np.float32),
                                                 (6, np.float32)]]
    plain = Layout.of(arrays)
    grouped = Layout.of(arrays, partition=[[3, 0], [1, 2, 4]])
    assert [idx for _, idx in plain.groups] == [(0, 1, 3, 4), (2,)]
    assert [idx for _, idx in grouped.groups] == [(3, 0), (1, 4), (2,)]  # per group, per dtype
    assert [idx for _, idx in Layout.of(arrays, 20, [[0, 1, 3, 4], [2]]).groups] == [(0,), (1, 3), (4,), (2,)]
    buffers, _ = grouped.pack(arrays)
    for back, a in zip(grouped.unpack(buffers), arrays):
        assert np.array_equal(back, a)
    assert grouped.described != plain.described
    assert grouped.described != Layout.of(arrays, partition=[[0, 3], [1, 2, 4]]).described
    for bad, message in [([[0, 1], [1, 2, 3, 4]], "array 1 is in two groups"),
                         ([[0, 1], [2, 3]], r"arrays \[4\] are in no group"),
                         ([[0, 1, 2, 3, 4], []], "a group is empty"),
                         ([[0, 1, 2, 3, 4, 5]], "index 5 is not one of the 5 arrays"),
                         ([["a"]], "lists of array indices")]:
        with pytest.raises(ConfigError, match=message):
            Layout.of(arrays, partition=bad)


def test_fusion_threshold_comes_from_horovod_variable_and_cli(monkeypatch):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "4096")
    assert load_config().fusion_threshold_bytes == 4096
    monkeypatch.setenv("HVD_PARTIAL_FUSION_THRESHOLD_BYTES", "8192")
    assert load_config().fusion_threshold_bytes == 8192  # our own variable wins over Horovod's
    assert load_config({"fusion_threshold_bytes": 1024}).fusion_threshold_bytes == 1024  # explicit wins
