"""benchmarks/stale_replay.py (no MPI): a short run's rounds and staleness are what
the protocol's rules give, and the rules differ only where the replay says they do."""

import json
import subprocess
import sys

from mpi_run import ROOT


def test_stale_replay_runs_the_protocol_rounds_under_each_rule(tmp_path):
    out = tmp_path / "replay"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stale_replay.py"), "--seeds", "1", "--modes",
                          "solo", "--epochs", "2", "--draws", "1", "--rules", "as-run,fresh,damped",
                          "--out", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = {row["rule"]: row for row in json.loads(out.with_suffix(".json").read_text())}
    assert set(rows) == {"sync", "as-run", "fresh", "damped"}, rows.keys()
    steps = 2 * (1437 // (4 * 16))  # 2 epochs of 22 steps per rank
    sync = rows["sync"]
    assert sync["rounds"] == steps and sync["posts_per_round"] == 4 and sync["staleness_max"] == 0, sync
    solo = rows["as-run"]
    # one rank in four sleeps 100 ms more each step: solo rounds go on without it, its posts arrive late
    assert solo["rounds"] > steps and solo["posts_per_round"] < 4 and solo["staleness_max"] >= 2, solo
    assert all(rows[rule]["rounds"] == solo["rounds"] for rule in ("fresh", "damped"))  # the same rounds
    assert rows["as-run"]["curve"] != rows["fresh"]["curve"], "fresh gradients changed nothing"
    for row in rows.values():
        assert 0.0 <= row["final"] <= 1.0 and len(row["curve"]) == 2 + 2 * 5, row["curve"]
