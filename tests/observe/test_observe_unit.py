"""Unit tests: Horovod variables, the new config fields, the slow-rank
heuristic, the stall inspector's rule and the timeline file format."""

import json
import logging
import sys
import types

import numpy as np
import pytest

from hvd_partial.config import Config, load_config
from hvd_partial.config import config_sources
from hvd_partial.core.messages import Start
from hvd_partial.core.rank_stream import Launch
from hvd_partial.core.round_result import RoundResult
from hvd_partial.errors import ConfigError
from hvd_partial.launch.horovod import shared_comm
from hvd_partial.modes import Majority, Solo, Sync
from hvd_partial.observe import attach_observer
from hvd_partial.observe.monitor import Observer, RankStatus, status_interval
from hvd_partial.observe.report import format_report, holding_back
from hvd_partial.observe.stall import StalledRankError
from hvd_partial.observe.timeline import Timeline, load_events, merge, rank_files, rank_path


# ===== configuration =============================================================

def test_horovod_variables_map_to_fields_and_hvd_partial_wins():
    env = {"HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "0.5",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90",
           "HOROVOD_LOG_LEVEL": "trace", "HOROVOD_RANK": "3", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
           "HVD_PARTIAL_STALL_WARNING_SECONDS": "45"}
    cfg = load_config(environ=env)
    assert cfg.timeline_filename == "/tmp/t.json" and cfg.fusion_threshold_bytes == 1048576
    assert cfg.idle_poll_ms == 0.5 and cfg.stall_shutdown_seconds == 90 and cfg.log_level == "DEBUG"
    assert cfg.stall_warning_seconds == 45  # HVD_PARTIAL_* over HOROVOD_*
    assert load_config({"stall_warning_seconds": 50}, environ=env).stall_warning_seconds == 50  # argument wins
    sources = config_sources(env)
    assert sources["timeline_filename"] == "HOROVOD_TIMELINE"
    assert sources["stall_warning_seconds"] == "HVD_PARTIAL_STALL_WARNING_SECONDS"
    assert sources["max_staleness"] == "default"


def test_horovod_stall_check_disable_turns_the_inspector_off():
    cfg = load_config(environ={"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5"})
    assert cfg.stall_warning_seconds == 0 and cfg.stall_shutdown_seconds == 0
    assert load_config(environ={"HOROVOD_STALL_CHECK_DISABLE": "0"}).stall_warning_seconds == 60


@pytest.mark.parametrize("env, message", [
    ({"HOROVOD_FUSION_THRESHOLD": "64MB"}, "HOROVOD_FUSION_THRESHOLD='64MB' is not a valid int"),
    ({"HOROVOD_LOG_LEVEL": "loud"}, "HOROVOD_LOG_LEVEL='loud' is not a Horovod log level"),
    ({"HOROVOD_STALL_CHECK_TIME_SECONDS": "-1"}, "HOROVOD_STALL_CHECK_TIME_SECONDS='-1' must be >= 0"),
    ({"HOROVOD_STALL_CHECK_DISABLE": "maybe"}, "HOROVOD_STALL_CHECK_DISABLE='maybe' is not a valid bool"),
    ({"HVD_PARTIAL_MODE": "eager"}, r"mode must be 'sync', 'solo' or 'majority', got 'eager' \(HVD_PARTIAL_MODE\)"),
    ({"HVD_PARTIAL_QUORUM": "2"}, r"quorum applies to mode='majority' only"),
    ({"HVD_PARTIAL_MODE": "majority", "HVD_PARTIAL_QUORUM": "-1"}, r"quorum must be >= 0"),
    ({"HVD_PARTIAL_REPORT_SECONDS": "-5"}, r"report_seconds must be a number >= 0"),
    ({"HVD_PARTIAL_STALL_WARNING_SECONDS": "10", "HVD_PARTIAL_STALL_SHUTDOWN_SECONDS": "5"},
     "stall_shutdown_seconds must be 0 or >= stall_warning_seconds"),
    ({"HVD_PARTIAL_TIMELINE": "x"}, "unknown environment variable HVD_PARTIAL_TIMELINE"),
])
def test_malformed_settings_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(environ=env)


