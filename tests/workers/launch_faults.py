"""Fault scenarios run through the launcher: ``launch_faults.py CASE TOKEN [ARGS]``,
one registered case each. Each case asserts on every rank what that rank can
tell; what only several ranks or the job's end show is left to the test.

TOKEN only marks the command line, so the test can check that no process of
the job is left behind."""

import os
import signal
import sys
import time

import numpy as np

from support import announce, await_announced, case, phase, report, run_case

import hvd_partial as hvd


def wait_until_stopped(pid):
    """Wait until process ``pid`` is in the stopped state."""
    phase(f"waiting for process {pid} to stop")
    while True:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            return
        time.sleep(0.01)  # a poll of the process's state, not an ordering


def failed(err, started):
    return {"error": str(err), "failed_rank": err.rank, "type": type(err).__name__,
            "seconds": time.monotonic() - started}


@case(names=("kill_mid_round", "stop_mid_round"))
def killed_or_stopped_mid_round(which, _token):
    # Rank 1 starts a large reduction and is killed (SIGKILL) or frozen (SIGSTOP)
    # while it is in flight.
    hvd.init(failure_timeout_seconds=3, heartbeat_seconds=0.5)
    rank = hvd.rank()
    big = np.ones(2 * 1024 * 1024, np.float32)  # 8 MiB
    started = time.monotonic()
    phase("posting")
    try:
        for step in range(10000):
            handle = hvd.partial_allreduce_async(big, "big", mode=hvd.Solo())
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGKILL if which == "kill_mid_round" else signal.SIGSTOP)
            hvd.synchronize(handle)
            time.sleep(0.01)  # pacing: a training step's compute
        report({"error": None})
    except hvd.RankFailedError as err:
        got = failed(err, started)
        assert err.rank == 1, got
        if which == "stop_mid_round" and rank != 1:
            assert "no message from it" in got["error"], got
            assert 2.5 < got["seconds"] < 10, got  # failure_timeout_seconds=3
        if rank == 1:  # Open MPI resumes (SIGCONT) the stopped rank before killing it: it names itself
            assert "declared failed by rank" in got["error"], got
        report(got)
        raise


@case
def stop_resume_after_failure(_token):
    # Rank 1 freezes; ranks 0 and 2 declare it failed. Rank 0 then resumes it
    # and waits for its report: the resumed rank must name itself, not blame
    # a peer that went quiet after giving up on it.
    hvd.init(failure_timeout_seconds=2, heartbeat_seconds=0.25)
    rank = hvd.rank()
    pids = hvd.allgather_object(os.getpid())
    started = time.monotonic()
    phase("posting")
    try:
        for step in range(10000):
            if rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGSTOP)
            hvd.partial_allreduce(np.ones(1024, np.float32), "small", mode=hvd.Solo())
        report({"error": None})
    except hvd.RankFailedError as err:
        try:
            assert err.rank == 1 and "no message from it" in str(err), err
            if rank == 1:
                assert "declared failed by rank" in str(err), err
            report(failed(err, started))
        finally:
            if rank == 1:
                announce("the resumed rank reported")
        if rank == 0:
            os.kill(pids[1], signal.SIGCONT)
            await_announced("the resumed rank reported")
        raise


@case
def stop_and_resume(_token):
    # Rank 1 is frozen (by rank 0) for longer than its own failure timeout
    # but well within the others': once resumed it must blame nobody, and
    # every post is summed exactly once.
    from mpi4py import MPI

    world_rank = MPI.COMM_WORLD.Get_rank()
    hvd.init(failure_timeout_seconds=1.5 if world_rank == 1 else 60, heartbeat_seconds=0.2)
    rank, size = hvd.rank(), hvd.size()
    pids = hvd.allgather_object(os.getpid())
    posts = 12
    total = np.zeros(size * posts)
    phase("posting")
    for step in range(posts):
        if rank == 0 and step == 4:
            os.kill(pids[1], signal.SIGSTOP)
            wait_until_stopped(pids[1])
            time.sleep(3.0)  # the freeze under test, not an ordering: twice rank 1's 1.5 s timeout
            os.kill(pids[1], signal.SIGCONT)
        x = np.zeros(size * posts)
        x[rank * posts + step] = 1.0
        for result in hvd.partial_allreduce(x, "s", mode=hvd.Solo(), op=hvd.Sum):
            total += result.array
    for result in hvd.flush("s"):
        total += result.array
    assert total.tolist() == [1.0] * (size * posts), f"lost or doubled posts: {total}"
    report({"ok": True})
    hvd.shutdown()


@case(names=("raise",))
def uncaught_exception(_name, _token):
    hvd.init(failure_timeout_seconds=30)
    rank = hvd.rank()
    started = time.monotonic()
    phase("posting")
    try:
        for step in range(10000):
            if rank == 1 and step == 4:
                raise KeyError("injected failure in rank 1's training step")
            hvd.partial_allreduce(np.ones(64, np.float32), "grads", mode=hvd.Majority(seed=3))
            time.sleep(0.005)  # pacing: a training step's compute
        report({"error": None})
    except hvd.RankFailedError as err:
        got = failed(err, started)
        assert err.rank == 1 and "KeyError" in got["error"], got
        assert got["seconds"] < 15, got  # told by rank 1, not found by the 30 s liveness timeout
        report(got)
        raise


@case
def shutdown_in_flight(_token, mode_name):
    # Posts with random delays, the last one left unsynchronized, then
    # shutdown(): every contribution must be summed into exactly one round.
    # The rounds of shutdown's final flush are not returned to the caller, so
    # the reduced buffers are recorded where every round completes.
    from hvd_partial.core import rank_stream

    recorded = []
    original = rank_stream.RankStream.complete

    def recording_complete(self, launch, reduced):
        if reduced is not None:
            data = reduced[:-1] if getattr(launch, "with_facts", False) else reduced  # last: the round's facts
            recorded.append(np.concatenate([np.asarray(b, dtype=np.float64).ravel() for b in data]))
        return original(self, launch, reduced)

    rank_stream.RankStream.complete = recording_complete
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(rank)
    posts = 20
    width = size * (posts + 1)
    mode = {"solo": hvd.Solo(), "majority": hvd.Majority(seed=1)}[mode_name]
    phase("posting")
    handle = None
    for step in range(posts + 1):
        x = np.zeros(width)
        x[rank * (posts + 1) + step] = 1.0
        if handle is not None:
            hvd.synchronize(handle)
        handle = hvd.partial_allreduce_async(x, "s", mode=mode, op=hvd.Sum)
        time.sleep(float(rng.uniform(0, 0.01)))  # compute of random length: the ranks out of step
    phase("shutdown")
    hvd.shutdown()  # the last post is still in flight on some ranks
    total = np.sum(recorded, axis=0) if recorded else np.zeros(width)
    # Every rank's 21 one-hot posts were summed exactly once, shutdown's flush included.
    assert total.tolist() == [1.0] * width, f"lost or doubled posts: {total}"
    assert handle.done(), "the post left in flight was not completed by shutdown"
    report({"rounds": len(recorded)})


if __name__ == "__main__":
    run_case()
