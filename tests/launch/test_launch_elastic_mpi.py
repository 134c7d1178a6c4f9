"""Elastic launch and init with real MPI processes.

Under MPICH (and Open MPI launched without ``--with-ft ulfm``) ``init`` with
elastic on fails on every rank with the reason and the fix. Under Open MPI 5
with ULFM (``bash ci/test-openmpi``; skipped elsewhere), ``hvd-partial-run
--elastic`` survives a rank that dies: exit 0 and a summary naming it, or
non-zero below ``--min-np``. Open MPI 5.0's launcher ends the whole job once
half of its ranks or more died, so one rank of five dies.
"""

import sys

import pytest

from procs import ROOT, assert_no_leftovers, run_command, token
from workers.support import run_case_job

from hvd_partial.launch.mpiexec import MpiFlavor, detect_flavor, find_mpiexec

pytestmark = pytest.mark.mpi

CASES = "elastic_launch.py"
WORKER = ROOT / "tests" / "workers" / CASES


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_elastic_init_without_ulfm_fails_on_every_rank(how):
    flavor = detect_flavor(find_mpiexec())
    word = token()
    env = {"HVD_PARTIAL_ELASTIC": "1"} if how == "environment" else {}
    res = run_case_job(CASES, 2, "init_refused", word, how, timeout=60, env=env)
    assert sorted(res.results) == [0, 1], res.tail()
    for rank, rep in res.results.items():
        error = rep["error"]
        assert error.startswith("UlfmUnavailableError: "), (rank, error)
        assert "hvd-partial-run --elastic" in error and "--with-ft ulfm --mca btl tcp,self" in error, error
        if flavor is MpiFlavor.MPICH:
            assert "MPICH" in error and "no fault tolerance" in error, error
        else:  # Open MPI launched by plain mpiexec_command: no --with-ft ulfm
            assert "without `--with-ft ulfm`" in error, error
    assert_no_leftovers(word)



def test_elastic_launch_survives_a_dead_rank_and_names_it(ulfm, tmp_path):
    word = token()
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "5", "--min-np", "2",
                       sys.executable, str(WORKER), "one_dies", word, "2"], timeout=120,
                      env={"HVD_TEST_OUT": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "elastic job: 4 of 5 ranks finished; lost rank 2 (exit 1 mid-run)" in res.stderr, res.stderr[-3000:]
    reports = sorted(p.name for p in tmp_path.glob("rank*.json"))
    assert reports == ["rank0.json", "rank1.json", "rank3.json", "rank4.json"], reports  # every survivor checked
    assert_no_leftovers(word)


def test_elastic_launch_below_min_np_fails_naming_the_lost(ulfm, tmp_path):
    word = token()
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "5", "--min-np", "5",
                       sys.executable, str(WORKER), "one_dies", word, "2"], timeout=120,
                      env={"HVD_TEST_OUT": str(tmp_path)})
    assert res.returncode != 0
    assert "4 of 5 ranks finished; lost rank 2 (exit 1 mid-run): fewer than --min-np 5" in res.stderr, \
        res.stderr[-3000:]
    assert_no_leftovers(word)
