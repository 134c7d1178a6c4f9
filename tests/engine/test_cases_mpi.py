"""Bad input, helpers and failures under mpiexec: clear errors on every rank, no hangs."""

import re

import numpy as np
import pytest

from mpi_run import run_mpi

pytestmark = pytest.mark.mpi


def test_calls_before_init_and_after_shutdown_fail_clearly():
    res = run_mpi("engine_cases.py", 2, "before_init")
    for rep in res.results.values():
        assert rep["post"].startswith("NotInitializedError") and "before init" in rep["post"]
        assert "after shutdown" in rep["after"] and "after shutdown" in rep["flush_after"]


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5])
def test_sync_equals_plain_mpi_allreduce_bitwise(nprocs):
    res = run_mpi("engine_cases.py", nprocs, "sync_equals_allreduce")
    for rank, rep in res.results.items():
        # The engine runs MPI's nonblocking allreduce in place: bitwise the same as calling it directly.
        assert rep["same_in_place"], f"rank {rank}: sync result differs from MPI.Iallreduce(MPI.IN_PLACE, ...)"
        assert rep["ints"], f"rank {rank}: integer sync result differs from MPI.Allreduce"
        if rep["library"] == "MPICH":
            assert rep["same"], f"rank {rank}: sync result differs from MPI.Allreduce"
            assert rep["same_nonblocking"], f"rank {rank}: sync result differs from MPI.Iallreduce"
        else:
            # Open MPI's blocking, nonblocking and in-place allreduce may each
            # sum floats in another order (seen at 5 ranks).
            assert rep["close"], f"rank {rank}: sync result differs from MPI.Allreduce beyond rounding"
        total = sum(r + 1 for r in range(nprocs))
        assert rep["helper"] == [i * total for i in range(5)]


def test_init_on_sub_communicators_runs_independent_worlds():
    """init(comm) with a split of COMM_WORLD: each part is a world of its own
    (ranks, helpers, rounds), and a rank left out of the split gets a clear
    error, not an MPI error stack."""
    res = run_mpi("engine_cases.py", 5, "sub_communicators")
    left_out = res.results[4]
    assert left_out["null"].startswith("ConfigError") and "COMM_NULL) on world rank 4" in left_out["null"]
    assert "expected an mpi4py communicator, got int" in left_out["not_comm"]
    assert left_out["initialized"] is False
    for world in range(4):
        rep = res.results[world]
        members = [world % 2, world % 2 + 2]
        assert (rep["rank"], rep["size"], rep["members"]) == (members.index(world), 2, members)
        assert rep["bcast"] == members[1]
        expected = np.zeros(4 * 6)
        for member in members:
            expected[member * 6:(member + 1) * 6] = 1.0
        assert rep["summed"] == expected.tolist(), f"world rank {world}: lost, doubled or foreign contributions"
        assert rep["rounds"] == res.results[members[0]]["rounds"], f"world rank {world}: other rounds than its peer"


def test_running_out_of_stream_communicators_is_a_clear_error():
    """Every stream holds an MPI communicator; where the MPI runs out (MPICH
    at about 2,040), every rank gets TooManyStreamsError naming the stream
    and the way out, not an engine crash, and shuts down cleanly."""
    streams = 2200
    res = run_mpi("engine_cases.py", 2, "too_many_streams", streams)
    for rank, rep in res.results.items():
        if rep["failed_at"] is None:  # Open MPI: 3,000 streams worked here
            assert rep["library"] != "MPICH", "MPICH gave 2,200 communicators"
            continue
        assert rep["failed_at"] > 1000, rep
        assert rep["error"].startswith("TooManyStreamsError"), rep["error"]
        assert f"stream 'tensor{rep['failed_at']}'" in rep["error"] and f"on rank {rank}" in rep["error"]
        assert "grouped_partial_allreduce_async" in rep["error"]
        assert "TooManyStreamsError" in rep["later"]
    assert len({rep["failed_at"] for rep in res.results.values()}) == 1


