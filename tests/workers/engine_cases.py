"""Single-purpose multi-process scenarios, chosen by the first argument."""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from support import phase, report

import hvd_partial as hvd

case = sys.argv[1]


def expect(exc_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as err:
        return f"{type(err).__name__}: {err}"
    raise AssertionError(f"{fn.__name__} did not raise {exc_type.__name__}")


def local_stream(name):
    """This rank's protocol state of stream ``name`` (read-only, to wait on its progress)."""
    return hvd.session.current().engine._driver.streams[name]


def wait_until(condition, what, limit=60.0):
    """Wait for a condition of the engine's state; the test's timeout names a rank stuck here."""
    phase(f"waiting for {what}")
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {hvd.rank()}: {what} never came")
        time.sleep(0.001)


if case == "before_init":
    out = {"post": expect(hvd.NotInitializedError, hvd.partial_allreduce, np.ones(2), "x"),
           "rank": expect(hvd.NotInitializedError, hvd.rank)}
    hvd.init()
    hvd.partial_allreduce(np.ones(2), "x", mode=hvd.Sync())
    hvd.shutdown()
    out["after"] = expect(hvd.NotInitializedError, hvd.partial_allreduce, np.ones(2), "x")
    out["flush_after"] = expect(hvd.NotInitializedError, hvd.flush, "x")
    report(out)

elif case == "sync_equals_allreduce":
    hvd.init()
    rank = hvd.rank()
    rng = np.random.default_rng(100 + rank)
    same, same_nonblocking, same_in_place, close, ints = True, True, True, True, True
    for step, n in enumerate([1, 7, 1000, 70_000]):
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal(n).astype(dtype)
            expected = np.empty_like(x)
            MPI.COMM_WORLD.Allreduce(x, expected, op=MPI.SUM)
            nonblocking = np.empty_like(x)
            MPI.COMM_WORLD.Iallreduce(x, nonblocking, op=MPI.SUM).Wait()
            in_place = x.copy()
            MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, in_place, op=MPI.SUM).Wait()
            (got,) = hvd.partial_allreduce(x, f"s{n}{np.dtype(dtype).name}", mode=hvd.Sync(), op=hvd.Sum)
            avg = hvd.partial_allreduce(x, f"a{n}{np.dtype(dtype).name}", mode=hvd.Sync())[0].array
            same &= bool(np.array_equal(got.array, expected))
            same_nonblocking &= bool(np.array_equal(got.array, nonblocking))
            same_nonblocking &= bool(np.array_equal(avg, nonblocking / hvd.size()))
            same_in_place &= bool(np.array_equal(got.array, in_place))
            same_in_place &= bool(np.array_equal(avg, in_place / hvd.size()))
            close &= bool(np.allclose(got.array, expected, rtol=1e-5, atol=1e-5))
        k = rng.integers(-1000, 1000, n).astype(np.int64)
        k_expected = np.empty_like(k)
        MPI.COMM_WORLD.Allreduce(k, k_expected, op=MPI.SUM)
        ints &= bool(np.array_equal(hvd.partial_allreduce(k, f"i{n}", mode=hvd.Sync(), op=hvd.Sum)[0].array,
                                    k_expected))
    helper = hvd.allreduce(np.arange(5.0) * (rank + 1), op=hvd.Sum)
    report({"same": same, "same_nonblocking": same_nonblocking, "same_in_place": same_in_place, "close": close,
            "ints": ints, "helper": helper, "library": MPI.Get_library_version().split()[0]})
    hvd.shutdown()

elif case == "grouped":
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    arrays = [np.full((2, 3), rank, np.float32), np.arange(4, dtype=np.float64) * rank,
              np.full(5, rank + 1, np.float32)]
    rounds = []
    for step in range(5):
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "group", op=hvd.Sum))
    rounds += hvd.flush("group")
    totals = [np.sum([r.arrays[i] for r in rounds], axis=0) for i in range(3)]
    report({"totals": totals, "shapes": [list(a.shape) for a in rounds[0].arrays],
            "dtypes": [a.dtype.name for a in rounds[0].arrays]})
    hvd.shutdown()

