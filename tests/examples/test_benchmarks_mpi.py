"""The MPI benchmarks that write no result files run briefly, so that a
change of the protocol's behaviour cannot leave one failing unseen (the
figures themselves come from full runs, docs/history/results.md)."""

import re

import pytest

from mpi_run import ROOT, run_job, run_mpi

pytestmark = pytest.mark.mpi


def test_waiting_cpu_benchmark_runs():
    # Its majority post asserts that the waiting ranks took exactly the round a computing rank started.
    res = run_mpi(str(ROOT / "benchmarks" / "waiting_cpu.py"), 4, "--blocks", "2", "--compute-s", "0.05",
                  timeout=120, require_reports=False)
    for way in ("asleep", "majority post", "sync post", "bare Allreduce"):
        assert re.search(rf"^\s*{way}\s+\d+\.\d+\s+\d+\.\d+", res.stdout, re.M), res.tail()


def test_balanced_modes_benchmark_runs():
    res = run_mpi(str(ROOT / "benchmarks" / "balanced_modes.py"), 2, "--blocks", "2", "--epochs", "1",
                  "--steps", "20", timeout=120, require_reports=False)
    for method in ("sync", "solo", "majority"):
        assert re.search(rf"^{method}\s+\d", res.stdout, re.M), res.tail()
    assert "balanced.solo:" in res.stdout and "balanced.majority:" in res.stdout, res.tail()


def test_overlap_backward_benchmark_runs():
    res = run_mpi(str(ROOT / "benchmarks" / "overlap_backward.py"), 2, "--width", "64", "--layers", "2",
                  "--bucket-mb", "0.01", "--blocks", "2", "--steps", "3", timeout=120, require_reports=False)
    for method in ("on", "off", "ddp"):
        assert re.search(rf"^{method}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+$", res.stdout, re.M), res.tail()


def test_tensorflow_overlap_backward_benchmark_runs():
    pytest.importorskip("tensorflow")
    res = run_mpi(str(ROOT / "benchmarks" / "overlap_backward_tf.py"), 2, "--width", "64", "--layers", "2",
                  "--bucket-mb", "0.01", "--blocks", "2", "--steps", "3", timeout=180, require_reports=False)
    for method in ("on", "off"):
        assert re.search(rf"^{method}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+$", res.stdout, re.M), res.tail()
    # with overlap the first bucket goes out before the post that ends the step; without, nothing does
    assert re.search(r"^off\s+\d+\.\d+\s+\d+\.\d+\s+0\.0\s", res.stdout, re.M), res.tail()


def test_balanced_steps_benchmark_runs():
    res = run_mpi(str(ROOT / "benchmarks" / "balanced_steps.py"), 2, "--tasks", "lstm,cnn", "--methods",
                  "ddp,sync,solo,local", "--blocks", "2", "--steps", "3", "--length", "4", "--step-ms", "1",
                  timeout=180, require_reports=False)
    for task in ("lstm", "cnn"):
        assert re.search(rf"^{task}: median over blocks", res.stdout, re.M), res.tail()
    for method in ("ddp", "sync", "solo", "local"):
        assert len(re.findall(rf"^{method}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\s+\d+", res.stdout, re.M)) == 2, res.tail()


def test_paper_accuracy_benchmark_runs_and_evaluates_within_epochs(tmp_path):
    import json
    import os
    import sys

    out = "paper_accuracy_test_smoke"
    # run_job: the launcher, its mpiexec and every rank in one session, all killed on a timeout
    code, stdout, stderr, timed_out = run_job(
        [sys.executable, str(ROOT / "benchmarks" / "paper_accuracy.py"), "--np", "2", "--tasks", "lstm", "--seeds",
         "1", "--epochs", "1", "--modes", "ddp,solo", "--lstm-train", "64", "--lstm-test", "32", "--eval-every", "2",
         "--timeout", "150", "--out", out], dict(os.environ), 180, cwd=tmp_path)
    assert code == 0 and not timed_out, stdout[-3000:] + stderr[-3000:]
    assert re.search(r"^\| hvd solo \| \d+\.\d ± \d+\.\d", stdout, re.M), stdout[-3000:]
    with open(ROOT / "benchmarks" / "results" / "new" / (out + ".json")) as fh:
        runs = json.load(fh)["runs"]
    for run in runs:
        epochs = [h["epoch"] for h in run["history"]]
        # 64 samples, 2 ranks, batch 8: 4 steps, so one evaluation within the epoch and one at its end
        assert epochs == [0.5, 1], (run["mode"], epochs)
        assert run["replicas_identical"], run["mode"]


def test_piled_rounds_benchmark_runs_with_the_cap_on_and_off(tmp_path):
    import os
    import sys

    code, stdout, stderr, timed_out = run_job(
        [sys.executable, str(ROOT / "benchmarks" / "piled_rounds.py"), "--np", "2", "--modes", "majority", "--seeds",
         "1", "--timeout", "150", "--epochs", "1"], dict(os.environ), 180, cwd=tmp_path)
    assert code == 0 and not timed_out, stdout[-3000:] + stderr[-3000:]
    for cap in ("on", "off"):
        assert re.search(rf"^\| {cap} \| majority \| 0 \| \d+ \| \d+ \| \d+ \| \d+\.\d\d \| \d+\.\d\d \|", stdout,
                         re.M), stdout[-3000:]
