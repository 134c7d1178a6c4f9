"""Single-purpose multi-process scenarios, one registered case each
(``engine_cases.py CASE [ARGS]``). Each case asserts on every rank what that
rank can tell; it reports what the test compares across ranks or runs."""

import os
import re
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from support import announce, await_announced, case, expect, phase, report, run_case, wait_until

import hvd_partial as hvd


def engine():
    return hvd.session.current().engine


def doorbells_on() -> bool:
    return os.environ.get("HVD_PARTIAL_DOORBELL", "1") != "0"


@case
def before_init():
    post = expect(hvd.NotInitializedError, hvd.partial_allreduce, np.ones(2), "x")
    assert post.startswith("NotInitializedError") and "before init" in post, post
    expect(hvd.NotInitializedError, hvd.rank)
    hvd.init()
    hvd.partial_allreduce(np.ones(2), "x", mode=hvd.Sync())
    hvd.shutdown()
    after = expect(hvd.NotInitializedError, hvd.partial_allreduce, np.ones(2), "x")
    flush_after = expect(hvd.NotInitializedError, hvd.flush, "x")
    assert "after shutdown" in after and "after shutdown" in flush_after, (after, flush_after)
    report({"ok": True})


@case
def sync_equals_allreduce():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    library = MPI.Get_library_version().split()[0]
    rng = np.random.default_rng(100 + rank)
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
            what = f"{n} {np.dtype(dtype).name}"
            # The engine runs MPI's nonblocking allreduce in place: bitwise the same as calling it directly.
            assert np.array_equal(got.array, in_place), f"{what}: sync differs from MPI.Iallreduce(MPI.IN_PLACE, ...)"
            assert np.array_equal(avg, in_place / size), f"{what}: sync average differs from the in-place sum / size"
            if library == "MPICH":
                assert np.array_equal(got.array, expected), f"{what}: sync differs from MPI.Allreduce"
                assert np.array_equal(got.array, nonblocking), f"{what}: sync differs from MPI.Iallreduce"
                assert np.array_equal(avg, nonblocking / size), f"{what}: sync average differs"
            else:
                # Open MPI's blocking, nonblocking and in-place allreduce may each
                # sum floats in another order (seen at 5 ranks).
                assert np.allclose(got.array, expected, rtol=1e-5, atol=1e-5), \
                    f"{what}: sync differs from MPI.Allreduce beyond rounding"
        k = rng.integers(-1000, 1000, n).astype(np.int64)
        k_expected = np.empty_like(k)
        MPI.COMM_WORLD.Allreduce(k, k_expected, op=MPI.SUM)
        assert np.array_equal(hvd.partial_allreduce(k, f"i{n}", mode=hvd.Sync(), op=hvd.Sum)[0].array,
                              k_expected), f"{n} int64: sync differs from MPI.Allreduce"
    helper = hvd.allreduce(np.arange(5.0) * (rank + 1), op=hvd.Sum)
    total = sum(r + 1 for r in range(size))
    assert helper.tolist() == [i * total for i in range(5)], helper
    report({"library": library})
    hvd.shutdown()


@case
def grouped():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    arrays = [np.full((2, 3), rank, np.float32), np.arange(4, dtype=np.float64) * rank,
              np.full(5, rank + 1, np.float32)]
    posts = 5
    rounds = []
    for step in range(posts):
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "group", op=hvd.Sum))
    rounds += hvd.flush("group")
    totals = [np.sum([r.arrays[i] for r in rounds], axis=0).tolist() for i in range(3)]
    assert [list(a.shape) for a in rounds[0].arrays] == [[2, 3], [4], [5]]
    assert [a.dtype.name for a in rounds[0].arrays] == ["float32", "float64", "float32"]
    assert totals[0] == [[posts * sum(range(size))] * 3] * 2, totals[0]
    assert totals[1] == [posts * sum(range(size)) * i for i in range(4)], totals[1]
    assert totals[2] == [posts * sum(r + 1 for r in range(size))] * 5, totals[2]
    report({"totals": totals})
    hvd.shutdown()