def test_more_majority_streams_with_a_quorum_than_the_window_holds_is_a_clear_error():
    """The 257th majority stream with a quorum in a session: every rank's own
    first post to it is refused with TooManyStreamsError naming the rank, the
    limit and the way out; the engine and the streams it has go on."""
    res = run_mpi("engine_cases.py", 2, "too_many_streams", 300, "quorum")
    for rank, rep in res.results.items():
        assert rep["failed_at"] == 256, rep
        assert rep["error"].startswith("TooManyStreamsError") and f"rank {rank}:" in rep["error"], rep["error"]
        assert "256 majority streams with a quorum" in rep["error"] and "grouped_partial_allreduce_async" in rep["error"]
        assert rep["again"].startswith("TooManyStreamsError"), rep["again"]
        assert rep["old_stream"], "the stream registered before the limit took no round"
        assert rep["no_quorum"] == [[2.0]], rep["no_quorum"]
    assert res.results[0]["old_stream"] == res.results[1]["old_stream"]


def test_sync_stream_posted_more_often_on_some_ranks_fails_instead_of_hanging():
    """A sync round needs every rank: a rank that posts once more than a rank
    which began flushing is told so (MismatchError), never left waiting. A
    post made after the flush began is refused before it starts any MPI call,
    so the rank can still flush; a round already in flight cannot be undone,
    so every rank fails, naming it."""
    late = run_mpi("engine_cases.py", 3, "sync_uneven", "late")
    for rank, rep in late.results.items():
        assert rep.get("shutdown"), f"rank {rank}: {rep}"
        assert rep["rounds"] == [0, 1, 2, 3] and rep["summed"] == [9.0, 9.0]  # 3 rounds of 3 ranks, then the flush
        if rank:
            assert rep["extra"].startswith("MismatchError"), rep
            assert "rank 0 began flushing it after 3 rounds" in rep["extra"] and f"rank {rank} posted round 3" \
                in rep["extra"]
    stuck = run_mpi("engine_cases.py", 3, "sync_uneven", "in_flight", timeout=60, expect_success=False)
    assert stuck.elapsed < 30, "the in-flight mismatch was found by a timeout, not at once"
    named_itself = 0
    for rank, rep in stuck.results.items():
        assert "rank 0 began flushing it after 3 rounds" in rep["error"], rep
        if rank:
            # Each rank fails at once: with its own mismatch, or with the failure notice
            # of another rank in the same state if that message came first.
            kind, _, text = rep["extra"].partition(": ")
            culprit = re.search(r"rank (\d+) posted round 3", text)
            assert culprit and culprit.group(1) != "0", rep
            if kind == "MismatchError":
                assert int(culprit.group(1)) == rank, rep
                named_itself += 1
            else:
                assert kind == "RankFailedError" and int(culprit.group(1)) != rank, rep
        else:
            assert rep["error"].startswith("RankFailedError")
    assert named_itself >= 1, stuck.results


def test_shut_down_engines_are_freed_without_the_garbage_collector():
    res = run_mpi("engine_cases.py", 2, "no_leak")
    for rank, rep in res.results.items():
        assert rep["alive_after_shutdown"] == 0, f"rank {rank}: {rep['alive_after_shutdown']} engines outlived shutdown"


def test_init_after_shutdown_starts_a_fresh_session():
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, "reinit")
    for rank, rep in res.results.items():
        assert rep["first"] == [0] and rep["first_tau"] == 3
        assert rep["between"].startswith("NotInitializedError") and "after shutdown()" in rep["between"]
        assert rep["session_dropped"] and rep["new_session"] and rep["second_tau"] == 5
        # Same name, new shape, dtype and mode: accepted, rounds counted from 0 again.
        assert rep["second"] == [[0, [2.0 * nprocs] * 3], [1, [2.0 * nprocs] * 3]], rep["second"]
        assert rep["stats_rounds"] == 2 and rep["rank"] == rank


def test_a_message_left_unreceived_in_one_session_never_reaches_the_next():
    res = run_mpi("engine_cases.py", 2, "stale_message")
    assert res.results[1]["got"] == ["from the second session"]


