"""Helpers for launcher tests: run a command with a timeout that kills its
whole process group, and find processes left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from mpi_run import kill_session

ROOT = Path(__file__).resolve().parents[2]


def token() -> str:
    """A unique word to put on a job's command lines."""
    return f"hvdp-{uuid.uuid4().hex[:12]}"


def leftovers(word: str) -> list[str]:
    """Command lines of live processes that contain ``word``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if word in cmdline and state != "Z":
            found.append(f"pid {entry.name} [{state}]: {cmdline.strip()}")
    return found


def assert_no_leftovers(word: str, grace: float = 5.0) -> None:
    deadline = time.monotonic() + grace
    while True:
        left = leftovers(word)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for line in left:  # clean up before failing, so later tests run on a clean machine
        try:
            os.kill(int(line.split()[1]), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    assert not left, "processes left behind:\n" + "\n".join(left)


def run_command(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout kill the whole group and fail."""
    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s and was killed\n{out[-3000:]}\n{err[-3000:]}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    result.elapsed = time.monotonic() - started
    return result


def run_member_job(cmd: list[str], out_dir: str, timeout: float = 240) -> tuple[int, str, str, dict]:
    """Run a launcher job whose ranks each write ``member.<n>.json`` into ``out_dir``
    (``HVD_TEST_OUT``), killing the whole job on a timeout (which fails the test, with
    the output). Returns (exit status, stdout and stderr, stderr, member -> report)."""
    import json

    from mpi_run import WORKERS, run_job

    env = dict(os.environ, HVD_TEST_OUT=out_dir, PYTHONPATH=f"{ROOT}:{WORKERS.parent}", PYTHONUNBUFFERED="1")
    code, stdout, stderr, timed_out = run_job(cmd, env, timeout=timeout)
    reports = {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in Path(out_dir).glob("member.*.json")}
    output = stdout + stderr
    assert not timed_out, output[-6000:]
    return code, output, stderr, reports
