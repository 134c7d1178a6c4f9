"""Growing the elastic world back: ``hvd-partial-run --elastic -np 3 --max-np 3``
(Open MPI 5 with ULFM; skipped elsewhere, as the other elastic tests are).

The worker (tests/workers/elastic_grow.py) trains a numpy state in
``hvd.elastic.run`` with a solo stream; rank 1 dies by ``os._exit`` at its 5th
launched round (a named fault point, no timing). The survivors go on with 2
ranks, and at a later commit they start a new process running the same
script, which joins in ``init``: training finishes on 3 ranks. Every rank that
ends reports its world and a digest of its weights.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile

import pytest

from launch.procs import assert_no_leftovers, run_member_job, token
from mpi_run import WORKERS, run_mpi

pytestmark = pytest.mark.mpi

STEPS = 12


def test_a_dead_rank_is_replaced_and_training_ends_on_three(ulfm):
    word = token()
    out_dir = tempfile.mkdtemp(prefix=f"{word}-")
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "3", "--max-np", "3",
           sys.executable, str(WORKERS / "elastic_grow.py"), word, "1", "5", str(STEPS)]
    try:
        code, output, stderr, reports = run_member_job(cmd, out_dir)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert code == 0, output[-6000:]
    # the launcher names the rank lost and the rank started
    assert "elastic job: 3 of 4 ranks finished; lost rank 1 (exit 1 mid-run); started rank 3 (exit 0)" in stderr, \
        stderr[-3000:]
    assert sorted(reports) == [0, 2, 3], (sorted(reports), output[-6000:])
    for member, rep in reports.items():
        assert rep["size"] == 3 and rep["version"] == 2, rep
        assert rep["lost"] == [1] and rep["joined"] == [3] and rep["members"] == [0, 2, 3], rep
        assert rep["step"] == STEPS, rep
        assert rep["new_rank_contributed"], rep  # rounds after the grow summed the new rank's posts
        assert rep["is_new"] == (member == 3), rep
        grow = rep["grows"][0]
        assert (grow["before"], grow["after"], grow["started"]) == (2, 3, [3]), grow
    assert len({rep["digest"] for rep in reports.values()}) == 1, reports  # bitwise identical weights
    assert reports[3]["sizes"] == [3], reports[3]  # the new rank took rounds of the grown world only
    assert reports[0]["sizes"] == [2, 3] and reports[0]["resets"] == 2, reports[0]  # the kill, then the grow
    assert_no_leftovers(word)


def test_a_rank_dying_during_a_grow_fails_every_rank_naming_it(ulfm):
    """-np 4 --max-np 5: the first commit grows; rank 3 dies after Spawn and Merge, before
    the handshake (the named point ``grow_merged``). Not survived, but the job must end,
    every other rank naming rank 3, instead of hanging. (At ``grow_stopped``, before
    Spawn, Open MPI's launcher itself now and then aborts or hangs: docs/elastic.md,
    "What is left".)"""
    point = "grow_merged"
    word = token()
    out_dir = tempfile.mkdtemp(prefix=f"{word}-")
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "4", "--max-np", "5",
           sys.executable, str(WORKERS / "elastic_grow.py"), word, "3", "1", str(STEPS), point]
    try:
        code, output, stderr, reports = run_member_job(cmd, out_dir, timeout=180)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    assert code != 0 and not reports, output[-6000:]
    summary = next(line for line in stderr.splitlines() if "elastic job:" in line)
    assert "rank 3 (exit 1 mid-run)" in summary and "elastic job: 0 of" in summary, summary
    named = 0
    for rank in range(3):
        # the watch's error, or the RankFailedError of a step that raised; else Open MPI's launcher
        # ended the rank first (it aborts now and then when a Spawn meets a dead rank)
        says = (f"rank {rank}: rank(s) [3] died while the world changed from 4 to 5 ranks" in output
                or f"rank(s) [3] died while the world changed from 4 to 5 ranks (rank {rank} got:" in output)
        named += says
        assert says or f"rank {rank} (no exit recorded)" in summary or f"rank {rank} (killed by" in summary, \
            (rank, output[-6000:])
    assert named, output[-6000:]
    assert_no_leftovers(word)


def test_without_the_launcher_a_new_rank_that_never_joins_fails_the_job_after_the_grow_timeout(ulfm, tmp_path):
    # Plain mpirun: no rank wrapper records the new process's end, and MPI's Spawn waits for it
    # forever; the old ranks end once grow_timeout_seconds has passed, naming it (the job's own
    # timeout kills a hang and fails the test).
    result = run_mpi("elastic_grow_unjoined.py", 2, tmp_path / "grown", timeout=120, expect_success=False,
                     require_reports=False, mpiexec_args=ulfm,
                     env={"HVD_PARTIAL_ELASTIC": "1", "HVD_PARTIAL_MAX_NP": "3",
                          "HVD_PARTIAL_GROW_TIMEOUT_SECONDS": "3"})
    assert result.returncode != 0, result.tail()
    assert "ImportError: this new rank cannot start" in result.stderr, result.tail()
    # The first old rank to end ends the job (Open MPI's launcher, once half of the ranks died),
    # so the other may be killed, or see that rank die, before its own deadline.
    assert re.search(r"rank [01]: new rank\(s\) 2 did not join within 3 s \(grow_timeout_seconds\) while the "
                     r"world changed from 2 to 3 ranks", result.stderr), result.tail()
    assert "the grow returned" not in result.stderr
