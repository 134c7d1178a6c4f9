"""Scenarios for the slow-rank report, the timeline and the stall inspector,
one registered case each (``observe_cases.py CASE [ARGS]``). Slow ranks
sleep; nothing spins. Each case asserts on every rank what that rank can
tell; what only the job's output or several ranks show is left to the test."""

import logging
import sys
import time

import numpy as np

from support import announce, await_announced, case, expect, phase, report, run_case, wait_until

import hvd_partial as hvd
from hvd_partial.observe import StalledRankError

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
        time.sleep(slow if rank == slow_rank else fast)  # the compute of a step: slow or fast
        hvd.partial_allreduce(grad, name, mode=mode)
        n += 1
    return n


@case(names=("report",))
def slow_rank_report(_name, mode_name):
    mode = {"solo": hvd.Solo(), "sync": hvd.Sync()}[mode_name]
    hvd.init(report_seconds=0.4, log_level="INFO")
    rank = hvd.rank()
    phase("posting")
    steps_for(2.0, rank, 2, 0.1, 0.004, "grads", mode)  # slow: 25x the fast ranks' compute
    # Wait for a status from every rank (they come every report_seconds).
    wait_until(lambda: all(p is not None for p in hvd.stats()["grads"]["posts_by_rank"]),
               "a status from every rank")
    s = hvd.stats()["grads"]
    assert s["holding_back"] == 2, (s["holding_back_reason"], s["compute_mean_s_by_rank"])
    assert "computes" in s["holding_back_reason"], s["holding_back_reason"]
    assert all(p is not None and p > 0 for p in s["posts_by_rank"]), s
    assert all(w is not None for w in s["wait_p95_s_by_rank"]), s
    assert s["rounds_per_second"] > 0 and s["elapsed_s"] > 1.0, s
    if rank == 0:
        compute = s["compute_mean_s_by_rank"]
        assert compute[2] > 0.035 and max(compute[j] for j in (0, 1, 3)) < 0.03, compute
        waits = s["wait_mean_s_by_rank"]
        if mode_name == "sync":  # the slow rank waits least: the others wait for it
            assert waits[2] < min(waits[j] for j in (0, 1, 3)), waits
        else:  # solo: the fast ranks post about 5x as often
            posts = s["posts_by_rank"]
            assert min(posts[j] for j in (0, 1, 3)) > 2 * posts[2], posts
    report({"rounds": s["rounds"]})
    hvd.shutdown()


@case
def timeline():
    from hvd_partial.observe.timeline import load_events, rank_path

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    filename = hvd.config().timeline_filename
    phase("posting")
    taken = {"solo": [], "sync": []}
    for step in range(12):
        time.sleep(0.002 * (rank + 1))  # compute of uneven length
        taken["solo"] += [r.round for r in hvd.partial_allreduce(np.ones(256, np.float32), "solo")]
        taken["sync"] += [r.round for r in hvd.partial_allreduce(np.ones(64), "sync", mode=hvd.Sync())]
    taken["solo"] += [r.round for r in hvd.flush("solo")]
    hvd.shutdown()
    # This rank's file, closed at shutdown: valid JSON, its spans only, every round in order.
    events = load_events(rank_path(filename, rank))
    assert {e["pid"] for e in events} == {rank}
    names = {e["name"] for e in events}
    assert {"process_name", "thread_name", "post", "activation", "reduction", "take", "wait", "flush"} <= names, names
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] > 0 and "stream" in e["args"], e
    posts = [e for e in events if e["name"] == "post"]
    waits = [e for e in events if e["name"] == "wait"]
    assert len(posts) == len(waits) == 24, (len(posts), len(waits))  # 12 steps x 2 streams
    reductions = {}
    for stream in ("solo", "sync"):
        rounds = [e["args"]["round"] for e in events if e["name"] == "reduction" and e["cat"] == stream]
        assert rounds == list(range(len(rounds))), (stream, rounds)  # in order, none missing
        assert set(taken[stream]) <= set(rounds), (stream, taken[stream], rounds)
        took = [r for e in events if e["name"] == "take" and e["cat"] == stream for r in e["args"]["rounds"]]
        assert took == taken[stream], (stream, took, taken[stream])
        reductions[stream] = [(e["args"]["round"], e["args"]["initiator"], str(e["args"]["contributors"]))
                              for e in events if e["name"] == "reduction" and e["cat"] == stream]
    report({"reductions": reductions, "events": len(events)})


class _Announcer(logging.Handler):
    """Announces ``event`` at the first record whose message holds ``text``."""

    def __init__(self, text, event):
        super().__init__(logging.WARNING)
        self.text, self.event, self.done = text, event, False

    def emit(self, record):
        if not self.done and self.text in record.getMessage():
            self.done = True
            announce(self.event)