elif case == "helpers":
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    out = {
        "bcast": hvd.broadcast(np.arange(3.0) + rank, root_rank=size - 1),
        "obj": hvd.broadcast_object({"from": rank}, root_rank=size - 1),
        "gather": hvd.allgather_object(("r", rank)),
        "avg": hvd.allreduce(np.array([float(rank)])),
    }
    hvd.barrier()
    out["mismatch"] = expect(hvd.MismatchError, hvd.allreduce, np.ones(2 + (rank == 0)))
    out["still_works"] = hvd.allreduce(np.ones(1), op=hvd.Sum)
    report(out)
    hvd.shutdown()

elif case == "shape_mismatch" or case == "dtype_mismatch" or case == "mode_mismatch":
    hvd.init()
    rank = hvd.rank()
    x = np.ones(4, np.float32)
    mode = hvd.Solo()
    if rank == 1:
        if case == "shape_mismatch":
            x = np.ones(5, np.float32)
        elif case == "dtype_mismatch":
            x = np.ones(4, np.float64)
        else:
            mode = hvd.Majority()
    out = {"error": expect(hvd.MismatchError, hvd.partial_allreduce, x, "grads", mode=mode)}
    # The library stays usable after the failed registration.
    out["after"] = hvd.partial_allreduce(np.ones(2), "other", mode=hvd.Sync(), op=hvd.Sum)[0].array
    report(out)
    hvd.shutdown()

elif case == "local_misuse":
    hvd.init()
    out = {}
    hvd.partial_allreduce(np.ones(4), "grads", mode=hvd.Solo())
    out["reshape"] = expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(5), "grads")
    out["remode"] = expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(4), "grads", mode=hvd.Sync())
    out["noncontig"] = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones((4, 4))[:, 0], "nc")
    out["dtype"] = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, np.complex64), "c")
    out["bool"] = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, bool), "b")
    out["list"] = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, [1.0, 2.0], "l")
    out["int_avg"] = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, np.int64), "i")
    out["bad_mode"] = expect(TypeError, hvd.partial_allreduce, np.ones(4), "m", mode="solo")
    out["bad_tau"] = expect(hvd.ConfigError, hvd.partial_allreduce, np.ones(4), "t", max_staleness=-1)
    # One outstanding post per stream, checked in turns on a sync stream: its
    # round cannot complete (and end the first post) while the other rank
    # holds back its own post.
    hvd.partial_allreduce(np.ones(4), "dbl", mode=hvd.Sync())  # registered on both ranks
    for turn in range(2):
        if hvd.rank() == turn:
            handle = hvd.partial_allreduce_async(np.ones(4), "dbl", mode=hvd.Sync())
            second = hvd.partial_allreduce_async(np.ones(4), "dbl", mode=hvd.Sync())
            out["double_post"] = expect(hvd.StreamConflictError, hvd.synchronize, second)
            MPI.COMM_WORLD.send(None, dest=1 - turn, tag=78)
            hvd.synchronize(handle)
        else:
            MPI.COMM_WORLD.recv(source=turn, tag=78)
            hvd.partial_allreduce(np.ones(4), "dbl", mode=hvd.Sync())
    out["flush_unknown"] = expect(hvd.StreamConflictError, hvd.flush, "never-posted")
    # A stream's layout is derived once and reused while its posts keep their shapes; after the
    # refused reshape above, a post of the first shape still goes through.
    layouts = hvd.session.current().layouts
    hvd.partial_allreduce(np.ones(3), "same", mode=hvd.Sync(), op=hvd.Sum)
    first = layouts["same"][1]
    out["same_sum"] = hvd.partial_allreduce(np.ones(3), "same", mode=hvd.Sync(), op=hvd.Sum)[0].array.tolist()
    out["layout_reused"] = layouts["same"][1] is first
    out["reshape_again"] = expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(2), "same", mode=hvd.Sync())
    out["layout_replaced"] = layouts["same"][1] is not first
    hvd.flush("grads")
    report(out)
    hvd.shutdown()

elif case == "raise":
    # Rank 1 dies of an uncaught exception mid-run; the others must fail fast.
    hvd.init(failure_timeout_seconds=30)
    rank = hvd.rank()
    phase("posting")
    started = time.monotonic()
    try:
        for step in range(1000):
            if rank == 1 and step == 5:
                raise ValueError("injected failure in the training step")
            hvd.partial_allreduce(np.ones(8), "grads", mode=hvd.Sync())
            time.sleep(0.01)
        report({"error": None})
    except hvd.RankFailedError as err:
        report({"error": str(err), "failed_rank": err.rank, "seconds": time.monotonic() - started})
        raise

