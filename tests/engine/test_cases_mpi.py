"""Bad input, helpers and failures under mpiexec: clear errors on every rank, no hangs.

Each scenario is a case of tests/workers/engine_cases.py, which asserts on
every rank what that rank can tell; these tests check that the run succeeded
(or failed as it must) and what can only be compared across ranks or runs."""

import pytest

from mpi_run import run_mpi
from workers.support import run_case_job

pytestmark = pytest.mark.mpi

CASES = "engine_cases.py"


def test_calls_before_init_and_after_shutdown_fail_clearly():
    run_case_job(CASES, 2, "before_init")


def test_settings_that_must_agree_fail_init_on_every_rank():
    res = run_case_job(CASES, 2, "settings_disagree")
    assert res.results[0]["error"].split(": ", 2)[2] == res.results[1]["error"].split(": ", 2)[2]


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5])
def test_sync_equals_plain_mpi_allreduce_bitwise(nprocs):
    run_case_job(CASES, nprocs, "sync_equals_allreduce")


def test_init_on_sub_communicators_runs_independent_worlds():
    """init(comm) with a split of COMM_WORLD: each part is a world of its own
    (ranks, helpers, rounds), and a rank left out of the split gets a clear
    error, not an MPI error stack."""
    res = run_case_job(CASES, 5, "sub_communicators")
    assert res.results[4] == {"left_out": True}
    for world in range(4):
        peer = world % 2  # the world's first member
        assert res.results[world]["rounds"] == res.results[peer]["rounds"], \
            f"world rank {world}: other rounds than its peer"


def test_running_out_of_stream_communicators_is_a_clear_error():
    """Every stream holds an MPI communicator; where the MPI runs out (MPICH
    at about 2,040), every rank gets TooManyStreamsError naming the stream
    and the way out, not an engine crash, and shuts down cleanly."""
    res = run_case_job(CASES, 2, "too_many_streams", 2200)
    assert len({rep["failed_at"] for rep in res.results.values()}) == 1, res.results


def test_more_majority_streams_with_a_quorum_than_the_window_holds_is_a_clear_error():
    """The 257th majority stream with a quorum in a session: every rank's own
    first post to it is refused with TooManyStreamsError naming the rank, the
    limit and the way out; the engine and the streams it has go on."""
    res = run_case_job(CASES, 2, "too_many_streams", 300, "quorum")
    assert res.results[0]["old_stream"] == res.results[1]["old_stream"]


@pytest.mark.timing
def test_sync_stream_posted_more_often_on_some_ranks_fails_instead_of_hanging():
    """A sync round needs every rank: a rank that posts once more than a rank
    which began flushing is told so (MismatchError), never left waiting. A
    post made after the flush began is refused before it starts any MPI call,
    so the rank can still flush; a round already in flight cannot be undone,
    so every rank fails, naming it."""
    run_case_job(CASES, 3, "sync_uneven", "late")
    stuck = run_case_job(CASES, 3, "sync_uneven", "in_flight", timeout=60, expect_success=False)
    assert sorted(stuck.results) == [0, 1, 2], stuck.tail()
    assert stuck.elapsed < 30, "the in-flight mismatch was found by a timeout, not at once"
    named_itself = sum(stuck.results[rank]["extra"].startswith("MismatchError") for rank in (1, 2))
    assert named_itself >= 1, stuck.results


def test_shut_down_engines_are_freed_without_the_garbage_collector():
    run_case_job(CASES, 2, "no_leak")


def test_init_after_shutdown_starts_a_fresh_session():
    run_case_job(CASES, 3, "reinit")


def test_a_message_left_unreceived_in_one_session_never_reaches_the_next():
    res = run_case_job(CASES, 2, "stale_message")
    assert res.results[1]["got"] == ["from the second session"]


def test_sessions_back_to_back_each_start_fresh_and_lose_nothing():
    run_case_job(CASES, 4, "sessions_back_to_back")