@case
def stall_warn():
    # Phase A: every rank stops calling (an "evaluation"): no warning.
    # Phase B: rank 1 stops while the others wait in sync posts: warned, on
    # every rank; rank 1 calls again once every rank has warned.
    hvd.init(stall_warning_seconds=0.6)
    rank, size = hvd.rank(), hvd.size()
    x = np.ones(16)
    for _ in range(3):
        hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    phase("all idle")
    print(f"rank {rank} MARK all-idle-start", file=sys.stderr, flush=True)
    time.sleep(2.0)  # the duration under test: every rank idle for 3x stall_warning_seconds, and no warning
    hvd.barrier()
    logging.getLogger("hvd_partial.stall").addHandler(
        _Announcer("stall: rank 1 has called no hvd_partial function", f"warned on {rank}"))
    print(f"rank {rank} MARK stall-start", file=sys.stderr, flush=True)
    phase("rank 1 stalls")
    if rank == 1:
        await_announced(*(f"warned on {j}" for j in range(size)))  # its "stall": until every rank warned
    hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    report({"ok": True})
    hvd.shutdown()


@case
def stall_shutdown():
    hvd.init(stall_warning_seconds=0.5, stall_shutdown_seconds=1.5, abort_on_exception=False)
    rank = hvd.rank()
    engine = hvd.session.current().engine
    x = np.ones(16)
    hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
    started = time.monotonic()
    phase("stalling" if rank == 1 else "waiting for rank 1")
    try:
        if rank == 1:  # "hangs" in its own code until the stall shutdown failed its engine; its next call raises
            wait_until(lambda: engine.failure is not None, "the stall shutdown")
        try:
            hvd.partial_allreduce(x, "grads", mode=hvd.Sync())
            raise AssertionError("the call after the stall shutdown returned")
        except StalledRankError as err:
            seconds = time.monotonic() - started
            assert type(err).__name__ == "StalledRankError" and err.rank == 1, err
            assert isinstance(err, hvd.RankFailedError), type(err).__mro__
            assert "stall_shutdown_seconds=1.5" in str(err), err
            if rank != 1:
                assert 1.4 < seconds < 4.0, seconds  # shutdown time plus a status period or two
            report({"error": str(err), "rank": err.rank})
    finally:
        if rank == 1:
            announce("rank 1 is done")
    if rank != 1:  # the job ends when a rank exits: wait for rank 1's report first
        await_announced("rank 1 is done")
    sys.exit(3)


@case
def deadlock():
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
        raise AssertionError("the deadlocked call returned")
    except StalledRankError as err:
        seconds = time.monotonic() - started
        assert err.rank is None and "deadlock: every rank has waited" in str(err), err
        assert "rank 0 in barrier" in str(err) and "rank 1 in post 'grads'" in str(err), err
        assert 1.4 < seconds < 4.0, seconds
        report({"error": str(err), "rank": err.rank})
    sys.exit(3)


@case
def default_mode():
    # Launched by hvd-partial-run --mode majority --seed S --quorum Q: posts without mode= use it.
    from hvd_partial.modes import designated_initiator

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cfg = hvd.config()
    initiators = []
    for step in range(8):
        time.sleep(0.003 * rank)  # compute of uneven length
        initiators += [(r.round, r.initiator) for r in hvd.partial_allreduce(np.ones(4), "grads")]
    initiators += [(r.round, r.initiator) for r in hvd.flush("grads")]
    designated = [list(x) for x in initiators if x[1] is not None]
    expected = [[r, designated_initiator(cfg.seed, "grads", r, size)] for r, _ in designated]
    assert designated and designated == expected, (designated, expected)  # majority's designated initiators
    report({"mode": cfg.mode, "seed": cfg.seed, "quorum": cfg.quorum, "max_staleness": cfg.max_staleness,
            "stall": cfg.stall_warning_seconds, "initiators": designated, "size": size})
    hvd.shutdown()


@case
def horovod_share(shift):
    # A stand-in for an initialized horovod.torch module (Horovod is not installable here).
    import types

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    fake = types.ModuleType("horovod.torch")
    shift = int(shift)
    fake.is_initialized = lambda: True
    fake.mpi_enabled = lambda: True
    fake.rank = lambda: (world.Get_rank() + shift) % world.Get_size()
    fake.size = lambda: world.Get_size()
    sys.modules["horovod.torch"] = fake
    if shift == 0:  # the same ranks: init shares the communicator
        hvd.init()
        assert hvd.rank() == fake.rank() == world.Get_rank(), (hvd.rank(), fake.rank())
        hvd.shutdown()
    else:  # other ranks than COMM_WORLD's: refused, with the way out
        error = expect(hvd.ConfigError, hvd.init)
        assert "horovod.torch is initialized as rank" in error and "init(comm=...)" in error, error
    report({"ok": True})


if __name__ == "__main__":
    run_case()