def test_sessions_back_to_back_each_start_fresh_and_lose_nothing():
    nprocs = 4
    res = run_mpi("engine_cases.py", nprocs, "sessions_back_to_back")
    for rank, rep in res.results.items():
        for session in rep["sessions"]:
            assert session["first_round"] == 0 and session["in_order"], (rank, session)
            assert session["total"] == 25 * nprocs, (rank, session)  # every post summed exactly once


def test_fusion_threshold_splits_a_grouped_stream_into_buckets_that_take_the_same_rounds():
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, "fusion_buckets", 1024)
    rounds = None
    for rank, rep in res.results.items():
        assert rep["conserved"] == [True] * 5, f"rank {rank}: a contribution was lost or doubled"
        # 1 KiB: float32 arrays of 1 KiB each travel alone; float64 300+500 elements too.
        assert rep["buckets"] == [[0], [1], [3], [2], [4]], rep["buckets"]
        assert rounds is None or rep["rounds"] == rounds  # every rank took the same rounds, every bucket in each
        rounds = rep["rounds"]
    big = run_mpi("engine_cases.py", nprocs, "fusion_buckets", 64 << 20)
    for rep in big.results.values():
        assert rep["conserved"] == [True] * 5 and rep["buckets"] == [[0, 1, 3], [2, 4]]


def test_doorbells_wake_idle_engines_at_once():
    """Idle engines sleep doorbell_poll_ms (with doorbells) or idle_poll_ms
    (without; both 300 ms here) at a time;
    a solo round started by one rank needs every engine, so it completes in a
    few ms only if the others' doorbells woke them. Without doorbells the same
    protocol still runs, on polling alone."""
    import statistics

    on = run_mpi("engine_cases.py", 3, "doorbell", 300)
    off = run_mpi("engine_cases.py", 3, "doorbell", 300, env={"HVD_PARTIAL_DOORBELL": "0"})
    for rank, rep in on.results.items():
        assert rep["bell"] and rep["reachable"] == 2, f"rank {rank}: {rep}"
    for rep in off.results.values():
        assert not rep["bell"]
    fast = statistics.median(on.results[1]["waits"])
    assert fast < 0.06, f"with doorbells a post waited {fast * 1e3:.1f} ms (median)"
    assert on.results[0]["flushed_round"] == off.results[0]["flushed_round"]


@pytest.mark.parametrize("reduce_poll_us", ["0", "100", "3000"])
def test_large_rounds_conserve_and_agree_whatever_the_polling(reduce_poll_us):
    """Multi-megabyte rounds (mapped buffers; reductions tested continuously,
    or spaced out by a sleep, even a long one): sync is MPI's sum, and solo
    with ranks out of step loses nothing and gives every rank the same rounds."""
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, "large_rounds", env={"HVD_PARTIAL_REDUCE_POLL_US": reduce_poll_us})
    digests = None
    for rank, rep in res.results.items():
        assert rep["poll"] == float(reduce_poll_us)
        assert rep["sync_same"], f"rank {rank}: a large sync round differs from MPI.Allreduce"
        assert rep["conserved"] == [True] * 3, f"rank {rank}: solo rounds lost or doubled a contribution"
        assert rep["uniform"] == [True] * 3
        digests = digests or rep["digests"]
        assert rep["digests"] == digests, f"rank {rank} took other rounds than rank 0"


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_a_rung_engine_receives_the_message_at_once(nprocs):
    """A doorbell rings once the message is sent, but MPI may show it only to
    a later probe: a rung receive keeps probing (a few times) rather than
    leave the engine to find it on a later wake-up."""
    res = run_mpi("engine_cases.py", nprocs, "rung_receive")
    rep = res.results[0]
    assert rep["in_one_call"] == rep["of"], f"{rep['of'] - rep['in_one_call']} rings found no message at first"


