"""The fault-tolerance layer (hvd_partial.transport.ulfm) with real kills.

Runs under Open MPI 5 with ULFM (``bash ci/test-openmpi``), each job launched
with ``--with-ft ulfm --mca btl tcp,self``; elsewhere (the MPICH suite) those
tests skip, and the detection test checks that MPICH is reported as having no
ULFM. Each victim dies by ``os._exit`` at a named point (see
tests/workers/ulfm_cases.py); survivors must get a process-failure error,
agree on the same failed ranks, and reduce exactly on the shrunk (or grown)
communicator.

Open MPI 5.0's launcher ends the whole job once half of its processes or more
have died (found here: 2 of 4 and 3 of 6 end it, 2 of 5 and 3 of 7 do not),
so the cases that kill two ranks run five.
"""

import pytest
from hvd_partial.launch.mpiexec import MpiFlavor, detect_flavor, find_mpiexec
from launch.procs import assert_no_leftovers, token
from mpi_run import ULFM_ARGS
from workers.support import run_case_job

pytestmark = pytest.mark.mpi

CASES = "ulfm_cases.py"


def run_kill_case(nprocs, *args, survivors, timeout=60):
    word = token()
    res = run_case_job(CASES, nprocs, args[0], word, *args[1:], timeout=timeout, expect_success=False,
                       mpiexec_args=ULFM_ARGS)
    assert sorted(res.results) == survivors, f"reports from {sorted(res.results)}, expected {survivors}\n" + res.tail()
    assert res.returncode != 0, res.tail()  # the launcher saw its ranks die
    assert_no_leftovers(word)
    return res.results


def same_on_every_survivor(reports, key):
    values = {rank: rep[key] for rank, rep in reports.items()}
    assert len({repr(v) for v in values.values()}) == 1, values
    return next(iter(values.values()))


def test_one_rank_killed_in_an_allreduce_survivors_agree_and_shrink(ulfm):
    reports = run_kill_case(4, "kill_in_allreduce", "1", survivors=[0, 2, 3])
    assert same_on_every_survivor(reports, "failed") == [1]
    assert same_on_every_survivor(reports, "size") == 3
    assert same_on_every_survivor(reports, "step") == 3  # the first step the dead rank missed
    # A neighbour of the dead rank sees it die; a survivor that does not may instead see the revoke.
    assert {rep["error"] for rep in reports.values()} <= {"ERR_PROC_FAILED", "ERR_REVOKED"}, reports
    assert "ERR_PROC_FAILED" in {rep["error"] for rep in reports.values()}, reports


def test_two_ranks_killed_at_once(ulfm):
    reports = run_kill_case(5, "kill_in_allreduce", "1,2", survivors=[0, 3, 4])
    assert same_on_every_survivor(reports, "failed") == [1, 2]
    assert same_on_every_survivor(reports, "size") == 3


def test_rank_zero_killed(ulfm):
    reports = run_kill_case(4, "kill_in_allreduce", "0", survivors=[1, 2, 3])
    assert same_on_every_survivor(reports, "failed") == [0]
    assert same_on_every_survivor(reports, "size") == 3


@pytest.mark.parametrize("step", ["agree", "shrink", "confirm"])
def test_a_second_rank_killed_during_agree_and_shrink(ulfm, step):
    # Rank 1 dies in the allreduce; rank 2 dies inside agree_and_shrink at ``step``.
    reports = run_kill_case(5, "kill_in_recovery", step, survivors=[0, 3, 4])
    assert same_on_every_survivor(reports, "failed") == [1, 2]
    assert same_on_every_survivor(reports, "size") == 3
    rounds = same_on_every_survivor(reports, "rounds")
    if step == "confirm":
        assert rounds >= 2, rounds


def test_grow_back_after_a_shrink(ulfm):
    reports = run_kill_case(4, "grow_back", survivors=[0, 2, 3], timeout=90)
    assert same_on_every_survivor(reports, "failed") == [1]
    assert same_on_every_survivor(reports, "merged_size") == 4
    child = same_on_every_survivor(reports, "child")
    assert child[1] == 1 and child[2] is True, child


FAILURE_CLASSES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


def _support_probe(mpiexec_args):
    word = token()
    res = run_case_job(CASES, 2, "support_probe", word, timeout=60, mpiexec_args=mpiexec_args)
    assert_no_leftovers(word)
    return (same_on_every_survivor(res.results, "reason"), same_on_every_survivor(res.results, "failure_checks"),
            same_on_every_survivor(res.results, "fatal_handler"))


def test_ulfm_support_says_mpich_has_none():
    if detect_flavor(find_mpiexec()) is not MpiFlavor.MPICH:
        pytest.skip("this run's mpiexec is not MPICH")
    reason, checks, _ = _support_probe(())
    assert reason and "MPICH" in reason and "--with-ft ulfm" in reason, reason
    # MPICH's mpi4py aliases the failure classes to ERR_UNKNOWN: none may count as a failure.
    assert not any(checks.values()), checks


def test_ulfm_support_under_open_mpi_with_ulfm(ulfm):
    reason, checks, fatal = _support_probe(ulfm)
    assert reason is None
    assert fatal and "MPI.ERRORS_RETURN" in fatal, fatal  # the same launch, a communicator that would abort
    assert all(checks[name] for name in FAILURE_CLASSES), checks
    assert not any(v for name, v in checks.items() if name not in FAILURE_CLASSES), checks


@pytest.mark.parametrize("args, expected", [
    ((), "without `--with-ft ulfm`"),
    (("--with-ft", "ulfm"), "shared-memory transport"),  # btl left to its default (sm among them)
    (("--with-ft", "ulfm", "--mca", "btl", "sm,tcp,self"), "shared-memory transport"),
], ids=["no-ft", "ft-default-btl", "ft-btl-sm"])
def test_ulfm_support_names_the_launch_fix_under_open_mpi(ulfm, args, expected):
    reason, _, _ = _support_probe(args)
    assert reason and expected in reason and "--with-ft ulfm --mca btl tcp,self" in reason, reason
