"""Following a host discovery script: ``hvd-partial-run --host-discovery-script``
(Open MPI 5 with ULFM; skipped elsewhere, as the other elastic tests are).

The script prints ``localhost:N``, N read from a file; the worker
(tests/workers/elastic_discovery.py) trains a numpy state in
``hvd.elastic.run`` on a solo stream and, on rank 0 at step 4, writes a new N
and waits for the launcher to have seen it: the commit at step 6 applies the
change on every rank (no timing decides it). 3 -> 2: rank 2 leaves cleanly,
every gradient it posted is in the model of the two that go on, which end
bitwise alike; 2 -> 4: ranks 2 and 3 start there, and all four end alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from launch.procs import assert_no_leftovers, run_member_job, token
from mpi_run import WORKERS

pytestmark = pytest.mark.mpi

STEPS = 12
CHANGE_STEP = 4
APPLIED_AT = 6  # the first commit after CHANGE_STEP


def run_discovery(first: int, then: int, *extra: str, timeout: float = 240) -> tuple[int, str, dict]:
    word = token()
    folder = tempfile.mkdtemp(prefix=f"{word}-")
    out_dir = os.path.join(folder, "out")
    os.mkdir(out_dir)
    slots = os.path.join(folder, "slots")
    Path(slots).write_text(str(first))
    script = os.path.join(folder, "discover.sh")
    Path(script).write_text(f"#!/bin/sh\necho localhost:$(cat {slots})\n")
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--host-discovery-script", script, "--min-np", "1",
           sys.executable, str(WORKERS / "elastic_discovery.py"), word, slots, str(CHANGE_STEP), str(then),
           str(STEPS), *extra]
    try:
        code, _, stderr, reports = run_member_job(cmd, out_dir, timeout)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert_no_leftovers(word)
    return code, stderr, reports


def test_a_host_listing_fewer_slots_drains_a_rank_that_leaves_cleanly(ulfm):
    code, stderr, reports = run_discovery(3, 2)
    assert code == 0, stderr[-6000:]
    assert "elastic job: 3 of 3 ranks finished; drained rank 2 (exit 0)" in stderr, stderr[-3000:]
    assert sorted(reports) == [0, 1, 2], (sorted(reports), stderr[-6000:])
    drained = reports[2]
    assert drained["drained"] and drained["step"] == APPLIED_AT, drained
    for member in (0, 1):
        rep = reports[member]
        assert rep["size"] == 2 and rep["members"] == [0, 1] and rep["left"] == [2] and rep["lost"] == [], rep
        assert rep["version"] == 1 and rep["step"] == STEPS and rep["sizes"] == [2, 3], rep
        assert rep["resets"] == 1, rep  # the drain's HostsUpdatedInterrupt
    assert reports[0]["weights"] == reports[1]["weights"], reports  # bitwise alike (floats as JSON)
    weights = np.array(reports[0]["weights"])
    # every gradient posted was summed once: the drained rank's 6 included
    assert weights[:3].tolist() == [STEPS, STEPS, APPLIED_AT] and not weights[3:].any(), weights


def test_a_host_listing_more_slots_gets_new_ranks(ulfm):
    code, stderr, reports = run_discovery(2, 4)
    assert code == 0, stderr[-6000:]
    assert "elastic job: 4 of 4 ranks finished; started rank 2 (exit 0), rank 3 (exit 0)" in stderr, stderr[-3000:]
    assert sorted(reports) == [0, 1, 2, 3], (sorted(reports), stderr[-6000:])
    for member, rep in reports.items():
        assert rep["size"] == 4 and rep["members"] == [0, 1, 2, 3] and rep["joined"] == [2, 3], rep
        assert rep["version"] == 1 and rep["step"] == STEPS and rep["is_new"] == (member >= 2), rep
        assert rep["sizes"] == ([4] if member >= 2 else [2, 4]), rep
    assert len({json.dumps(rep["weights"]) for rep in reports.values()}) == 1, reports
    weights = np.array(reports[0]["weights"])
    new_posts = STEPS - APPLIED_AT  # the new ranks start from the synced step
    assert weights[:4].tolist() == [STEPS, STEPS, new_posts, new_posts] and not weights[4:].any(), weights


def test_a_new_rank_that_dies_before_joining_fails_the_job_naming_it(ulfm):
    # MPI's Spawn waits forever for a process that ends before MPI_Init; the ranks it left
    # waiting see the launcher's record of its end and fail the job instead (the timeout
    # of run_member_job kills a hang and fails the test)
    code, stderr, reports = run_discovery(2, 4, "joined-fails", timeout=120)
    assert code != 0, stderr[-6000:]
    # The first old rank to end ends the job (Open MPI's launcher, once half of the ranks died),
    # so the other may be killed before it says anything; none blames an old rank.
    assert re.search(r"rank [01]: new rank\(s\) [23](, 3)? \(exit 1 mid-run\)[^\n]* ended before joining "
                     r"while the world changed from 2 to 4 ranks", stderr), stderr[-6000:]
    assert not re.search(r"rank\(s\) \[[01]\] died", stderr), stderr[-6000:]
    assert "ImportError: this new rank cannot start" in stderr, stderr[-6000:]
    assert "fewer than --min-np 1" in stderr and reports == {}, (reports, stderr[-3000:])