def test_default_mode_comes_from_the_config():
    assert Config().default_mode() == Solo()
    assert Config(mode="sync").default_mode() == Sync()
    assert Config(mode="Majority", seed=4, quorum=2).default_mode() == Majority(seed=4, quorum=2)
    assert Config(mode="majority").default_mode() == Majority(seed=0, quorum=None)


# ===== Horovod communicator ========================================================

def _fake_horovod(monkeypatch, **attrs):
    module = types.ModuleType("horovod.torch")
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, "horovod.torch", module)
    return module


def test_shared_comm_without_or_with_uninitialized_horovod_is_the_default(monkeypatch):
    monkeypatch.delitem(sys.modules, "horovod.torch", raising=False)
    assert shared_comm(None) is None
    marker = object()
    assert shared_comm(marker) is marker
    _fake_horovod(monkeypatch, is_initialized=lambda: False)
    assert shared_comm(None) is None


def test_shared_comm_refuses_horovod_on_gloo(monkeypatch):
    _fake_horovod(monkeypatch, is_initialized=lambda: True, mpi_enabled=lambda: False, rank=lambda: 0,
                  size=lambda: 1)
    with pytest.raises(ConfigError, match="without MPI"):
        shared_comm(None)


# ===== slow-rank heuristic and report ============================================

def test_holding_back_names_the_rank_that_computes_longest():
    rank, reason = holding_back([0.02, 0.021, 0.12, 0.019], lags=[0, 0, 3, 0])
    assert rank == 2 and "0.120 s per post" in reason and "3 rounds behind" in reason
    assert holding_back([0.02, 0.021, 0.022, 0.019])[0] is None  # balanced
    assert holding_back([0.0001, 0.0001, 0.0009])[0] is None  # under 1 ms apart: noise
    assert holding_back([None, 0.5, None]) == (None, "not enough data yet")


def test_format_report_lists_every_rank():
    snap = {"grads": {"rounds": 10, "fresh": [5, 1], "stale": [4, 8], "initiated": [9, 1], "lag": [0, 2],
                      "max_staleness_seen": 3, "posts_by_rank": [10, 3], "wait_mean_s_by_rank": [0.01, None],
                      "wait_p95_s_by_rank": [0.02, None], "compute_mean_s_by_rank": [0.01, 0.05],
                      "holding_back": 1, "holding_back_reason": "computes 0.050 s per post"}}
    text = format_report(snap, {"grads": 12.5}, {1: 61.0})
    assert "stream 'grads': 10 rounds, 12.5 rounds/s" in text and "holding others back: rank 1" in text
    assert "rank 1 has stalled for 61.0 s" in text
    assert len([line for line in text.splitlines() if line.startswith("     ")]) == 2


# ===== stall inspector rule ==========================================================

class _FakeEngine:
    """The engine's surface the observer may use, and nothing more."""

    def __init__(self, rank=0, size=3, **config):
        self.config = Config(**config)
        self.rank, self.size = rank, size
        self.busy = False
        self.sent = []
        self.failure = None

    def tell(self, dest, tag, message):
        self.sent.append((dest, tag, message))

    def fail(self, error, notify=False):
        self.failure = error


def _observer(**config):
    engine = _FakeEngine(**config)
    obs = attach_observer(engine)
    assert isinstance(obs, Observer)
    return engine, obs


def _statuses(obs, now, busy, idle):
    for j in range(len(busy)):
        obs.record(RankStatus(j, idle[j], busy[j], "post 'g'", {}), now)