@case
def helpers():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    bcast = hvd.broadcast(np.arange(3.0) + rank, root_rank=size - 1)
    assert bcast.tolist() == (np.arange(3.0) + size - 1).tolist(), bcast
    assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
    gathered = hvd.allgather_object(("r", rank))
    assert [tuple(g) for g in gathered] == [("r", r) for r in range(size)], gathered
    avg = hvd.allreduce(np.array([float(rank)]))
    assert avg.tolist() == [sum(range(size)) / size], avg
    hvd.barrier()
    mismatch = expect(hvd.MismatchError, hvd.allreduce, np.ones(2 + (rank == 0)))
    assert "MismatchError" in mismatch and "rank 0" in mismatch, mismatch
    assert hvd.allreduce(np.ones(1), op=hvd.Sum).tolist() == [float(size)]
    report({"ok": True})
    hvd.shutdown()


MISMATCH_WORDS = {"shape_mismatch": "layout", "dtype_mismatch": "float64", "mode_mismatch": "majority"}


@case(names=MISMATCH_WORDS)
def stream_mismatch(which):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.ones(4, np.float32)
    mode = hvd.Solo()
    if rank == 1:
        if which == "shape_mismatch":
            x = np.ones(5, np.float32)
        elif which == "dtype_mismatch":
            x = np.ones(4, np.float64)
        else:
            mode = hvd.Majority()
    error = expect(hvd.MismatchError, hvd.partial_allreduce, x, "grads", mode=mode)
    assert "rank 1 differs from rank 0" in error and MISMATCH_WORDS[which] in error, error
    # The library stays usable after the failed registration.
    after = hvd.partial_allreduce(np.ones(2), "other", mode=hvd.Sync(), op=hvd.Sum)[0].array
    assert after.tolist() == [float(size)] * 2, after
    report({"error": error})
    hvd.shutdown()


@case
def local_misuse():
    hvd.init()
    hvd.partial_allreduce(np.ones(4), "grads", mode=hvd.Solo())
    reshape = expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(5), "grads")
    assert "layout" in reshape, reshape
    remode = expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(4), "grads", mode=hvd.Sync())
    assert "mode" in remode, remode
    noncontig = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones((4, 4))[:, 0], "nc")
    assert "C-contiguous" in noncontig, noncontig
    dtype = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, np.complex64), "c")
    assert "complex64" in dtype, dtype
    boolean = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, bool), "b")
    assert "bool" in boolean, boolean
    listed = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, [1.0, 2.0], "l")
    assert "numpy.ndarray" in listed, listed
    int_avg = expect(hvd.UnsupportedInputError, hvd.partial_allreduce, np.ones(4, np.int64), "i")
    assert "Average" in int_avg, int_avg
    expect(TypeError, hvd.partial_allreduce, np.ones(4), "m", mode="solo")
    expect(hvd.ConfigError, hvd.partial_allreduce, np.ones(4), "t", max_staleness=-1)
    # One outstanding post per stream, checked in turns on a sync stream: its
    # round cannot complete (and end the first post) while the other rank
    # holds back its own post.
    hvd.partial_allreduce(np.ones(4), "dbl", mode=hvd.Sync())  # registered on both ranks
    for turn in range(2):
        if hvd.rank() == turn:
            handle = hvd.partial_allreduce_async(np.ones(4), "dbl", mode=hvd.Sync())
            second = hvd.partial_allreduce_async(np.ones(4), "dbl", mode=hvd.Sync())
            double_post = expect(hvd.StreamConflictError, hvd.synchronize, second)
            assert "synchronize it before posting again" in double_post, double_post
            MPI.COMM_WORLD.send(None, dest=1 - turn, tag=78)
            hvd.synchronize(handle)
        else:
            MPI.COMM_WORLD.recv(source=turn, tag=78)
            hvd.partial_allreduce(np.ones(4), "dbl", mode=hvd.Sync())
    flush_unknown = expect(hvd.StreamConflictError, hvd.flush, "never-posted")
    assert "never posted" in flush_unknown, flush_unknown
    # A stream's layout is derived once and reused while its posts keep their shapes; after the
    # refused reshape above, a post of the first shape still goes through.
    layouts = hvd.session.current().layouts
    hvd.partial_allreduce(np.ones(3), "same", mode=hvd.Sync(), op=hvd.Sum)
    first = layouts["same"][1]
    same_sum = hvd.partial_allreduce(np.ones(3), "same", mode=hvd.Sync(), op=hvd.Sum)[0].array.tolist()
    assert same_sum == [2.0] * 3 and layouts["same"][1] is first, same_sum
    expect(hvd.StreamConflictError, hvd.partial_allreduce, np.ones(2), "same", mode=hvd.Sync())
    assert layouts["same"][1] is not first, "the refused reshape kept the old layout"
    hvd.flush("grads")
    report({"ok": True})
    hvd.shutdown()