@pytest.mark.parametrize("doorbell,spin_us", [("1", "200"), ("0", "200"), ("1", "0")])
def test_no_wakeup_is_lost_between_spinning_and_sleeping(doorbell, spin_us):
    """Compute threads skip waking an engine that is awake; a post made just
    as the engine goes to sleep must still wake it (through the doorbell's pipe,
    or the lock without one), never wait out its 2 s idle poll."""
    res = run_mpi("engine_cases.py", 2, "wakeups",
                  env={"HVD_PARTIAL_DOORBELL": doorbell, "HVD_PARTIAL_SPIN_US": spin_us})
    for rank, rep in res.results.items():
        assert rep["spin"] == float(spin_us) / 1e6
        assert len(rep["waits"]) == 108
        worst = max(rep["waits"])
        assert worst < 0.5, f"rank {rank}: a post waited {worst:.3f} s: a wake-up was lost"


def test_grouped_stream_mixed_dtypes():
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, "grouped")
    posts = 5
    for rep in res.results.values():
        assert rep["shapes"] == [[2, 3], [4], [5]]
        assert rep["dtypes"] == ["float32", "float64", "float32"]
        assert rep["totals"][0] == [[posts * sum(range(nprocs))] * 3] * 2
        assert rep["totals"][1] == [posts * sum(range(nprocs)) * i for i in range(4)]
        assert rep["totals"][2] == [posts * sum(r + 1 for r in range(nprocs))] * 5


def test_helpers_and_helper_mismatch():
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, "helpers")
    for rank, rep in res.results.items():
        assert rep["bcast"] == [2.0, 3.0, 4.0]
        assert rep["obj"] == {"from": 2}
        assert rep["gather"] == [["r", r] for r in range(nprocs)]
        assert rep["avg"] == [1.0]
        assert "MismatchError" in rep["mismatch"] and "rank 0" in rep["mismatch"]
        assert rep["still_works"] == [3.0]


@pytest.mark.parametrize("case, word", [("shape_mismatch", "layout"), ("dtype_mismatch", "float64"),
                                        ("mode_mismatch", "majority")])
def test_stream_mismatch_raises_on_every_rank(case, word):
    nprocs = 3
    res = run_mpi("engine_cases.py", nprocs, case)
    for rank, rep in res.results.items():
        assert rep["error"].startswith("MismatchError"), rep
        assert "rank 1 differs from rank 0" in rep["error"] and word in rep["error"]
        assert rep["after"] == [3.0, 3.0]


def test_local_misuse_raises_specific_errors():
    res = run_mpi("engine_cases.py", 2, "local_misuse")
    for rep in res.results.values():
        assert "StreamConflictError" in rep["reshape"] and "layout" in rep["reshape"]
        assert "StreamConflictError" in rep["remode"] and "mode" in rep["remode"]
        assert rep["same_sum"] == [2.0] * 3 and rep["layout_reused"], rep
        assert "StreamConflictError" in rep["reshape_again"] and rep["layout_replaced"], rep
        assert "C-contiguous" in rep["noncontig"]
        assert "complex64" in rep["dtype"] and "bool" in rep["bool"]
        assert "numpy.ndarray" in rep["list"]
        assert "Average" in rep["int_avg"]
        assert rep["bad_mode"].startswith("TypeError")
        assert rep["bad_tau"].startswith("ConfigError")
        assert "synchronize it before posting again" in rep["double_post"]
        assert "never posted" in rep["flush_unknown"]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_uncaught_exception_on_one_rank_fails_the_others_naming_it(nprocs):
    res = run_mpi("engine_cases.py", nprocs, "raise", timeout=60, expect_success=False, keep_survivors=True)
    assert res.returncode != 0
    assert "injected failure in the training step" in res.stderr
    survivors = [r for r in range(nprocs) if r != 1]
    for r in survivors:
        rep = res.results[r]
        assert rep["failed_rank"] == 1, rep
        assert "rank 1 failed" in rep["error"] and "ValueError" in rep["error"]
        assert rep["seconds"] < 15  # told by the failing rank, not by the 30 s liveness timeout
    assert res.elapsed < 45