def test_stall_rule_warns_only_when_others_wait_and_fails_past_shutdown(caplog):
    engine, obs = _observer(stall_warning_seconds=1.0, stall_shutdown_seconds=3.0)
    interval = obs.interval
    assert interval == 0.25
    t = 1000.0
    # Everybody idle for a long time (an evaluation phase): nobody is stalled.
    for step in range(20):
        now = t + step * interval
        _statuses(obs, now, busy=[False, False, False], idle=[now - t + 50] * 3)
        obs.inspect(now)
    assert obs.stalled == {} and engine.failure is None
    # Ranks 0 and 2 now wait in a post; rank 1 calls nothing.
    t2 = t + 20 * interval
    with caplog.at_level(logging.WARNING, logger="hvd_partial.stall"):
        for step in range(1, 10):
            now = t2 + step * interval
            _statuses(obs, now, busy=[True, False, True], idle=[now - t2, now - t + 50, now - t2])
            obs.inspect(now)
    assert set(obs.stalled) == {1} and 1.0 <= obs.stalled[1] <= 2.5
    assert any("rank 1 has called no hvd_partial function" in r.message for r in caplog.records)
    # The waiting posts are held by the staleness bound for the absent rank: the message says so.
    assert any("the posts of rank(s) 0, 2 wait for it under the staleness bound" in r.message
               and "rank 1 is absent, not waiting in a collective" in r.message for r in caplog.records)
    assert engine.failure is None
    for step in range(10, 20):
        now = t2 + step * interval
        _statuses(obs, now, busy=[True, False, True], idle=[now - t2, now - t + 50, now - t2])
        obs.inspect(now)
    assert isinstance(engine.failure, StalledRankError) and engine.failure.rank == 1
    assert "stall_shutdown_seconds=3" in str(engine.failure)


def test_every_rank_waiting_without_progress_is_reported_as_a_deadlock(caplog):
    engine, obs = _observer(stall_warning_seconds=1.0, stall_shutdown_seconds=2.0)
    t = 10.0
    with caplog.at_level(logging.WARNING, logger="hvd_partial.stall"):
        for step in range(1, 4):  # 0.75 s: not yet
            now = t + step * 0.25
            _statuses(obs, now, busy=[True, True, True], idle=[now - t] * 3)
            obs.inspect(now)
        assert not caplog.records
        for step in range(4, 7):
            now = t + step * 0.25
            _statuses(obs, now, busy=[True, True, True], idle=[now - t] * 3)
            obs.inspect(now)
    assert any("deadlock: every rank has waited" in r.message and "rank 2 in post 'g'" in r.message
               for r in caplog.records)
    assert engine.failure is None
    for step in range(7, 10):
        now = t + step * 0.25
        _statuses(obs, now, busy=[True, True, True], idle=[now - t] * 3)
        obs.inspect(now)
    assert isinstance(engine.failure, StalledRankError) and engine.failure.rank is None


def test_stall_clock_restarts_when_the_rank_calls_again():
    engine, obs = _observer(stall_warning_seconds=1.0)
    t = 50.0
    for step in range(1, 40):
        now = t + step * 0.25
        idle1 = (step % 3) * 0.25  # rank 1 posts every 0.75 s: slow but not stalled
        _statuses(obs, now, busy=[True, False, False], idle=[0.0, idle1, 0.0])
        obs.inspect(now)
        assert obs.stalled == {}


def test_a_status_that_stopped_coming_is_left_to_liveness():
    # Rank 2's statuses stopped coming (it, or the rank that relays them up the
    # tree, was stopped): its last one, long idle, must not make it "stalled".
    engine, obs = _observer(stall_warning_seconds=1.0, stall_shutdown_seconds=2.0)
    t = 50.0
    obs.peers[2] = (RankStatus(2, 0.0, False, "post 'g'", {}), t)
    for step in range(1, 40):
        now = t + step * 0.25
        for j in (0, 1):
            obs.peers[j] = (RankStatus(j, now - t, True, "post 'g'", {}), now)
        obs.inspect(now)
        assert obs.stalled == {} and engine.failure is None


def test_observer_is_off_when_every_feature_is_off(tmp_path):
    engine = _FakeEngine(stall_warning_seconds=0, report_seconds=0)
    assert attach_observer(engine) is None
    assert status_interval(engine.config) is None
    assert status_interval(Config(stall_warning_seconds=60)) == 5.0
    engine = _FakeEngine(stall_warning_seconds=0, report_seconds=0, timeline_filename=str(tmp_path / "t.json"))
    obs = attach_observer(engine)
    assert obs is not None and obs.timeline is not None and obs.interval is None
    obs.close()