@case(names=("raise",))
def uncaught_exception(_name):
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
            time.sleep(0.01)  # pacing: a training step's compute
        report({"error": None})
    except hvd.RankFailedError as err:
        seconds = time.monotonic() - started
        assert err.rank == 1 and "rank 1 failed" in str(err) and "ValueError" in str(err), err
        assert seconds < 15, f"told after {seconds:.1f} s: by the 30 s liveness timeout, not by the failing rank"
        report({"error": str(err), "failed_rank": err.rank})
        raise


@case(names=("die", "stop"))
def killed_or_stopped(which):
    # Rank 1 is killed (SIGKILL) or frozen (SIGSTOP) with no Python exit path;
    # the others notice through liveness, or the launcher tears the job down.
    hvd.init(failure_timeout_seconds=3, heartbeat_seconds=0.5)
    rank = hvd.rank()
    phase("posting")
    stopped_at = None
    try:
        for step in range(100000):
            if rank == 1 and step == 5:
                if which == "stop":  # the survivors' detection time is measured from here
                    stopped_at = time.time()
                    report({"stopped_at": stopped_at})
                os.kill(os.getpid(), signal.SIGKILL if which == "die" else signal.SIGSTOP)
            hvd.partial_allreduce(np.ones(8), "grads", mode=hvd.Solo())
            time.sleep(0.01)  # pacing: a training step's compute
        report({"error": None})
    except hvd.RankFailedError as err:
        failed_at = time.time()
        assert err.rank == 1, err
        if which == "stop" and rank != 1:
            assert "no message from it" in str(err), err
        if rank == 1:  # Open MPI resumes the stopped rank before killing it: it names itself
            assert "declared failed by rank" in str(err), err
        report({"error": str(err), "failed_rank": err.rank, "failed_at": failed_at, "stopped_at": stopped_at})
        raise


@case
def shutdown_in_flight():
    # Posts never synchronized, then shutdown: nothing posted may be lost.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    got = []
    for step in range(6):
        x = np.zeros(size * 7)
        x[rank * 7 + step] = 1.0
        got += hvd.partial_allreduce(x, "s", mode=hvd.Solo(), op=hvd.Sum)
        time.sleep(0.002 * rank)  # compute of uneven length: the ranks out of step
    last = np.zeros(size * 7)
    last[rank * 7 + 6] = 1.0
    handle = hvd.partial_allreduce_async(last, "s", mode=hvd.Solo(), op=hvd.Sum)
    got += hvd.synchronize(handle)
    got += hvd.flush("s")
    summed = np.sum([r.array for r in got], axis=0)
    assert summed.tolist() == [1.0] * (size * 7), f"lost or doubled posts: {summed}"
    report({"ok": True})
    hvd.shutdown()


@case
def many_streams():
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
        time.sleep(0.001 * rank)  # compute of uneven length: the ranks out of step
    # flush is collective: the same order everywhere. The majority stream goes first: a rank whose
    # last post missed the last round waits for that round's designated rank, which would otherwise
    # be blocked in the flush of another stream (a majority round waits for its designated rank's
    # next post or flush).
    for i in sorted(range(len(names)), key=lambda i: not isinstance(modes[i], hvd.Majority)):
        name = names[i]
        for r in hvd.flush(name):
            sums[name] += r.array
    for name in names:
        total = MPI.COMM_WORLD.allreduce(posted[name])  # what every rank posted, by plain MPI
        assert sums[name].tolist() == total.tolist(), f"{name}: lost or doubled data: {sums[name]} != {total}"
    report({"ok": True})
    hvd.shutdown()