elif case in ("die", "stop"):
    # Rank 1 is killed (SIGKILL) or frozen (SIGSTOP) with no Python exit path;
    # the others notice through liveness, or the launcher tears the job down.
    hvd.init(failure_timeout_seconds=3, heartbeat_seconds=0.5)
    rank = hvd.rank()
    phase("posting")
    stopped_at = None
    try:
        for step in range(100000):
            if rank == 1 and step == 5:
                if case == "stop":  # the survivors' detection time is measured from here
                    stopped_at = time.time()
                    report({"stopped_at": stopped_at})
                os.kill(os.getpid(), signal.SIGKILL if case == "die" else signal.SIGSTOP)
            hvd.partial_allreduce(np.ones(8), "grads", mode=hvd.Solo())
            time.sleep(0.01)
        report({"error": None})
    except hvd.RankFailedError as err:
        report({"error": str(err), "failed_rank": err.rank, "failed_at": time.time(), "stopped_at": stopped_at})
        raise

elif case == "shutdown_in_flight":
    # Posts never synchronized, then shutdown: nothing posted may be lost.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    got = []
    for step in range(6):
        x = np.zeros(size * 7)
        x[rank * 7 + step] = 1.0
        got += hvd.partial_allreduce(x, "s", mode=hvd.Solo(), op=hvd.Sum)
        time.sleep(0.002 * rank)
    last = np.zeros(size * 7)
    last[rank * 7 + 6] = 1.0
    handle = hvd.partial_allreduce_async(last, "s", mode=hvd.Solo(), op=hvd.Sum)
    got += hvd.synchronize(handle)
    got += hvd.flush("s")
    report({"summed": np.sum([r.array for r in got], axis=0)})
    hvd.shutdown()

elif case == "many_streams":
    # Streams registered and posted in a different order on every rank, all in
    # flight at once, in mixed modes: per-stream communicators keep them apart.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    modes = [hvd.Solo(), hvd.Sync(), hvd.Majority(seed=3), hvd.Solo()]
    names = [f"stream{i}" for i in range(len(modes))]
    order = list(range(len(names)))
    rng = np.random.default_rng(rank)
    sums = {n: np.zeros(4) for n in names}
    posted = {n: np.zeros(4) for n in names}
    for step in range(8):
        rng.shuffle(order)
        handles = []
        for i in order:
            x = np.full(4, float(rank * 100 + step + i))
            posted[names[i]] += x
            handles.append((names[i], hvd.partial_allreduce_async(x, names[i], mode=modes[i], op=hvd.Sum)))
        for name, handle in handles:
            for r in hvd.synchronize(handle):
                sums[name] += r.array
        time.sleep(0.001 * rank)
    # flush is collective: the same order everywhere. The majority stream goes first: a rank whose
    # last post missed the last round waits for that round's designated rank, which would otherwise
    # be blocked in the flush of another stream (a majority round waits for its designated rank's
    # next post or flush).
    for i in sorted(range(len(names)), key=lambda i: not isinstance(modes[i], hvd.Majority)):
        name = names[i]
        for r in hvd.flush(name):
            sums[name] += r.array
    report({"sums": {n: sums[n] for n in names}, "posted": {n: posted[n] for n in names}})
    hvd.shutdown()

elif case == "sub_communicators":
    # Two independent worlds on one job, split from COMM_WORLD with
    # interleaved members ({0, 2} and {1, 3}); rank 4 is in neither.
    world = MPI.COMM_WORLD.Get_rank()
    sub = MPI.COMM_WORLD.Split(MPI.UNDEFINED if world == 4 else world % 2, key=world)
    if world == 4:
        report({"null": expect(hvd.ConfigError, hvd.init, sub), "not_comm": expect(hvd.ConfigError, hvd.init, 7),
                "initialized": hvd.is_initialized()})
    else:
        hvd.init(sub)
        got = []
        for step in range(6):
            x = np.zeros(4 * 6)
            x[world * 6 + step] = 1.0
            got += hvd.partial_allreduce(x, "g", mode=hvd.Solo(), op=hvd.Sum)
            time.sleep(0.02 * hvd.rank())  # the second member of each world is slower
        got += hvd.flush("g")
        report({"rank": hvd.rank(), "size": hvd.size(), "members": hvd.allgather_object(world),
                "summed": np.sum([r.array for r in got], axis=0),
                "rounds": [[r.round, r.contributors, r.array.tolist()] for r in got],
                "bcast": hvd.broadcast_object(world, root_rank=1)})
        hvd.shutdown()

