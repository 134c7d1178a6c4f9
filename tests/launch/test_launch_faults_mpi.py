"""Faults under mpiexec: a rank killed or stopped mid-round, shutdown with
rounds in flight. Survivors end in bounded time naming the rank, no process
is left behind, and a clean shutdown loses nothing.

Under MPICH's Hydra (what CI runs) a SIGKILLed rank makes the launcher tear
the whole job down at once; the survivors have no time to report, which is
the bounded end this test accepts. A SIGSTOPped rank is found by the liveness
check and named by every survivor, whose exit then makes Hydra kill the
stopped one.
"""

import pytest

from procs import assert_no_leftovers, token
from workers.support import run_case_job

pytestmark = pytest.mark.mpi

CASES = "launch_faults.py"


@pytest.mark.timing
def test_rank_killed_mid_reduction_ends_the_job_in_bounded_time_leaving_nothing():
    word = token()
    res = run_case_job(CASES, 3, "kill_mid_round", word, timeout=60, expect_success=False)
    assert res.returncode != 0
    # Either the launcher tore the job down (MPICH) or the survivors named rank 1 (each checked that).
    for rank, rep in res.results.items():
        assert rep["failed_rank"] == 1, (rank, rep)
    assert res.results or res.returncode in (9, 137, -9) or "KILLED" in res.output.upper(), res.tail()
    assert res.elapsed < 30
    assert_no_leftovers(word)


@pytest.mark.timing
def test_rank_stopped_mid_reduction_is_named_by_every_survivor_and_cleaned_up():
    word = token()
    res = run_case_job(CASES, 3, "stop_mid_round", word, timeout=60, expect_success=False)
    assert res.returncode != 0
    # Each survivor checked that it named rank 1 after its 3 s failure timeout; Open MPI
    # resumes (SIGCONT) the stopped rank before killing it: if it got to report, it
    # checked that it named itself, never a healthy peer.
    survivors = {rank: rep for rank, rep in res.results.items() if rank != 1}
    assert sorted(survivors) == [0, 2], res.tail()
    assert all(rep["failed_rank"] == 1 for rep in res.results.values()), res.results
    assert res.elapsed < 30
    assert_no_leftovers(word)


def test_a_stopped_rank_resumed_after_its_peers_gave_up_names_itself():
    word = token()
    res = run_case_job(CASES, 3, "stop_resume_after_failure", word, timeout=90, expect_success=False)
    assert res.returncode != 0
    assert sorted(res.results) == [0, 1, 2], res.tail()  # each checked whom it named, and why
    assert all(rep["failed_rank"] == 1 for rep in res.results.values()), res.results
    assert_no_leftovers(word)


def test_a_rank_frozen_past_its_own_failure_timeout_blames_nobody_and_loses_nothing():
    word = token()
    run_case_job(CASES, 3, "stop_and_resume", word, timeout=120)
    assert_no_leftovers(word)


@pytest.mark.parametrize("mode", ["solo", "majority"])
def test_shutdown_with_a_post_in_flight_loses_nothing(mode):
    word = token()
    res = run_case_job(CASES, 4, "shutdown_in_flight", word, mode, timeout=60)
    assert len({rep["rounds"] for rep in res.results.values()}) == 1  # every rank reduced the same rounds
    assert_no_leftovers(word)