@pytest.mark.parametrize("nprocs", [3, 5])
def test_stopped_rank_is_detected_by_liveness_and_named(nprocs):
    # Only rank 1's ring successor watches it; the others learn from the failure
    # flood. A stopped rank is, to its peers, a dead one that the launcher does
    # not tear down: every survivor must name it failure_timeout_seconds (3) after
    # the last heartbeat it sent (up to 0.5 s before it stopped), plus the check
    # and the flood's hops (a margin for a loaded machine).
    res = run_mpi("engine_cases.py", nprocs, "stop", timeout=60, expect_success=False)
    assert res.returncode != 0
    stopped_at = res.results[1]["stopped_at"]
    survivors = [r for r in range(nprocs) if r != 1]
    missing = [r for r in survivors if r not in res.results]
    assert not missing, f"survivors {missing} did not report\n{res.tail()}"
    for r in survivors:
        rep = res.results[r]
        assert rep["failed_rank"] == 1 and "no message from it" in rep["error"], (r, rep)
        assert 2.4 < rep["failed_at"] - stopped_at < 8.0, (r, rep["failed_at"] - stopped_at)
    if "error" in res.results[1]:  # Open MPI resumes the stopped rank before killing it
        assert res.results[1]["failed_rank"] == 1 and "declared failed by rank" in res.results[1]["error"]
    assert res.elapsed < 40


@pytest.mark.parametrize("nprocs", [3, 5])
def test_killed_rank_ends_the_job_in_bounded_time(nprocs):
    # Under MPICH's Hydra a killed process takes the job down (its survivors
    # too); what must never happen is a hang. Where the launcher leaves the
    # survivors running, they name the rank (as in the SIGSTOP test).
    res = run_mpi("engine_cases.py", nprocs, "die", timeout=60, expect_success=False, keep_survivors=True)
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
    res = run_mpi("engine_cases.py", nprocs, "shutdown_in_flight")
    for rep in res.results.values():
        assert rep["summed"] == [1.0] * (nprocs * 7)


@pytest.mark.parametrize("nprocs", [3, 4])
def test_many_streams_in_flight_in_different_orders(nprocs):
    res = run_mpi("engine_cases.py", nprocs, "many_streams")
    for name in res.results[0]["sums"]:
        total = [sum(res.results[r]["posted"][name][i] for r in range(nprocs)) for i in range(4)]
        for r in range(nprocs):
            assert res.results[r]["sums"][name] == total, f"rank {r}, {name}: lost or doubled data"


@pytest.mark.parametrize("delay_us", [0, 2000])
def test_engine_of_a_waiting_post_naps_and_still_wakes_at_once(delay_us):
    """Ranks whose majority post waits 1 s for the designated rank use
    little CPU (their engines nap once the wait passes 3 ms; yielding
    instead took a quarter of a core and slowed computing ranks by half
    on 2 cores), yet return as soon as that rank posts: the round's
    start rings their doorbells. With the activation delay on, they joined
    the round early and their engines nap with its reduction in flight.

    The naps are counted: growing naps of up to 10 ms (the doorbell's
    polling period) make about 110 in 1 s, and a load on the machine only
    makes fewer; naps stuck at 1 ms after a stale ring made about 900."""
    res = run_mpi("engine_cases.py", 3, "waiting_cpu", env={"HVD_PARTIAL_ACTIVATION_DELAY_US": str(delay_us)})
    for rank in (0, 1):
        rep = res.results[rank]
        assert (rep["round"], rep["initiator"], rep["contributors"]) == (1, 2, [0, 1, 2]), rep
        assert rep["joined_early"] == (1 if delay_us else 0), rep
        assert 5 < rep["naps"] < 300, f"rank {rank}: its engine napped {rep['naps']} times in a 1 s wait"
        assert rep["cpu_fraction"] < 0.2, f"rank {rank}: its waiting engine used {rep['cpu_fraction']:.0%} of a core"
        assert rep["waited"] < 1.3, f"rank {rank}: returned {rep['waited'] - 1.0:.2f} s after the round could start"


def test_idle_engine_backs_off():
    res = run_mpi("engine_cases.py", 4, "idle_cpu")
    for rank, rep in res.results.items():
        # process CPU time over 2 s of sleep: the engine's polling alone
        assert rep["cpu_fraction"] < 0.15, f"rank {rank}: idle engine used {rep['cpu_fraction']:.0%} of a core"