elif case == "too_many_streams":
    # One stream per array, thousands of them: each holds a communicator, and
    # MPI runs out of them (MPICH after about 2,040). With "quorum": majority
    # streams with a quorum, whose counters share one window made at init.
    hvd.init()
    out = {"library": MPI.Get_library_version().split()[0], "failed_at": None}
    mode = hvd.Majority(quorum=2) if sys.argv[3:] == ["quorum"] else hvd.Sync()
    quorum = sys.argv[3:] == ["quorum"]
    for i in range(int(sys.argv[2])):
        try:
            hvd.partial_allreduce(np.ones(1, np.float32), f"tensor{i}", mode=mode)
        except hvd.HvdPartialError as err:
            out.update(failed_at=i, error=f"{type(err).__name__}: {err}")
            if not quorum:
                out["later"] = expect(hvd.HvdPartialError, hvd.partial_allreduce, np.ones(1), "x")
            break
    if out["failed_at"] is not None and quorum:
        # A full window refuses only the new stream: the engine and the streams it has go on.
        out["again"] = expect(hvd.TooManyStreamsError, hvd.partial_allreduce, np.ones(1, np.float32),
                              f"tensor{out['failed_at']}", mode=mode)
        taken = hvd.partial_allreduce(np.ones(1, np.float32), "tensor0", mode=mode) + hvd.flush("tensor0")
        out["old_stream"] = [r.round for r in taken]
        out["no_quorum"] = [r.array.tolist() for r in hvd.partial_allreduce(np.ones(1), "y", mode=hvd.Sync(),
                                                                            op=hvd.Sum)]
    hvd.shutdown()
    report(out)

elif case == "sync_uneven":
    # Rank 0 posts 3 times to a sync stream, the others 4 times. "late": the
    # 4th posts come after rank 0 began flushing and are refused; "in_flight":
    # they come first, so their round can never complete.
    timing = sys.argv[2]
    hvd.init()
    rank = hvd.rank()
    got = [r for _ in range(3) for r in hvd.partial_allreduce(np.ones(2), "g", mode=hvd.Sync(), op=hvd.Sum)]
    out = {"rounds": [r.round for r in got]}
    stream = local_stream("g")
    try:
        if rank == 0:
            if timing == "in_flight":  # flush once every other rank has started its round 3
                for peer in range(1, hvd.size()):
                    MPI.COMM_WORLD.recv(source=peer, tag=77)
            got += hvd.flush("g")
        else:
            if timing == "late":  # post once rank 0's flush is known on this rank
                wait_until(lambda: stream.flush_begun is not None, "rank 0's flush notice")
                out["extra"] = expect(hvd.MismatchError, hvd.partial_allreduce, np.ones(2), "g", mode=hvd.Sync(),
                                      op=hvd.Sum)
            else:
                handle = hvd.partial_allreduce_async(np.ones(2), "g", mode=hvd.Sync(), op=hvd.Sum)
                wait_until(lambda: stream.started == 4, "this rank's round 3")
                MPI.COMM_WORLD.send(None, dest=0, tag=77)
                try:  # its own MismatchError, or a peer's failure notice if that came first
                    hvd.synchronize(handle)
                    out["extra"] = "no error"
                except hvd.HvdPartialError as err:
                    out["extra"] = f"{type(err).__name__}: {err}"
            got += hvd.flush("g")  # the way out once refused: flush like rank 0
        out["rounds"] = [r.round for r in got]
        out["summed"] = np.sum([r.array for r in got], axis=0)
        hvd.shutdown()
        out["shutdown"] = True
    except hvd.HvdPartialError as err:
        out["error"] = f"{type(err).__name__}: {err}"
    report(out)