def test_fusion_threshold_splits_a_grouped_stream_into_buckets_that_take_the_same_rounds():
    nprocs = 3
    for threshold in (1024, 64 << 20):
        res = run_case_job(CASES, nprocs, "fusion_buckets", threshold)
        for rank, rep in res.results.items():  # every rank took the same rounds, every bucket in each
            assert rep["rounds"] == res.results[0]["rounds"], f"threshold {threshold}: rank {rank}"


@pytest.mark.timing
def test_doorbells_wake_idle_engines_at_once():
    """Idle engines sleep doorbell_poll_ms (with doorbells) or idle_poll_ms
    (without; both 300 ms here) at a time;
    a solo round started by one rank needs every engine, so it completes in a
    few ms only if the others' doorbells woke them. Without doorbells the same
    protocol still runs, on polling alone."""
    on = run_case_job(CASES, 3, "doorbell", 300)
    off = run_case_job(CASES, 3, "doorbell", 300, env={"HVD_PARTIAL_DOORBELL": "0"})
    assert len(on.results[1]["waits"]) == len(off.results[1]["waits"]) == 5
    assert on.results[0]["flushed_round"] == off.results[0]["flushed_round"]


@pytest.mark.parametrize("reduce_poll_us", ["0", "100", "3000"])
def test_large_rounds_conserve_and_agree_whatever_the_polling(reduce_poll_us):
    """Multi-megabyte rounds (mapped buffers; reductions tested continuously,
    or spaced out by a sleep, even a long one): sync is MPI's sum, and solo
    with ranks out of step loses nothing and gives every rank the same rounds."""
    res = run_case_job(CASES, 3, "large_rounds", env={"HVD_PARTIAL_REDUCE_POLL_US": reduce_poll_us})
    for rank, rep in res.results.items():
        assert rep["digests"] == res.results[0]["digests"], f"rank {rank} took other rounds than rank 0"


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_a_rung_engine_receives_the_message_at_once(nprocs):
    """A doorbell rings once the message is sent, but MPI may show it only to
    a later probe: a rung receive keeps probing (a few times) rather than
    leave the engine to find it on a later wake-up."""
    res = run_case_job(CASES, nprocs, "rung_receive")
    assert res.results[0]["in_one_call"] == 60


@pytest.mark.timing
@pytest.mark.parametrize("doorbell,spin_us", [("1", "200"), ("0", "200"), ("1", "0")])
def test_no_wakeup_is_lost_between_spinning_and_sleeping(doorbell, spin_us):
    """Compute threads skip waking an engine that is awake; a post made just
    as the engine goes to sleep must still wake it (through the doorbell's pipe,
    or the lock without one), never wait out its 2 s idle poll."""
    run_case_job(CASES, 2, "wakeups", env={"HVD_PARTIAL_DOORBELL": doorbell, "HVD_PARTIAL_SPIN_US": spin_us})


def test_grouped_stream_mixed_dtypes():
    run_case_job(CASES, 3, "grouped")


def test_helpers_and_helper_mismatch():
    run_case_job(CASES, 3, "helpers")


@pytest.mark.parametrize("case, word", [("shape_mismatch", "layout"), ("dtype_mismatch", "float64"),
                                        ("mode_mismatch", "majority")])
def test_stream_mismatch_raises_on_every_rank(case, word):
    res = run_case_job(CASES, 3, case)
    for rank, rep in res.results.items():  # the worker checks the message on every rank, this its word
        assert rep["error"].startswith("MismatchError") and word in rep["error"], (rank, rep)


def test_local_misuse_raises_specific_errors():
    run_case_job(CASES, 2, "local_misuse")


@pytest.mark.timing
@pytest.mark.parametrize("nprocs", [2, 4])
def test_uncaught_exception_on_one_rank_fails_the_others_naming_it(nprocs):
    res = run_case_job(CASES, nprocs, "raise", timeout=60, expect_success=False, keep_survivors=True)
    assert res.returncode != 0
    assert "injected failure in the training step" in res.stderr
    for r in (r for r in range(nprocs) if r != 1):  # each checked that it was told within 15 s, naming rank 1
        assert res.results.get(r, {}).get("failed_rank") == 1, (r, res.results.get(r), res.tail())
    assert res.elapsed < 45