@case
def sub_communicators():
    # Two independent worlds on one job, split from COMM_WORLD with
    # interleaved members ({0, 2} and {1, 3}); rank 4 is in neither.
    world = MPI.COMM_WORLD.Get_rank()
    sub = MPI.COMM_WORLD.Split(MPI.UNDEFINED if world == 4 else world % 2, key=world)
    if world == 4:
        null = expect(hvd.ConfigError, hvd.init, sub)
        assert "COMM_NULL) on world rank 4" in null, null
        not_comm = expect(hvd.ConfigError, hvd.init, 7)
        assert "expected an mpi4py communicator, got int" in not_comm, not_comm
        assert hvd.is_initialized() is False
        report({"left_out": True})
        return
    hvd.init(sub)
    members = [world % 2, world % 2 + 2]
    got = []
    for step in range(6):
        x = np.zeros(4 * 6)
        x[world * 6 + step] = 1.0
        got += hvd.partial_allreduce(x, "g", mode=hvd.Solo(), op=hvd.Sum)
        time.sleep(0.02 * hvd.rank())  # compute: the second member of each world is slower
    got += hvd.flush("g")
    assert (hvd.rank(), hvd.size(), hvd.allgather_object(world)) == (members.index(world), 2, members)
    assert hvd.broadcast_object(world, root_rank=1) == members[1]
    expected = np.zeros(4 * 6)
    for member in members:
        expected[member * 6:(member + 1) * 6] = 1.0
    summed = np.sum([r.array for r in got], axis=0)
    assert summed.tolist() == expected.tolist(), f"lost, doubled or foreign contributions: {summed}"
    report({"rounds": [[r.round, r.contributors, r.array.tolist()] for r in got]})
    hvd.shutdown()


@case
def too_many_streams(streams, quorum_arg=None):
    # One stream per array, thousands of them: each holds a communicator, and
    # MPI runs out of them (MPICH after about 2,040). With "quorum": majority
    # streams with a quorum, whose counters share one window made at init.
    hvd.init()
    rank = hvd.rank()
    library = MPI.Get_library_version().split()[0]
    quorum = quorum_arg == "quorum"
    mode = hvd.Majority(quorum=2) if quorum else hvd.Sync()
    failed_at = error = None
    for i in range(int(streams)):
        try:
            hvd.partial_allreduce(np.ones(1, np.float32), f"tensor{i}", mode=mode)
        except hvd.HvdPartialError as err:
            failed_at, error = i, f"{type(err).__name__}: {err}"
            if not quorum:
                later = expect(hvd.HvdPartialError, hvd.partial_allreduce, np.ones(1), "x")
                assert "TooManyStreamsError" in later, later
            break
    out = {"failed_at": failed_at}
    if quorum:
        # The 257th majority stream with a quorum: refused with the limit and the way out.
        assert failed_at == 256, (failed_at, error)
        assert error.startswith("TooManyStreamsError") and f"rank {rank}:" in error, error
        assert "256 majority streams with a quorum" in error and "grouped_partial_allreduce_async" in error, error
        # A full window refuses only the new stream: the engine and the streams it has go on.
        expect(hvd.TooManyStreamsError, hvd.partial_allreduce, np.ones(1, np.float32), f"tensor{failed_at}",
               mode=mode)
        taken = hvd.partial_allreduce(np.ones(1, np.float32), "tensor0", mode=mode) + hvd.flush("tensor0")
        out["old_stream"] = [r.round for r in taken]
        assert out["old_stream"], "the stream registered before the limit took no round"
        no_quorum = [r.array.tolist() for r in hvd.partial_allreduce(np.ones(1), "y", mode=hvd.Sync(), op=hvd.Sum)]
        assert no_quorum == [[2.0]], no_quorum
    elif failed_at is None:  # Open MPI: 3,000 streams worked here
        assert library != "MPICH", f"MPICH gave {streams} communicators"
    else:
        assert failed_at > 1000, (failed_at, error)
        assert error.startswith("TooManyStreamsError"), error
        assert f"stream 'tensor{failed_at}'" in error and f"on rank {rank}" in error, error
        assert "grouped_partial_allreduce_async" in error, error
    hvd.shutdown()
    report(out)


