"""Scenarios for the slow-rank report, the timeline and the stall inspector,
chosen by the first argument. Slow ranks sleep; nothing spins."""

import logging
import os
import sys
import time

import numpy as np

from support import phase, report

import hvd_partial as hvd
from hvd_partial.observe import StalledRankError

case = sys.argv[1]


def wait_for_report(rank, limit=30.0):
    """Wait until ``rank`` has reported (the test's timeout covers a rank that never does)."""
    path = os.path.join(os.environ["HVD_TEST_OUT"], f"rank{rank}.json")
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def steps_for(seconds, rank, slow_rank, slow, fast, name, mode):
    """Post for ``seconds``: ``slow_rank`` computes ``slow`` s per step, the rest ``fast``."""
    end = time.monotonic() + seconds
    n = 0
    grad = np.full(1024, float(rank + 1), np.float32)
    # A sync post waits for every rank's: all must post equally often, so a
    # sync run counts steps instead of watching its own clock.
    sync_steps = int(seconds / slow) if mode.kind == "sync" else None
    while (n < sync_steps) if sync_steps is not None else (time.monotonic() < end):
        time.sleep(slow if rank == slow_rank else fast)
        hvd.partial_allreduce(grad, name, mode=mode)
        n += 1
    return n


if case == "report":
    mode = {"solo": hvd.Solo(), "sync": hvd.Sync()}[sys.argv[2]]
    hvd.init(report_seconds=0.4, log_level="INFO")
    rank = hvd.rank()
    phase("posting")
    posts = steps_for(2.0, rank, 2, 0.1, 0.004, "grads", mode)  # slow: 25x the fast ranks' compute
    # Wait for a status from every rank (they come every report_seconds).
    deadline = time.monotonic() + 30
    while True:
        stats = hvd.stats()["grads"]
        if all(p is not None for p in stats["posts_by_rank"]) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    report({"posts": posts, "stats": stats})
    hvd.shutdown()

elif case == "timeline":
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    phase("posting")
    taken = {"solo": [], "sync": []}
    for step in range(12):
        time.sleep(0.002 * (rank + 1))
        taken["solo"] += [r.round for r in hvd.partial_allreduce(np.ones(256, np.float32), "solo")]
        taken["sync"] += [r.round for r in hvd.partial_allreduce(np.ones(64), "sync", mode=hvd.Sync())]
    taken["solo"] += [r.round for r in hvd.flush("solo")]
    report({"taken": taken, "file": hvd.config().timeline_filename})
    hvd.shutdown()

elif case == "stall_warn":
    # Phase A: every rank stops calling (an "evaluation"): no warning.
    # Phase B: rank 1 stops while the others wait in sync posts: warned.
    hvd.init(stall_warning_seconds=0.6)
    rank = hvd.rank()
    x = np.ones(16)
    for _ in range(3):
        hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    phase("all idle")
    print(f"rank {rank} MARK all-idle-start", file=sys.stderr, flush=True)
    time.sleep(2.0)
    hvd.barrier()
    print(f"rank {rank} MARK stall-start", file=sys.stderr, flush=True)
    phase("rank 1 stalls")
    if rank == 1:
        time.sleep(2.5)
    hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    report({"ok": True})
    hvd.shutdown()

elif case == "stall_shutdown":
    hvd.init(stall_warning_seconds=0.5, stall_shutdown_seconds=1.5, abort_on_exception=False)
    rank = hvd.rank()
    x = np.ones(16)
    hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    started = time.monotonic()
    phase("stalling" if rank == 1 else "waiting for rank 1")
    if rank == 1:
        time.sleep(5.0)  # "hangs" in its own code; its next call raises
    try:
        hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
        report({"error": None})
    except StalledRankError as err:
        report({"error": str(err), "type": type(err).__name__, "rank": err.rank,
                "is_rank_failed": isinstance(err, hvd.RankFailedError), "seconds": time.monotonic() - started})
    if rank != 1:  # the job ends when a rank exits: wait for rank 1's report first
        wait_for_report(1)
    sys.exit(3)

elif case == "deadlock":
    # Rank 0 waits in a barrier, the others in a sync post: every rank waits for the others.
    hvd.init(stall_warning_seconds=0.5, stall_shutdown_seconds=1.5, abort_on_exception=False)
    rank = hvd.rank()
    started = time.monotonic()
    phase("deadlocked")
    try:
        if rank == 0:
            hvd.barrier()
        else:
            hvd.partial_allreduce(np.ones(4), "grads", mode=hvd.Sync())
        report({"error": None})
    except StalledRankError as err:
        report({"error": str(err), "rank": err.rank, "seconds": time.monotonic() - started})
    sys.exit(3)

elif case == "default_mode":
    # Launched by hvd-partial-run --mode majority --seed S --quorum Q: posts without mode= use it.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cfg = hvd.config()
    initiators = []
    for step in range(8):
        time.sleep(0.003 * rank)
        initiators += [(r.round, r.initiator) for r in hvd.partial_allreduce(np.ones(4), "grads")]
    initiators += [(r.round, r.initiator) for r in hvd.flush("grads")]
    from hvd_partial.modes import designated_initiator

    expected = [(r, designated_initiator(cfg.seed, "grads", r, size)) for r, i in initiators if i is not None]
    report({"mode": cfg.mode, "seed": cfg.seed, "quorum": cfg.quorum, "max_staleness": cfg.max_staleness,
            "stall": cfg.stall_warning_seconds, "initiators": [list(x) for x in initiators if x[1] is not None],
            "expected": [list(x) for x in expected], "size": size})
    hvd.shutdown()

elif case == "horovod_share":
    # A stand-in for an initialized horovod.torch module (Horovod is not installable here).
    import types

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    fake = types.ModuleType("horovod.torch")
    shift = int(sys.argv[2])
    fake.is_initialized = lambda: True
    fake.mpi_enabled = lambda: True
    fake.rank = lambda: (world.Get_rank() + shift) % world.Get_size()
    fake.size = lambda: world.Get_size()
    sys.modules["horovod.torch"] = fake
    try:
        hvd.init()
        out = {"rank": hvd.rank(), "horovod_rank": fake.rank(), "error": None}
        hvd.shutdown()
    except hvd.ConfigError as err:
        out = {"error": str(err)}
    report(out)

else:
    raise SystemExit(f"unknown case {case}")