@pytest.mark.parametrize("size", [2, 3, 4, 13, 32])
def test_statuses_reach_every_rank_over_the_tree_with_log_p_messages_per_rank(monkeypatch, size):
    """The statuses go up the binomial tree to rank 0 and its picture back
    down: every rank learns every rank's status, fresh within about three
    status periods, and no rank sends more than 2 ceil(log2 P) + 1 bundles
    per period (P - 1 each when every rank told every other)."""
    from collections import Counter

    from hvd_partial.core.activation import max_hops
    from hvd_partial.observe import monitor

    clock = [500.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: clock[0])
    engines = [_FakeEngine(rank=r, size=size, stall_warning_seconds=1.0) for r in range(size)]
    observers = [attach_observer(e) for e in engines]
    interval = observers[0].interval
    sent = Counter()
    seconds = 10.0
    for step in range(int(seconds / 0.01)):
        clock[0] += 0.01
        for source, engine in enumerate(engines):  # delivered within the step (1 ms, say)
            outbox, engine.sent = engine.sent, []
            for dest, tag, bundle in outbox:
                sent[source] += 1
                observers[dest].on_status(source, bundle)
        for obs in observers:
            obs.tick()
    periods = seconds / interval
    for rank in range(size):
        assert sent[rank] <= (2 * max_hops(size) + 1) * (periods + 1), (rank, sent[rank], periods)
        peers = observers[rank].peers
        assert sorted(peers) == list(range(size)), (rank, sorted(peers))
        oldest = max(clock[0] - made for _, made in peers.values())
        assert oldest <= 3 * interval + 0.01 * (2 * max_hops(size) + 2), (rank, oldest)
    assert all(e.failure is None for e in engines)  # all idle: nobody is stalled


# ===== timeline ======================================================================

class _Handle:
    def __init__(self, posted_at, finished_at):
        self.posted_at, self.finished_at = posted_at, finished_at


def test_timeline_writes_valid_chrome_trace_and_survives_a_crash(tmp_path):
    import time

    filename = str(tmp_path / "tl.json")
    assert rank_path(filename, 3) == str(tmp_path / "tl.rank3.json")
    assert rank_path(str(tmp_path / "r{rank}.trace"), 2) == str(tmp_path / "r2.trace")
    tl = Timeline(filename, rank=0, size=2)
    t0 = time.perf_counter()
    tl.post("g", t0)
    start = Start(stream=0, round=0, initiator=0)
    launch = Launch(0, [np.zeros(4, np.float32)], start)
    tl.launched("g", launch)
    tl.reduced("g", launch, RoundResult(0, 0, [0, 1], {0: 0, 1: 2}))
    tl.finished("g", "post", _Handle(t0, time.perf_counter()), [0])
    tl.close()
    events = json.load(open(tl.path))
    by_name = {e["name"]: e for e in events}
    assert by_name["reduction"]["args"]["max_staleness"] == 2 and by_name["reduction"]["args"]["bytes"] == 16
    assert by_name["activation"]["ph"] == "X" and by_name["take"]["ph"] == "i"
    assert by_name["wait"]["dur"] >= by_name["reduction"]["dur"]
    # Rank 1 "crashes": its file is flushed but never closed.
    tl1 = Timeline(filename, rank=1, size=2)
    tl1.post("g", time.perf_counter())
    tl1.flush()
    with pytest.raises(json.JSONDecodeError):
        json.load(open(tl1.path))
    assert [e["name"] for e in load_events(tl1.path)][-1] == "post"
    assert rank_files(filename) == [rank_path(filename, 0), rank_path(filename, 1)]
    out, files, count = merge(filename)
    assert (files, count) == (2, len(events) + len(load_events(tl1.path)))
    assert {e["pid"] for e in json.load(open(out))["traceEvents"]} == {0, 1}
    with pytest.raises(FileNotFoundError, match="no per-rank timeline files"):
        merge(str(tmp_path / "none.json"))