elif case == "no_leak":
    # A shut-down engine, with its result buffers, is freed at once, not
    # left for a full garbage collection (which may never come).
    import gc
    import weakref

    gc.disable()
    engines = []
    for cycle in range(3):
        hvd.init()
        hvd.partial_allreduce(np.ones(1 << 16, np.float32), "solo", mode=hvd.Solo())
        hvd.partial_allreduce(np.ones(1 << 16, np.float32), "sync", mode=hvd.Sync())
        engines.append(weakref.ref(hvd.session.current().engine))
        hvd.shutdown()
    report({"alive_after_shutdown": sum(ref() is not None for ref in engines)})

elif case == "reinit":
    # init -> shutdown -> init: the second run starts from nothing (a stream
    # name may come back with other settings; config and stats are the new run's).
    out = {}
    hvd.init(max_staleness=3)
    first = hvd.session.current()
    out["first"] = [r.round for r in hvd.partial_allreduce(np.ones(4), "s", mode=hvd.Solo(), op=hvd.Sum)]
    out["first_tau"] = hvd.config().max_staleness
    hvd.shutdown()
    out["between"] = expect(hvd.NotInitializedError, hvd.rank)
    out["session_dropped"] = hvd.session.current() is None
    hvd.init(max_staleness=5)
    out["new_session"] = hvd.session.current() is not first
    out["second_tau"] = hvd.config().max_staleness
    got = [hvd.partial_allreduce(np.full(3, 2.0, np.float32), "s", mode=hvd.Sync(), op=hvd.Sum) for _ in range(2)]
    out["second"] = [[r.round, r.array.tolist()] for rounds in got for r in rounds]
    out["stats_rounds"] = hvd.stats()["s"]["rounds"]
    out["rank"] = hvd.rank()
    hvd.shutdown()
    report(out)

elif case == "stale_message":
    # A control message sent in one session and never received must not reach the next
    # session (MPI reuses a freed communicator's context; floods leave late copies behind).
    from hvd_partial.transport.mpi import MpiTransport
    from hvd_partial.transport.tags import TAG_PROTOCOL

    rank = MPI.COMM_WORLD.Get_rank()
    first = MpiTransport(doorbell=False)
    if rank == 0:
        first.send(1, TAG_PROTOCOL, "from the first session")
        while first.progress_sends():
            pass
    elif rank == 1:
        while not first.control.Iprobe(0, MPI.ANY_TAG):  # it has arrived, and stays unreceived
            pass
    first.control.Barrier()
    first.free()
    second = MpiTransport(doorbell=False)
    if rank == 0:
        second.send(1, TAG_PROTOCOL, "from the second session")
    got = []
    if rank == 1:
        while not got:
            got = [m for _, _, m in second.receive()]
    second.control.Barrier()
    second.free()
    report({"got": got})

elif case == "sessions_back_to_back":
    # Several init ... shutdown in a row, solo and majority streams out of step: each session
    # starts from round 0 and loses nothing, whatever the last one left in flight.
    rank = MPI.COMM_WORLD.Get_rank()
    out = []
    for session in range(4):
        hvd.init()
        size = hvd.size()
        total, rounds = 0.0, []
        mode = hvd.Solo() if session % 2 == 0 else hvd.Majority(seed=session)
        for step in range(25):
            if (step + rank) % 4 == 0:
                time.sleep(0.002)  # compute of uneven length
            for r in hvd.partial_allreduce(np.ones(2), "g", mode=mode, op=hvd.Sum):
                total += float(r.array[0])
                rounds.append(r.round)
        for r in hvd.flush("g"):
            total += float(r.array[0])
            rounds.append(r.round)
        hvd.shutdown()
        out.append({"total": total, "first_round": rounds[0], "in_order": rounds == list(range(len(rounds)))})
    report({"sessions": out, "size": size})