@case
def sync_uneven(timing):
    # Rank 0 posts 3 times to a sync stream, the others 4 times. "late": the
    # 4th posts come after rank 0 began flushing and are refused; "in_flight":
    # they come first, so their round can never complete.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    got = [r for _ in range(3) for r in hvd.partial_allreduce(np.ones(2), "g", mode=hvd.Sync(), op=hvd.Sum)]
    stream = engine().readout.stream_state("g")
    extra = error = None
    shut_down = False
    try:
        if rank == 0:
            if timing == "in_flight":  # flush once every other rank has started its round 3
                await_announced(*(f"round 3 started on {peer}" for peer in range(1, size)))
            got += hvd.flush("g")
        else:
            if timing == "late":  # post once rank 0's flush is known on this rank
                wait_until(lambda: stream.flush_begun is not None, "rank 0's flush notice")
                extra = expect(hvd.MismatchError, hvd.partial_allreduce, np.ones(2), "g", mode=hvd.Sync(),
                               op=hvd.Sum)
            else:
                handle = hvd.partial_allreduce_async(np.ones(2), "g", mode=hvd.Sync(), op=hvd.Sum)
                wait_until(lambda: stream.started == 4, "this rank's round 3")
                announce(f"round 3 started on {rank}")
                try:  # its own MismatchError, or a peer's failure notice if that came first
                    hvd.synchronize(handle)
                    extra = "no error"
                except hvd.HvdPartialError as err:
                    extra = f"{type(err).__name__}: {err}"
            got += hvd.flush("g")  # the way out once refused: flush like rank 0
        hvd.shutdown()
        shut_down = True
    except hvd.HvdPartialError as err:
        error = f"{type(err).__name__}: {err}"
    if timing == "late":
        assert shut_down, error
        rounds, summed = [r.round for r in got], np.sum([r.array for r in got], axis=0).tolist()
        assert rounds == [0, 1, 2, 3] and summed == [3.0 * size] * 2, (rounds, summed)  # 3 rounds, then the flush
        if rank:
            assert extra.startswith("MismatchError"), extra
            assert "rank 0 began flushing it after 3 rounds" in extra and f"rank {rank} posted round 3" in extra, extra
    else:
        assert error is not None and "rank 0 began flushing it after 3 rounds" in error, error
        if rank == 0:
            assert error.startswith("RankFailedError"), error
        else:
            # Each rank fails at once: with its own mismatch, or with the failure notice
            # of another rank in the same state if that message came first.
            kind, _, text = extra.partition(": ")
            culprit = re.search(r"rank (\d+) posted round 3", text)
            assert culprit and culprit.group(1) != "0", extra
            if kind == "MismatchError":
                assert int(culprit.group(1)) == rank, extra
            else:
                assert kind == "RankFailedError" and int(culprit.group(1)) != rank, extra
    report({"extra": extra, "error": error})


@case
def no_leak():
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
        engines.append(weakref.ref(engine()))
        hvd.shutdown()
    alive = sum(ref() is not None for ref in engines)
    assert alive == 0, f"{alive} engines outlived shutdown"
    report({"ok": True})


@case
def reinit():
    # init -> shutdown -> init: the second run starts from nothing (a stream
    # name may come back with other settings; config and stats are the new run's).
    hvd.init(max_staleness=3)
    first = hvd.session.current()
    assert [r.round for r in hvd.partial_allreduce(np.ones(4), "s", mode=hvd.Solo(), op=hvd.Sum)] == [0]
    assert hvd.config().max_staleness == 3
    hvd.shutdown()
    between = expect(hvd.NotInitializedError, hvd.rank)
    assert "after shutdown()" in between, between
    assert hvd.session.current() is None
    hvd.init(max_staleness=5)
    size = hvd.size()
    assert hvd.session.current() is not first and hvd.config().max_staleness == 5
    got = [hvd.partial_allreduce(np.full(3, 2.0, np.float32), "s", mode=hvd.Sync(), op=hvd.Sum) for _ in range(2)]
    # Same name, new shape, dtype and mode: accepted, rounds counted from 0 again.
    second = [[r.round, r.array.tolist()] for rounds in got for r in rounds]
    assert second == [[0, [2.0 * size] * 3], [1, [2.0 * size] * 3]], second
    assert hvd.stats()["s"]["rounds"] == 2 and hvd.rank() == MPI.COMM_WORLD.Get_rank()
    hvd.shutdown()
    report({"ok": True})


@case
def stale_message():
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
        assert got == ["from the second session"], got
    second.control.Barrier()
    second.free()
    report({"got": got})