@pytest.mark.timing
@pytest.mark.parametrize("nprocs", [3, 5])
def test_stopped_rank_is_detected_by_liveness_and_named(nprocs):
    # Only rank 1's ring successor watches it; the others learn from the failure
    # flood. A stopped rank is, to its peers, a dead one that the launcher does
    # not tear down: every survivor must name it failure_timeout_seconds (3) after
    # the last heartbeat it sent (up to 0.5 s before it stopped), plus the check
    # and the flood's hops (a margin for a loaded machine).
    res = run_case_job(CASES, nprocs, "stop", timeout=60, expect_success=False)
    assert res.returncode != 0
    stopped_at = res.results[1]["stopped_at"]
    survivors = [r for r in range(nprocs) if r != 1]
    missing = [r for r in survivors if r not in res.results]
    assert not missing, f"survivors {missing} did not report\n{res.tail()}"
    for r in survivors:
        rep = res.results[r]
        assert rep["failed_rank"] == 1, (r, rep)  # and "no message from it", checked by the rank
        assert 2.4 < rep["failed_at"] - stopped_at < 8.0, (r, rep["failed_at"] - stopped_at)
    assert res.elapsed < 40


@pytest.mark.timing
@pytest.mark.parametrize("nprocs", [3, 5])
def test_killed_rank_ends_the_job_in_bounded_time(nprocs):
    # Under MPICH's Hydra a killed process takes the job down (its survivors
    # too); what must never happen is a hang. Where the launcher leaves the
    # survivors running, they name the rank (as in the SIGSTOP test).
    res = run_case_job(CASES, nprocs, "die", timeout=60, expect_success=False, keep_survivors=True)
    assert res.returncode != 0
    # The launcher's teardown: MPICH's Hydra says the rank was killed or, when the
    # killed rank's connection closes mid-message, fails its own "!closed" check.
    torn_down = "KILLED" in res.output.upper() or "assert (!closed) failed" in res.output
    assert torn_down or any(rep.get("failed_rank") == 1 for rep in res.results.values()), res.tail()
    for rep in res.results.values():  # whoever reported names the killed rank
        assert rep.get("failed_rank") == 1, rep
    assert res.elapsed < 40


@pytest.mark.parametrize("nprocs", [2, 3])
def test_async_post_then_flush_loses_nothing(nprocs):
    run_case_job(CASES, nprocs, "shutdown_in_flight")


@pytest.mark.parametrize("nprocs", [3, 4])
def test_many_streams_in_flight_in_different_orders(nprocs):
    run_case_job(CASES, nprocs, "many_streams")


@pytest.mark.timing
@pytest.mark.parametrize("delay_us", [0, 2000])
def test_engine_of_a_waiting_post_naps_and_still_wakes_at_once(delay_us):
    """Ranks whose majority post waits 1 s for the designated rank use
    little CPU (their engines nap once the wait passes 3 ms; yielding
    instead took a quarter of a core and slowed computing ranks by half
    on 2 cores), yet return as soon as that rank posts: the round's
    start rings their doorbells. With the activation delay on, they joined
    the round early and their engines nap with its reduction in flight.

    The naps are counted (the engine's ``naps``): growing naps of up to 10 ms
    (the doorbell's polling period) make about 110 in 1 s, and a load on the
    machine only makes fewer; naps stuck at 1 ms after a stale ring made about 900."""
    res = run_case_job(CASES, 3, "waiting_cpu", env={"HVD_PARTIAL_ACTIVATION_DELAY_US": str(delay_us)})
    for rank in (0, 1):  # each checked its round, its naps, its CPU and its wait
        assert 5 < res.results[rank]["naps"] < 300, res.results[rank]


@pytest.mark.timing
def test_idle_engine_backs_off():
    run_case_job(CASES, 4, "idle_cpu")


def test_an_unknown_case_is_refused():
    res = run_mpi(CASES, 1, "no_such_case", expect_success=False, require_reports=False)
    assert res.returncode != 0 and "unknown case" in res.stderr and "before_init" in res.stderr, res.tail()
