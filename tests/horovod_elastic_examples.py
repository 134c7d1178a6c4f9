"""Run one of Horovod's elastic examples (``HOROVOD_SOURCE``: a Horovod
checkout) under ``hvd-partial-run --elastic``, through
tests/workers/horovod_elastic.py (its import line swapped, stand-ins for
torchvision and the data sets, a rank killed at a named fault point), and
check what every elastic example must end with. Used by
tests/torch/test_horovod_elastic_examples_mpi.py and
tests/tensorflow/test_tf_horovod_elastic_examples_mpi.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from launch.procs import assert_no_leftovers, token
from mpi_run import ROOT, WORKERS, run_job

SOURCE = Path(os.environ.get("HOROVOD_SOURCE", "/nonexistent"))
HARNESS = WORKERS / "horovod_elastic.py"


def example_path(relative: str) -> Path:
    return SOURCE / "examples" / "elastic" / relative


def run_example(relative: str, args: list[str], *, nprocs: int, kill: str, max_np: int | None = None,
                mode: str = "solo", timeout: float = 300, env: dict | None = None) -> tuple[int, str, dict]:
    """``hvd-partial-run --elastic -np N [--max-np M] python horovod_elastic.py EXAMPLE ARGS``
    with ``HVD_TEST_KILL=kill`` (``RANK:POINT:COUNT``) and ``env``; returns (exit status, output,
    member number -> its report). A timeout kills the whole job and fails the test."""
    word = token()
    out_dir = tempfile.mkdtemp(prefix=f"{word}-")
    grow = ["--max-np", str(max_np)] if max_np else []
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", str(nprocs), *grow,
           sys.executable, str(HARNESS), str(example_path(relative)), *args]
    env = dict(os.environ, **(env or {}), HVD_TEST_OUT=out_dir, HVD_TEST_KILL=kill, HVD_PARTIAL_MODE=mode,
               PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0",
               PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}:{ROOT / 'tests' / 'workers'}:{ROOT / 'tests' / 'tensorflow'}")
    try:
        code, stdout, stderr, timed_out = run_job(cmd, env, timeout)
        reports = {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in Path(out_dir).glob("member.*.json")}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    output = stdout + stderr
    assert not timed_out, f"timed out after {timeout} s and was killed\n{output[-6000:]}"
    assert_no_leftovers(word)
    return code, output, reports


def check_finished_alike(code: int, output: str, reports: dict, *, nprocs: int, victim: int,
                         started: tuple[int, ...] = ()) -> None:
    """The launcher exits 0 and names the rank lost (and those started); every
    rank that ended (survivors and started ones) reports the same world and a
    bitwise identical replica."""
    tail = output[-6000:]
    assert code == 0, tail
    ended = len(reports)
    summary = f"{ended} of {nprocs + len(started)} ranks finished; lost rank {victim}"
    assert summary in output, tail
    if started:
        assert f"started rank {started[0]}" in output, tail
    members = sorted(set(range(nprocs)) - {victim}) + list(started)
    assert sorted(reports) == members, (sorted(reports), tail)
    for member, rep in reports.items():
        assert rep["lost"] == [victim] and rep["members"] == members and rep["size"] == len(members), rep
        assert rep["joined"] == list(started), rep
        assert rep["identical"] is True, rep
    assert len({rep["fingerprint"] for rep in reports.values()}) == 1, reports