elif case == "fusion_buckets":
    # A grouped solo stream whose fused buffers are bounded by a small
    # fusion_threshold_bytes: several MPI buffers, one stream, so every
    # bucket takes the same rounds; ranks out of step lose nothing.
    hvd.init(fusion_threshold_bytes=int(sys.argv[2]))
    rank, size = hvd.rank(), hvd.size()
    shapes = [(256,), (64, 4), (300,), (16,), (500,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float64]
    posted = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    taken = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    rounds = []
    for step in range(10):
        time.sleep(0.003 * ((rank + step) % size))  # out of step: stale and fresh contributions mix
        arrays = [np.full(s, float(rank + 1 + step + i), d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        for acc, a in zip(posted, arrays):
            acc += a
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "fused", mode=hvd.Solo(), op=hvd.Sum))
    rounds += hvd.flush("fused")
    for r in rounds:
        for acc, a in zip(taken, r.arrays):
            acc += a
    everyone = [np.asarray(MPI.COMM_WORLD.allreduce(p)) for p in posted]
    layout_groups = hvd.session.current().engine._driver.streams["fused"].layout.groups
    report({"conserved": [bool(np.array_equal(t, e)) for t, e in zip(taken, everyone)],
            "buckets": [list(idx) for _, idx in layout_groups],
            "rounds": [(r.round, [float(a.sum()) for a in r.arrays]) for r in rounds]})
    hvd.shutdown()

elif case == "doorbell":
    # Only rank 1 posts to a solo stream; the other engines are idle, polling
    # every idle_poll_ms (without doorbells) or doorbell_poll_ms (with), both
    # long here. Each round needs every engine, so a post waits for the
    # others' next poll unless their doorbells wake them.
    hvd.init(idle_poll_ms=float(sys.argv[2]), doorbell_poll_ms=float(sys.argv[2]))
    rank = hvd.rank()
    engine = hvd.session.current().engine
    waits = []
    if rank == 1:
        hvd.partial_allreduce(np.ones(4), "bell", mode=hvd.Solo())  # registration
        for _ in range(5):  # within max_staleness: the others take no rounds meanwhile
            time.sleep(0.8)  # the other engines back off to sleeping idle_poll_ms at a time
            started = time.perf_counter()
            hvd.partial_allreduce(np.ones(4), "bell", mode=hvd.Solo())
            waits.append(time.perf_counter() - started)
    else:
        hvd.partial_allreduce(np.ones(4), "bell", mode=hvd.Solo())
        time.sleep(6.0)  # outside any call: the engine is idle (a barrier would keep it polling)
    hvd.barrier()
    results = hvd.flush("bell")
    report({"waits": waits, "bell": engine._bell is not None,
            "reachable": engine._bell.reachable if engine._bell is not None else 0,
            "flushed_round": results[-1].round})
    hvd.shutdown()

elif case == "wakeups":
    # Posts at every distance from the previous one: inside the engine's spin
    # window (no wake-up sent), at its edge, and long after (the engine sleeps
    # idle_poll_ms, 2 s here, at a time). A wake-up lost at the edge between
    # spinning and sleeping would cost a post the rest of a 2 s sleep.
    hvd.init(idle_poll_ms=2000.0, doorbell_poll_ms=2000.0)
    spin = hvd.session.current().engine.config.spin_us / 1e6
    gaps = [0.0, spin / 2, spin * 0.9, spin, spin * 1.1, spin * 2, 1e-3, 5e-3, 0.03]
    order = np.random.default_rng(7).permutation(np.repeat(np.arange(len(gaps)), 12))  # same on every rank
    hvd.partial_allreduce(np.ones(4), "w", mode=hvd.Sync())
    waits = []
    for k in order:
        time.sleep(gaps[k])
        started = time.perf_counter()
        hvd.partial_allreduce(np.ones(4), "w", mode=hvd.Sync())
        waits.append(time.perf_counter() - started)
    report({"waits": waits, "spin": spin})
    hvd.shutdown()

elif case == "large_rounds":
    # Buffers past the mapped-allocation threshold, reductions long enough for
    # the engine to space out its tests (reduce_poll_us from the environment),
    # and in solo the ranks out of step: zeros sent, stale and fresh posts
    # summed into one contribution, fused and lone arrays side by side.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(5 + rank)
    big = rng.integers(-1000, 1000, 700_000).astype(np.float64)
    expected = np.empty_like(big)
    MPI.COMM_WORLD.Allreduce(big, expected, op=MPI.SUM)
    sync_same = bool(np.array_equal(hvd.partial_allreduce(big, "big", mode=hvd.Sync(), op=hvd.Sum)[0].array,
                                    expected))
    shapes = [(600_000,), (1000, 600), (200_000,)]  # float32 fused: 4.8 MB, mapped
    dtypes = [np.float32, np.float32, np.float64]
    rounds = []
    posted = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    for step in range(12):
        time.sleep(0.004 * ((rank + step) % size))
        arrays = [np.full(s, (rank + 1) * (step + 1) + i, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        for acc, a in zip(posted, arrays):
            acc += a
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "solo", mode=hvd.Solo(), op=hvd.Sum))
    rounds += hvd.flush("solo")
    mine = [np.sum([r.arrays[i] for r in rounds], axis=0) for i in range(3)]
    everyone = [MPI.COMM_WORLD.allreduce(p.sum()) for p in posted]
    digests = [(r.round, [float(a.sum()) for a in r.arrays]) for r in rounds]
    report({"sync_same": sync_same, "conserved": [bool(float(m.sum()) == float(e)) for m, e in zip(mine, everyone)],
            "uniform": [bool((m == m.flat[0]).all()) for m in mine], "digests": digests,
            "stale": int(sum(sum(v > 0 for v in r.staleness.values()) for r in rounds)),
            "poll": hvd.session.current().engine.config.reduce_poll_us})
    hvd.shutdown()

elif case == "rung_receive":
    # The transport alone, no engine: the last rank sends rank 0 a control
    # message and rings its doorbell; rank 0, asleep on the bell, must get
    # the message from one receive call (it may need several probes).
    from hvd_partial.transport.mpi import TAG_PROTOCOL, MpiTransport

    transport = MpiTransport(MPI.COMM_WORLD)
    sender = transport.size - 1
    in_one_call = 0
    for i in range(60):
        transport.barrier()
        if transport.rank == sender:
            time.sleep(0.002)  # rank 0 is asleep on its bell by then
            transport.send(0, TAG_PROTOCOL, ("start", i))
            while transport.progress_sends():
                pass
        elif transport.rank == 0:
            assert transport.doorbell.wait(10.0), "the ring never came"
            got = transport.receive(transport.doorbell.take_ring())
            in_one_call += bool(got)
            while not got:
                got = transport.receive()
            assert got == [(sender, TAG_PROTOCOL, ("start", i))], got
    transport.barrier()
    report({"in_one_call": in_one_call, "of": 60})
    transport.free()

elif case == "waiting_cpu":
    # Posts that wait for another rank's computation (a majority round's
    # designated rank) must leave the CPU to the ranks computing.
    from hvd_partial.modes import designated_initiator

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    last = size - 1
    seed = next(s for s in range(10_000) if designated_initiator(s, "m", 1, size) == last)
    mode = hvd.Majority(seed=seed)
    hvd.partial_allreduce(np.ones(4), "m", mode=mode)  # round 0: every rank
    engine = hvd.session.current().engine
    naps = []  # the engine's sleeps while this rank waits: its wake-ups, whatever the machine's load
    sleep = engine._pacing._nap
    engine._pacing._nap = lambda seconds: naps.append(seconds) or sleep(seconds)
    # Line the ranks up with a sync post, not a barrier: a rank in a barrier is parked, and the
    # designated rank would start round 1 there, without waiting for its own post.
    hvd.partial_allreduce(np.ones(1), "line up", mode=hvd.Sync())
    cpu0, wall0, naps_before = time.process_time(), time.monotonic(), len(naps)
    if rank == last:
        time.sleep(1.0)  # "computing"; round 1 starts when this rank posts
    rounds = hvd.partial_allreduce(np.ones(4), "m", mode=mode)
    machine = engine._driver.control.streams[local_stream("m").id]
    report({"cpu_fraction": (time.process_time() - cpu0) / (time.monotonic() - wall0),
            "naps": len(naps) - naps_before,
            "waited": time.monotonic() - wall0, "round": rounds[-1].round, "initiator": rounds[-1].initiator,
            "joined_early": machine.stats.joined_early, "contributors": rounds[-1].contributors})
    hvd.flush("m")
    hvd.shutdown()

elif case == "idle_cpu":
    # An idle engine must leave the CPU to the training thread.
    hvd.init()
    hvd.partial_allreduce(np.ones(4), "warm", mode=hvd.Solo())
    hvd.barrier()
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(2.0)
    report({"cpu_fraction": (time.process_time() - cpu0) / (time.monotonic() - wall0)})
    hvd.shutdown()

else:
    raise SystemExit(f"unknown case {case}")
