"""Run a worker script under ``mpiexec`` from pytest, with a timeout that kills
the whole job and reports which ranks never finished.

Workers call ``workers.support.report(value)`` to hand a JSON-able result to
the test and ``workers.support.phase(text)`` to say what they are doing, so a
hung rank can be named with its last phase.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hvd_partial.launch import mpiexec_command

WORKERS = Path(__file__).parent / "workers"
ROOT = Path(__file__).parent.parent


@dataclass
class MpiResult:
    nprocs: int
    returncode: int
    stdout: str
    stderr: str
    results: dict = field(default_factory=dict)  # rank -> reported value
    phases: dict = field(default_factory=dict)  # rank -> last phase
    elapsed: float = 0.0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def tail(self, n: int = 4000) -> str:
        return f"--- stdout ---\n{self.stdout[-n:]}\n--- stderr ---\n{self.stderr[-n:]}"


def run_job(cmd: list, env: dict, timeout: float, cwd=None) -> tuple[int, str, str, bool]:
    """Run ``cmd`` in a session of its own, so that a timeout kills the whole
    job (mpiexec and every rank). Returns (returncode, stdout, stderr, timed_out)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr, False
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        stdout, stderr = proc.communicate()
        return proc.returncode, stdout, stderr, True


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``: its process group, and the groups of
    their own that Open MPI's launcher gives the ranks it starts."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # its leader's group is gone; members of the session may not be
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[3]) == sid:  # (state, ppid, pgrp, session, ...)
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_mpi(worker: str, nprocs: int, *args, timeout: float = 90, env: dict | None = None,
            expect_success: bool = True, keep_survivors: bool = False, require_reports: bool = True,
            mpiexec_args=()) -> MpiResult:
    """Run ``tests/workers/<worker>`` (or a script given by absolute path) on
    ``nprocs`` ranks; fail the test on a timeout (naming the ranks that never
    finished) or, with ``expect_success``, on a non-zero exit or a rank that
    did not report (unless ``require_reports`` is false). ``mpiexec_args``
    go to the launcher before its own (``--with-ft ulfm`` for Open MPI's
    fault tolerance, say)."""
    import time

    out_dir = tempfile.mkdtemp(prefix="hvdp-test-")
    script = Path(worker) if os.path.isabs(worker) else WORKERS / worker
    cmd = mpiexec_command(nprocs, [sys.executable, str(script), *map(str, args)], keep_survivors=keep_survivors)
    cmd[1:1] = list(mpiexec_args)
    full_env = dict(os.environ)
    full_env.update({"HVD_TEST_OUT": out_dir, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}",
                     "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    started = time.monotonic()
    returncode, stdout, stderr, timed_out = run_job(cmd, full_env, timeout)
    result = MpiResult(nprocs, returncode, stdout, stderr, elapsed=time.monotonic() - started)
    for rank in range(nprocs):
        path = Path(out_dir, f"rank{rank}.json")
        if path.exists():
            result.results[rank] = json.loads(path.read_text())
        phase = Path(out_dir, f"rank{rank}.phase")
        if phase.exists():
            result.phases[rank] = phase.read_text()
    shutil.rmtree(out_dir, ignore_errors=True)  # everything is read: leave nothing in TMPDIR
    if timed_out:
        hung = [r for r in range(nprocs) if r not in result.results]
        detail = ", ".join(f"rank {r} (last phase: {result.phases.get(r, 'never started')})" for r in hung)
        pytest.fail(f"mpiexec -n {nprocs} {worker} timed out after {timeout:.0f} s and was killed; "
                    f"ranks that never finished: {detail or 'none (all reported, the job did not exit)'}\n"
                    + result.tail())
    if expect_success:
        require_success(result, worker, require_reports)
    return result


def require_success(result: MpiResult, worker: str, require_reports: bool = True) -> None:
    """Fail the test on a non-zero exit, or (with ``require_reports``) on a rank that did not report."""
    if result.returncode != 0:
        pytest.fail(f"mpiexec -n {result.nprocs} {worker} exited with {result.returncode}\n" + result.tail())
    if require_reports:
        missing = [r for r in range(result.nprocs) if r not in result.results]
        if missing:
            pytest.fail(f"ranks {missing} exited without reporting a result\n" + result.tail())


# Open MPI's fault tolerance (ULFM), as the elastic tests launch with it.
ULFM_ARGS = ("--with-ft", "ulfm", "--mca", "btl", "tcp,self")


@functools.lru_cache(maxsize=None)
def no_ulfm_launcher() -> str | None:
    """Why this run's mpiexec cannot launch with ULFM, or None (the ``ulfm`` fixture skips on it)."""
    from hvd_partial.launch.mpiexec import MpiFlavor, detect_flavor, find_mpiexec

    exe = find_mpiexec()
    flavor = detect_flavor(exe)
    if flavor is not MpiFlavor.OPEN_MPI:
        return f"needs Open MPI 5 with ULFM (run bash ci/test-openmpi); this run's mpiexec is {flavor.value}"
    info = Path(exe).with_name("ompi_info")
    try:
        text = subprocess.run([str(info)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"cannot run {info}: {err}"
    if "FT MPI support: yes" not in text:
        return f"this Open MPI ({exe}) was built without ULFM (ompi_info: no 'FT MPI support: yes')"
    return None