@case
def sessions_back_to_back():
    # Several init ... shutdown in a row, solo and majority streams out of step: each session
    # starts from round 0 and loses nothing, whatever the last one left in flight.
    rank = MPI.COMM_WORLD.Get_rank()
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
        assert rounds[0] == 0 and rounds == list(range(len(rounds))), (session, rounds)
        assert total == 25 * size, (session, total)  # every post summed exactly once
    report({"ok": True})


# Where a fusion_threshold_bytes splits the grouped stream's arrays (float32 256,
# 256, 16 elements; float64 300, 500): at 1 KiB each of 1 KiB or more travels
# alone; at 64 MiB one bucket per dtype.
FUSION_BUCKETS = {1024: [[0], [1], [3], [2], [4]], 64 << 20: [[0, 1, 3], [2, 4]]}


@case
def fusion_buckets(threshold):
    # A grouped solo stream whose fused buffers are bounded by a small
    # fusion_threshold_bytes: several MPI buffers, one stream, so every
    # bucket takes the same rounds; ranks out of step lose nothing.
    hvd.init(fusion_threshold_bytes=int(threshold))
    rank, size = hvd.rank(), hvd.size()
    shapes = [(256,), (64, 4), (300,), (16,), (500,)]
    dtypes = [np.float32, np.float32, np.float64, np.float32, np.float64]
    posted = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    taken = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    rounds = []
    for step in range(10):
        time.sleep(0.003 * ((rank + step) % size))  # compute out of step: stale and fresh contributions mix
        arrays = [np.full(s, float(rank + 1 + step + i), d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        for acc, a in zip(posted, arrays):
            acc += a
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "fused", mode=hvd.Solo(), op=hvd.Sum))
    rounds += hvd.flush("fused")
    for r in rounds:
        for acc, a in zip(taken, r.arrays):
            acc += a
    everyone = [np.asarray(MPI.COMM_WORLD.allreduce(p)) for p in posted]
    conserved = [bool(np.array_equal(t, e)) for t, e in zip(taken, everyone)]
    assert conserved == [True] * 5, f"a contribution was lost or doubled: {conserved}"
    buckets = [list(idx) for _, idx in engine().readout.stream_state("fused").layout.groups]
    assert buckets == FUSION_BUCKETS[int(threshold)], buckets
    report({"rounds": [(r.round, [float(a.sum()) for a in r.arrays]) for r in rounds]})
    hvd.shutdown()


@case
def doorbell(poll_ms):
    # Only rank 1 posts to a solo stream; the other engines are idle, polling
    # every idle_poll_ms (without doorbells) or doorbell_poll_ms (with), both
    # long here. Each round needs every engine, so a post waits for the
    # others' next poll unless their doorbells wake them. Rank 1 posts only
    # once every other engine is asleep again (an event each idle rank
    # announces, reading its engine's state, while it makes no call).
    hvd.init(idle_poll_ms=float(poll_ms), doorbell_poll_ms=float(poll_ms))
    rank, size = hvd.rank(), hvd.size()
    bell = engine().transport.doorbell
    posts = 5  # within max_staleness: the others take no rounds meanwhile
    waits = []
    hvd.partial_allreduce(np.ones(4), "bell", mode=hvd.Solo())  # registration, on every rank
    for i in range(posts):
        if rank == 1:
            await_announced(*(f"asleep {i} on {peer}" for peer in range(size) if peer != 1))
            started = time.perf_counter()
            hvd.partial_allreduce(np.ones(4), "bell", mode=hvd.Solo())
            waits.append(time.perf_counter() - started)
            announce(f"posted {i}")
        else:
            # Outside any call, the engine is idle (a barrier would keep it polling). Round i - 1 is
            # done on rank 1, so this engine joined it: asleep now means asleep since.
            wait_until(lambda: engine().readout.asleep, f"this engine asleep before post {i}")
            announce(f"asleep {i} on {rank}")
            await_announced(f"posted {i}")
    hvd.barrier()
    results = hvd.flush("bell")
    if doorbells_on():
        assert bell is not None and bell.reachable == size - 1, (bell, bell and bell.reachable)
    else:
        assert bell is None, "a doorbell with HVD_PARTIAL_DOORBELL=0"
    if rank == 1 and doorbells_on():
        import statistics

        fast = statistics.median(waits)
        assert fast < 0.06, f"with doorbells a post waited {fast * 1e3:.1f} ms (median): {waits}"
    report({"waits": waits, "flushed_round": results[-1].round})
    hvd.shutdown()


