"""Fault scenarios run through the launcher: ``launch_faults.py CASE TOKEN``.

TOKEN only marks the command line, so the test can check that no process of
the job is left behind."""

import os
import signal
import sys
import time

import numpy as np

from support import phase, report

import hvd_partial as hvd

case = sys.argv[1]


def failed(err, started):
    return {"error": str(err), "failed_rank": err.rank, "type": type(err).__name__,
            "seconds": time.monotonic() - started}


if case in ("kill_mid_round", "stop_mid_round"):
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
                os.kill(os.getpid(), signal.SIGKILL if case == "kill_mid_round" else signal.SIGSTOP)
            hvd.synchronize(handle)
            time.sleep(0.01)
        report({"error": None})
    except hvd.RankFailedError as err:
        report(failed(err, started))
        raise

elif case == "raise":
    hvd.init(failure_timeout_seconds=30)
    rank = hvd.rank()
    started = time.monotonic()
    phase("posting")
    try:
        for step in range(10000):
            if rank == 1 and step == 4:
                raise KeyError("injected failure in rank 1's training step")
            hvd.partial_allreduce(np.ones(64, np.float32), "grads", mode=hvd.Majority(seed=3))
            time.sleep(0.005)
        report({"error": None})
    except hvd.RankFailedError as err:
        report(failed(err, started))
        raise

elif case == "shutdown_in_flight":
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
    mode = {"solo": hvd.Solo(), "majority": hvd.Majority(seed=1)}[sys.argv[3]]
    phase("posting")
    handle = None
    for step in range(posts + 1):
        x = np.zeros(width)
        x[rank * (posts + 1) + step] = 1.0
        if handle is not None:
            hvd.synchronize(handle)
        handle = hvd.partial_allreduce_async(x, "s", mode=mode, op=hvd.Sum)
        time.sleep(float(rng.uniform(0, 0.01)))
    phase("shutdown")
    hvd.shutdown()  # the last post is still in flight on some ranks
    total = np.sum(recorded, axis=0) if recorded else np.zeros(width)
    report({"total": total.tolist(), "rounds": len(recorded), "handle_done": handle.done()})

else:
    raise SystemExit(f"unknown case {case}")
