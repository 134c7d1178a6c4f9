"""Slow-rank report, timeline, stall inspector and Horovod communicator
sharing, in real multi-process runs."""

import re

import pytest

from mpi_run import run_mpi

from hvd_partial.observe.timeline import load_events, merge, rank_files

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("mode", ["solo", "sync"])
def test_report_names_the_slow_rank_on_every_rank_and_rank0_logs_it(mode):
    nprocs = 4
    res = run_mpi("observe_cases.py", nprocs, "report", mode, timeout=90)
    reports = [res.results[r]["stats"] for r in range(nprocs)]
    for rank, s in enumerate(reports):
        assert s["holding_back"] == 2, (rank, s["holding_back_reason"], s["compute_mean_s_by_rank"])
        assert "computes" in s["holding_back_reason"]
        assert all(p is not None and p > 0 for p in s["posts_by_rank"]), s
        assert all(w is not None for w in s["wait_p95_s_by_rank"])
        assert s["rounds_per_second"] > 0 and s["elapsed_s"] > 1.0
        assert s["rounds"] == reports[0]["rounds"] or mode == "solo"  # snapshots may differ by a round in solo
    compute = reports[0]["compute_mean_s_by_rank"]
    assert compute[2] > 0.035 and max(compute[j] for j in (0, 1, 3)) < 0.03
    waits = reports[0]["wait_mean_s_by_rank"]
    if mode == "sync":  # the slow rank waits least: the others wait for it
        assert waits[2] < min(waits[j] for j in (0, 1, 3))
    else:  # solo: the fast ranks post about 5x as often
        posts = reports[0]["posts_by_rank"]
        assert min(posts[j] for j in (0, 1, 3)) > 2 * posts[2]
    logged = [block for block in res.stderr.split("INFO hvd_partial.report: ")[1:]]
    assert len(logged) >= 3, res.tail()  # every 0.4 s over 2 s, plus the final one
    naming = [block for block in logged if "holding others back: rank 2" in block]
    assert "holding others back: rank 2" in logged[-1] and len(naming) >= len(logged) // 2, logged
    assert re.search(r"\d+ rounds, [\d.]+ rounds/s", logged[-1])


def test_timeline_has_the_spans_of_every_rank_and_round(tmp_path):
    nprocs = 3
    filename = str(tmp_path / "tl.json")
    res = run_mpi("observe_cases.py", nprocs, "timeline", timeout=90,
                  env={"HVD_PARTIAL_TIMELINE_FILENAME": filename})
    files = rank_files(filename)
    assert [f.rsplit(".rank", 1)[1] for f in files] == ["0.json", "1.json", "2.json"]
    reductions = {}
    for rank, path in enumerate(files):
        events = load_events(path)  # valid JSON: closed at shutdown
        assert {e["pid"] for e in events} == {rank}
        names = {e["name"] for e in events}
        assert {"process_name", "thread_name", "post", "activation", "reduction", "take", "wait",
                "flush"} <= names
        for e in events:
            if e["ph"] == "X":
                assert e["dur"] >= 0 and e["ts"] > 0 and "stream" in e["args"]
        posts = [e for e in events if e["name"] == "post"]
        waits = [e for e in events if e["name"] == "wait"]
        assert len(posts) == len(waits) == 24  # 12 steps x 2 streams
        taken = res.results[rank]["taken"]
        for stream in ("solo", "sync"):
            rounds = [e["args"]["round"] for e in events if e["name"] == "reduction" and e["cat"] == stream]
            assert rounds == list(range(len(rounds))), (rank, stream, rounds)  # in order, none missing
            assert set(taken[stream]) <= set(rounds)
            took = [r for e in events if e["name"] == "take" and e["cat"] == stream for r in e["args"]["rounds"]]
            assert took == taken[stream]
            reductions.setdefault(stream, []).append(
                [(e["args"]["round"], e["args"]["initiator"], str(e["args"]["contributors"]))
                 for e in events if e["name"] == "reduction" and e["cat"] == stream])
    for stream, per_rank in reductions.items():
        assert per_rank[0] == per_rank[1] == per_rank[2], stream  # same rounds, same facts on every rank
    out, count, total = merge(filename)
    assert count == nprocs and total == sum(len(load_events(f)) for f in files)


def test_stall_warning_names_the_rank_on_every_rank_and_not_an_idle_phase():
    res = run_mpi("observe_cases.py", 3, "stall_warn", timeout=90)
    warnings = [line for line in res.stderr.splitlines() if "hvd_partial.stall" in line]
    assert warnings, res.tail()
    warners = {int(re.search(r"stall: rank (\d+): stall:", line).group(1)) for line in warnings}
    assert warners == {0, 1, 2}, warnings
    assert all("stall: rank 1 has called no hvd_partial function" in line for line in warnings), warnings
    # Nothing was said while every rank was idle (before the stall phase).
    before = res.stderr.split("MARK stall-start")[0]
    assert "hvd_partial.stall" not in before, before


def test_stall_shutdown_fails_every_rank_naming_the_stalled_one():
    res = run_mpi("observe_cases.py", 3, "stall_shutdown", timeout=90, expect_success=False, keep_survivors=True)
    assert sorted(res.results) == [0, 1, 2], res.tail()
    for rank, rep in res.results.items():
        assert rep["type"] == "StalledRankError" and rep["rank"] == 1 and rep["is_rank_failed"], rep
        assert "stall_shutdown_seconds=1.5" in rep["error"]
        if rank != 1:
            assert 1.4 < rep["seconds"] < 4.0, rep  # shutdown time plus a status period or two


def test_deadlock_of_every_rank_is_reported_with_each_ranks_call():
    res = run_mpi("observe_cases.py", 3, "deadlock", timeout=90, expect_success=False, keep_survivors=True)
    assert sorted(res.results) == [0, 1, 2], res.tail()
    for rank, rep in res.results.items():
        assert rep["rank"] is None and "deadlock: every rank has waited" in rep["error"], rep
        assert "rank 0 in barrier" in rep["error"] and "rank 1 in post 'grads'" in rep["error"]
        assert 1.4 < rep["seconds"] < 4.0
    assert "hvd_partial.stall: rank 0: deadlock" in res.stderr  # warned before failing


def test_init_shares_an_initialized_horovod_communicator():
    res = run_mpi("observe_cases.py", 2, "horovod_share", "0", timeout=60)
    for rank, rep in res.results.items():
        assert rep["error"] is None and rep["rank"] == rep["horovod_rank"] == rank
    res = run_mpi("observe_cases.py", 2, "horovod_share", "1", timeout=60)
    for rank, rep in res.results.items():
        assert "horovod.torch is initialized as rank" in rep["error"] and "init(comm=...)" in rep["error"]