@case
def wakeups():
    # Posts at every distance from the previous one: inside the engine's spin
    # window (no wake-up sent), at its edge, and long after (the engine sleeps
    # idle_poll_ms, 2 s here, at a time). A wake-up lost at the edge between
    # spinning and sleeping would cost a post the rest of a 2 s sleep.
    hvd.init(idle_poll_ms=2000.0, doorbell_poll_ms=2000.0)
    spin = engine().config.spin_us / 1e6
    assert spin == float(os.environ["HVD_PARTIAL_SPIN_US"]) / 1e6, spin
    gaps = [0.0, spin / 2, spin * 0.9, spin, spin * 1.1, spin * 2, 1e-3, 5e-3, 0.03]
    order = np.random.default_rng(7).permutation(np.repeat(np.arange(len(gaps)), 12))  # same on every rank
    hvd.partial_allreduce(np.ones(4), "w", mode=hvd.Sync())
    waits = []
    for k in order:
        time.sleep(gaps[k])  # the gap under test: where the engine is between spinning and sleeping
        started = time.perf_counter()
        hvd.partial_allreduce(np.ones(4), "w", mode=hvd.Sync())
        waits.append(time.perf_counter() - started)
    assert len(waits) == 108
    worst = max(waits)
    assert worst < 0.5, f"a post waited {worst:.3f} s: a wake-up was lost"
    report({"worst": worst})
    hvd.shutdown()


@case
def large_rounds():
    # Buffers past the mapped-allocation threshold, reductions long enough for
    # the engine to space out its tests (reduce_poll_us from the environment),
    # and in solo the ranks out of step: zeros sent, stale and fresh posts
    # summed into one contribution, fused and lone arrays side by side.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert engine().config.reduce_poll_us == float(os.environ["HVD_PARTIAL_REDUCE_POLL_US"])
    rng = np.random.default_rng(5 + rank)
    big = rng.integers(-1000, 1000, 700_000).astype(np.float64)
    expected = np.empty_like(big)
    MPI.COMM_WORLD.Allreduce(big, expected, op=MPI.SUM)
    assert np.array_equal(hvd.partial_allreduce(big, "big", mode=hvd.Sync(), op=hvd.Sum)[0].array, expected), \
        "a large sync round differs from MPI.Allreduce"
    shapes = [(600_000,), (1000, 600), (200_000,)]  # float32 fused: 4.8 MB, mapped
    dtypes = [np.float32, np.float32, np.float64]
    rounds = []
    posted = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    for step in range(12):
        time.sleep(0.004 * ((rank + step) % size))  # compute out of step: stale and fresh contributions mix
        arrays = [np.full(s, (rank + 1) * (step + 1) + i, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        for acc, a in zip(posted, arrays):
            acc += a
        rounds += hvd.synchronize(hvd.grouped_partial_allreduce_async(arrays, "solo", mode=hvd.Solo(), op=hvd.Sum))
    rounds += hvd.flush("solo")
    mine = [np.sum([r.arrays[i] for r in rounds], axis=0) for i in range(3)]
    everyone = [MPI.COMM_WORLD.allreduce(p.sum()) for p in posted]
    conserved = [bool(float(m.sum()) == float(e)) for m, e in zip(mine, everyone)]
    assert conserved == [True] * 3, f"solo rounds lost or doubled a contribution: {conserved}"
    assert all(bool((m == m.flat[0]).all()) for m in mine), "a summed array is not uniform"
    report({"digests": [(r.round, [float(a.sum()) for a in r.arrays]) for r in rounds]})
    hvd.shutdown()


@case
def rung_receive():
    # The transport alone, no engine: the last rank sends rank 0 a control
    # message and rings its doorbell; rank 0, about to sleep on the bell, must
    # get the message from one receive call (it may need several probes).
    from hvd_partial.transport.mpi import TAG_PROTOCOL, MpiTransport

    transport = MpiTransport(MPI.COMM_WORLD)
    sender = transport.size - 1
    in_one_call = 0
    rounds = 60
    for i in range(rounds):
        transport.barrier()
        if transport.rank == sender:
            await_announced(f"rank 0 waits on its bell {i}")  # rank 0 is at its bell's wait
            transport.send(0, TAG_PROTOCOL, ("start", i))
            while transport.progress_sends():
                pass
        elif transport.rank == 0:
            announce(f"rank 0 waits on its bell {i}")
            assert transport.doorbell.wait(10.0), "the ring never came"
            got = transport.receive(transport.doorbell.take_ring())
            in_one_call += bool(got)
            while not got:
                got = transport.receive()
            assert got == [(sender, TAG_PROTOCOL, ("start", i))], got
    transport.barrier()
    if transport.rank == 0:
        assert in_one_call == rounds, f"{rounds - in_one_call} rings found no message at first"
    report({"in_one_call": in_one_call})
    transport.free()


@case
def waiting_cpu():
    # Posts that wait for another rank's computation (a majority round's
    # designated rank) must leave the CPU to the ranks computing.
    from hvd_partial.modes import designated_initiator

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    last = size - 1
    delay_us = float(os.environ.get("HVD_PARTIAL_ACTIVATION_DELAY_US", "0"))
    seed = next(s for s in range(10_000) if designated_initiator(s, "m", 1, size) == last)
    mode = hvd.Majority(seed=seed)
    hvd.partial_allreduce(np.ones(4), "m", mode=mode)  # round 0: every rank
    # Line the ranks up with a sync post, not a barrier: a rank in a barrier is parked, and the
    # designated rank would start round 1 there, without waiting for its own post.
    hvd.partial_allreduce(np.ones(1), "line up", mode=hvd.Sync())
    cpu0, wall0, naps_before = time.process_time(), time.monotonic(), engine().readout.naps
    if rank == last:
        await_announced(*(f"{peer} posts" for peer in range(last)))
        time.sleep(1.0)  # the computation under test: the others wait 1 s; round 1 starts when this rank posts
    else:
        announce(f"{rank} posts")
    rounds = hvd.partial_allreduce(np.ones(4), "m", mode=mode)
    # The engine's naps while this rank waited: its wake-ups, whatever the machine's load.
    naps = engine().readout.naps - naps_before
    cpu_fraction = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    waited = time.monotonic() - wall0
    if rank != last:
        # Growing naps of up to 10 ms (the doorbell's polling period) make about 110 in 1 s,
        # and a load on the machine only makes fewer; naps stuck at 1 ms after a stale ring made about 900.
        assert (rounds[-1].round, rounds[-1].initiator, rounds[-1].contributors) == (1, last, list(range(size))), \
            rounds[-1]
        assert engine().readout.stream_counters("m").joined_early == (1 if delay_us else 0)
        assert 5 < naps < 300, f"its engine napped {naps} times in a 1 s wait"
        assert cpu_fraction < 0.2, f"its waiting engine used {cpu_fraction:.0%} of a core"
        assert waited < 1.3, f"returned {waited - 1.0:.2f} s after the round could start"
    report({"naps": naps, "cpu_fraction": cpu_fraction, "waited": waited})
    hvd.flush("m")
    hvd.shutdown()


@case
def idle_cpu():
    # An idle engine must leave the CPU to the training thread.
    hvd.init()
    hvd.partial_allreduce(np.ones(4), "warm", mode=hvd.Solo())
    hvd.barrier()
    cpu0, wall0 = time.process_time(), time.monotonic()
    time.sleep(2.0)  # the idle time under test: process CPU time over it is the engine's polling alone
    cpu_fraction = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    assert cpu_fraction < 0.15, f"idle engine used {cpu_fraction:.0%} of a core"
    report({"cpu_fraction": cpu_fraction})
    hvd.shutdown()


@case
def settings_disagree():
    """Ranks that set cap_round_step differently: init fails on every rank, naming
    the field and each rank's value, and a later init with equal settings works."""
    rank = MPI.COMM_WORLD.Get_rank()
    err = expect(hvd.ConfigError, hvd.init, cap_round_step=(rank == 0))
    assert f"rank {rank}: " in err and "cap_round_step" in err, err
    assert "True on rank(s) [0]" in err and "False on rank(s) [1]" in err, err
    assert not hvd.is_initialized()
    hvd.init(cap_round_step=False)
    (got,) = hvd.partial_allreduce(np.ones(3), "after", mode=hvd.Sync(), op=hvd.Sum)
    assert np.array_equal(got.array, np.full(3, 2.0))
    hvd.shutdown()
    report({"error": err})


if __name__ == "__main__":
    run_case()
