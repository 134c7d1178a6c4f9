"""Elastic training under real kills: consistency, time lost, throughput, and
the cost of the elastic work when elastic is off.

Run from the repository root (as root also export OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; the driver sets them for its jobs), with the
Python of any environment (the driver itself imports neither MPI nor
hvd_partial); the jobs run under ``--mpirun``/``--python``, by default those of
the Open MPI 5 environment ``bash ci/test-openmpi`` makes
(/tmp/hvd-partial-openmpi), with ``PYTHONPATH`` set to this file's checkout::

    python benchmarks/elastic_kills.py consistency --kills 100 --np 4
    python benchmarks/elastic_kills.py consistency --kills 100 --np 8
    python benchmarks/elastic_kills.py time-lost --np 4
    python benchmarks/elastic_kills.py time-lost --np 8
    python benchmarks/elastic_kills.py throughput --np 8 --period 30 --duration 120
    python benchmarks/elastic_kills.py throughput-grow --np 4 --period 30 --duration 120
    python benchmarks/elastic_kills.py throughput-grow --np 8 --period 30 --duration 120
    python benchmarks/elastic_kills.py elastic-off --old /work/wt-old --runs 5

Every elastic job is ``mpirun --with-ft ulfm --mca btl tcp,self --oversubscribe
--bind-to none -n NP python benchmarks/elastic_kills.py worker KIND OUTDIR SPEC``
with ``hvd_partial.init(elastic=True)``; a victim dies by ``os._exit(1)`` at the
N-th time a named point of the library is reached (:mod:`hvd_partial.faults`),
after writing its kill time (CLOCK_MONOTONIC, shared by the host's processes).
Survivors write a JSON report and end with ``os._exit(0)`` (Open MPI 5.0's
MPI_Finalize after a failure now and then waits forever). Open MPI 5.0's
launcher ends a job once half or more of its processes died, so a job kills
fewer than half its ranks.

consistency
    Many short jobs (``--steps`` posts of a one-hot float64 array per rank,
    op=Sum, as tests/workers/elastic_cases.py; a helper ``allreduce`` every 4
    steps, whose HorovodInternalError is caught and acknowledged). Each job
    draws, from ``--seed`` and its index (both printed): the mode
    (solo/majority/sync), the victim (any rank, 0 included), the point and the
    count. With ``--np`` 5 or more, a quarter of the jobs also kill a second
    rank at ``recovery_shrunk`` (a failure during the recovery from the first).
    Each survivor checks that its own posts are each summed exactly once and
    that no post is summed twice (conservation), and reports the digest of
    every result in round order, the world it ends in and its helper outcomes;
    the driver checks that every survivor agrees (consistency), and counts
    hangs (the job ran past ``--timeout``) and crashes (a survivor that did
    not report, or reported an exception). A draw whose point was never
    reached (no rank died) is not a kill: the driver draws again until
    ``--kills`` kills ran. One job again: ``--only INDEX`` with the same seed.

time-lost
    A balanced loop: ``--work-ms`` of busy numpy work per step, then one
    ``--mb`` MB float32 post. One rank (drawn, 0 included) dies at
    ``round_launched`` or ``post_submitted`` after the first ``--warmup`` steps.
    On each survivor: time lost = (the time the first round completed on the
    new world is returned) - (kill time) - (median step time before the kill).
    Also the engine's own recovery time (``Recovered.seconds`` of
    ``session.current().engine.recoveries``). ``failure_timeout_seconds`` is
    set to 600 s: detection comes from MPI, never from the liveness timeout.
    Medians over survivors, then over ``--kills`` jobs.

throughput
    ``--np`` ranks train the balanced loop for ``--duration`` seconds in solo
    mode; every ``--period`` seconds one more rank is killed (SIGKILL from a
    timer thread: at no particular point) and not replaced, at most
    ``(np - 1) // 2`` ranks. Reference: no-kill runs at each size the killed
    run passes through, ``--ref-seconds`` each. Printed: per segment (between
    kills) the steps per second per rank against the reference at that size,
    and the ratio of all steps done by the killed run to what the reference
    rates give for the same sizes and durations.

throughput-grow
    The same loop inside ``hvd.elastic.run`` with ``max_np`` = ``--np`` (replacement): a
    flush and ``state.commit()`` every ``--commit-every`` steps, an ``ObjectState`` of
    ``--state-mb`` MB of weights (what ``sync()`` sends a new rank). Every ``--period``
    seconds a rank is SIGKILLed: first one of the ranks mpirun started (not rank 0), then
    each time the rank started to replace the one before (Open MPI ends the job once half
    the processes it started died; a grow's processes count apart). Reference: a no-kill
    run of ``--np`` ranks, ``--ref-seconds``. Printed: all ranks' steps over ``--duration``
    (the victims' up to their deaths) against the reference rate times ``np`` times the
    duration, and, per kill, rank 0's time split: kill to the first round of the shrunk
    world (detection and shrink), from the reset to the grow's decision (waiting for the
    next commit, training on), the grow's steps (``check``, the old engine's ``stop``,
    ``spawn`` and merge, ``start`` of the new engine), the reset and ``sync()``, the first
    round of the grown world, and ``stalled``: from the grow's decision to that round.

elastic-off
    ``benchmarks/engine.py`` scenario (b) (injected imbalance; no elastic, the
    default launcher ``--mpiexec``) run alternately from ``--old`` (a worktree
    of the commit before the elastic work) and from this checkout, each with
    ``PYTHONPATH`` pinned to its tree, ``--runs`` runs each; prints the
    median rounds per second per mode and the ratio new/old.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OMPI = "/tmp/hvd-partial-openmpi/bin"
ULFM_ARGS = ["--with-ft", "ulfm", "--mca", "btl", "tcp,self", "--oversubscribe", "--bind-to", "none"]
MODES = ["solo", "majority", "sync"]
STEPS = 16
HELPER_EVERY = 4


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# ----------------------------------------------------------------------------------------------
# workers (run under mpirun)
# ----------------------------------------------------------------------------------------------

def _write(path: str, value) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(value, fh)
    os.replace(path + ".tmp", path)


def _die(out: str, rank: int, what: str) -> None:
    _write(os.path.join(out, f"kill{rank}.json"), {"rank": rank, "what": what, "time": now()})
    os._exit(1)


def _arm(out: str, me: int, kills) -> None:
    from hvd_partial import faults

    for victim, point, count in kills:
        if victim == me:
            faults.at(point, lambda n, c=count, p=point: n >= c and _die(out, me, f"{p}#{n}"))


def _settle() -> None:
    """A barrier before a survivor reports and exits: one that exits while another
    still finishes its flush is a failure to that one (a second world change)."""
    import hvd_partial as hvd

    for _ in range(3):
        try:
            hvd.barrier()
            return
        except hvd.HorovodInternalError:
            hvd.acknowledge_world_change()


def _end(out: str, me: int, value) -> None:
    _write(os.path.join(out, f"rank{me}.json"), value)
    if "error" not in value:
        try:  # none exits before every survivor has read its world: an exit is a failure to the others
            _settle()
        except Exception:  # noqa: BLE001 - the report is written
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_consistency(out: str, spec: dict) -> None:
    import numpy as np

    import hvd_partial as hvd

    hvd.init(elastic=True, mode=spec["mode"])
    me, size = hvd.rank(), hvd.size()
    steps = spec["steps"]
    _arm(out, me, spec["kills"])
    length = size * steps
    results, helpers = [], []
    for t in range(steps):
        x = np.zeros(length, np.float64)
        x[me * steps + t] = 1.0
        results += hvd.partial_allreduce(x, "g", op=hvd.Sum)
        if t % HELPER_EVERY == HELPER_EVERY - 1:
            try:
                v = hvd.allreduce(np.ones(2), name=f"metric{t}", op=hvd.Sum)
                helpers.append(int(v[0]))
            except hvd.HorovodInternalError:
                helpers.append("HorovodInternalError")
                hvd.acknowledge_world_change()
            _write(os.path.join(out, f"progress{me}.json"), {"step": t, "helpers": helpers})
    results += hvd.flush("g")
    _settle()
    total = sum(r.array for r in results) if results else np.zeros(length)
    mine = total[me * steps:(me + 1) * steps]
    world = hvd.world()
    _end(out, me, {
        "own_once": bool((mine == 1).all()), "own": mine.tolist() if not (mine == 1).all() else None,
        "twice": np.flatnonzero(total > 1).tolist(),
        "in_order": [r.round for r in results] == list(range(len(results))),
        "lost": sorted(world.lost), "size": hvd.size(), "version": world.version, "rounds": len(results),
        "sizes": sorted({r.world_size for r in results}), "helpers": helpers,
        "dead_summed": {str(v): int(total[v * steps:(v + 1) * steps].sum()) for v, _, _ in spec["kills"]},
        "digest": hashlib.sha1(b"".join(r.array.tobytes() for r in results)).hexdigest()})


class Work:
    """Busy numpy work of about ``seconds`` per call (calibrated on this rank)."""

    def __init__(self, seconds: float):
        import numpy as np

        self.a = np.random.default_rng(1).random((96, 96))
        t = time.perf_counter()
        for _ in range(30):
            self.a @ self.a
        per = (time.perf_counter() - t) / 30
        self.reps = max(1, int(seconds / per))

    def __call__(self):
        for _ in range(self.reps):
            self.a @ self.a


def worker_time_lost(out: str, spec: dict) -> None:
    import numpy as np

    import hvd_partial as hvd
    from hvd_partial import session

    hvd.init(elastic=True, mode=spec["mode"], failure_timeout_seconds=600.0)
    me = hvd.rank()
    work = Work(spec["work_ms"] / 1000)
    work.reps = int(statistics.median(hvd.allgather_object(work.reps)))  # the same work everywhere
    x = np.ones(int(spec["mb"] * 1e6) // 4, np.float32)
    hvd.barrier()
    seen, steps = [], []
    for step in range(spec["steps"]):
        if step == spec["warmup"]:
            _arm(out, me, spec["kills"])
        t = now()
        work()
        res = hvd.partial_allreduce(x, "g", op=hvd.Sum)
        done = now()
        steps.append((t, done))
        seen += [(r.round, r.world_version, r.world_size, done) for r in res]
    for r in hvd.flush("g"):
        seen.append((r.round, r.world_version, r.world_size, now()))
    _settle()
    engine = session.current().engine
    _end(out, me, {"steps": steps, "seen": seen, "recoveries": [r.seconds for r in engine.recoveries],
                   "attempts": [r.attempts for r in engine.recoveries], "size": hvd.size()})


def worker_throughput(out: str, spec: dict) -> None:
    import threading

    import numpy as np

    import hvd_partial as hvd

    quiet = {} if spec.get("observer", True) else {"stall_warning_seconds": 0.0, "report_seconds": 0.0}
    hvd.init(elastic=True, mode="solo", failure_timeout_seconds=600.0, **quiet)
    me = hvd.rank()
    work = Work(spec["work_ms"] / 1000)
    work.reps = int(statistics.median(hvd.allgather_object(work.reps)))
    x = np.ones(int(spec["mb"] * 1e6) // 4, np.float32)
    for _ in range(spec["warmup"]):
        work()
        hvd.partial_allreduce(x, "g", op=hvd.Sum)
    hvd.barrier()
    t0 = hvd.broadcast_object(now(), root_rank=0)  # one start for all (one host, one clock)
    for victim, at in spec["kills"]:
        if victim == me:
            def kill(at=at):
                _write(os.path.join(out, f"kill{me}.json"), {"rank": me, "time": now(), "planned": t0 + at})
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Timer(max(0.0, t0 + at - now()), kill).start()
    ends, rounds = [], 0
    while now() < t0 + spec["duration"]:
        work()
        rounds += len(hvd.partial_allreduce(x, "g", op=hvd.Sum))
        ends.append(now())
    rounds += len(hvd.flush("g"))
    _settle()
    _end(out, me, {"t0": t0, "ends": ends, "rounds": rounds, "size": hvd.size(), "version": hvd.world().version})


def worker_throughput_grow(out: str, spec: dict) -> None:
    """The balanced loop in ``hvd.elastic.run`` with ``max_np`` = the job's size: a flush and
    ``state.commit()`` every ``commit_every`` steps, then rank 0 says whether the time is up.
    A killed rank is replaced at the commit after the survivors' reset; a new rank runs this
    same function (started by the grow) and joins."""
    import threading

    import numpy as np

    import hvd_partial as hvd
    from hvd_partial import session
    from hvd_partial.elastic import ObjectState, run
    from hvd_partial.engine.growth import history

    quiet = {} if spec.get("observer", True) else {"stall_warning_seconds": 0.0, "report_seconds": 0.0}
    hvd.init(elastic=True, mode="solo", failure_timeout_seconds=600.0, max_np=spec["np"], **quiet)
    world = hvd.world()
    me, is_new = world.original_rank, world.original_rank in world.joined
    work = Work(spec["work_ms"] / 1000)
    x = np.ones(int(spec["mb"] * 1e6) // 4, np.float32)
    state = ObjectState(weights=np.zeros(int(spec["state_mb"] * 1e6) // 8), t0=0.0, reps=0, step=0)
    rec = {"resets": [], "entries": [], "firsts": {}, "ends": [], "recoveries": {}, "armed": False}

    def on_reset():
        rec["resets"].append((now(), hvd.size(), hvd.world().version))
        for r in session.current().engine.recoveries:  # (a grow starts a new engine: keep them now)
            rec["recoveries"][r.world.version] = r.seconds

    state.register_reset_callbacks([on_reset])

    def take(results):
        for r in results:
            if r.world_version not in rec["firsts"]:
                rec["firsts"][r.world_version] = (now(), r.world_size)

    @run
    def train(state):
        rec["entries"].append((now(), hvd.size(), hvd.world().version))
        if not state.reps:  # the first pass: the same work everywhere, warm-up, one start for all
            state.reps = int(statistics.median(hvd.allgather_object(work.reps)))
            for _ in range(spec["warmup"]):
                work()
                take(hvd.partial_allreduce(x, "g", op=hvd.Sum))
            take(hvd.flush("g"))
            state.t0 = hvd.broadcast_object(now(), root_rank=0)
        if not rec["armed"]:  # (a new rank: once it has the start time from sync())
            rec["armed"] = True
            arm(state.t0)
        work.reps = state.reps
        while True:
            for _ in range(spec["commit_every"]):
                work()
                take(hvd.partial_allreduce(x, "g", op=hvd.Sum))
                rec["ends"].append(now())
            take(hvd.flush("g"))
            state.step += spec["commit_every"]
            state.commit()
            if hvd.broadcast_object(now() >= state.t0 + spec["duration"], root_rank=0, name="bench.stop"):
                return

    def arm(t0):
        for victim, at in spec["kills"]:
            if victim == me:
                def kill(at=at):
                    _write(os.path.join(out, f"kill{me}.json"),
                           {"rank": me, "time": now(), "planned": t0 + at, "steps": len(rec["ends"])})
                    os.kill(os.getpid(), signal.SIGKILL)
                threading.Timer(max(0.0, t0 + at - now()), kill).start()

    train(state)
    grows = [{"began": g.began, "seconds": g.seconds, "before": g.before, "after": g.after,
              "bytes": g.handshake_bytes} for g in history()]
    _end(out, me, {"t0": state.t0, "ends": rec["ends"], "size": hvd.size(), "version": hvd.world().version,
                   "is_new": is_new, "resets": rec["resets"], "entries": rec["entries"],
                   "firsts": {str(k): v for k, v in rec["firsts"].items()}, "grows": grows,
                   "recoveries": {str(k): v for k, v in rec["recoveries"].items()}})


def worker_main(argv) -> None:
    kind, out, spec = argv[0], argv[1], json.loads(argv[2])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if spec.get("dump_after"):  # every thread's stack, to the job's log, when a job stalls
        import faulthandler

        faulthandler.dump_traceback_later(spec["dump_after"], exit=False)
    from mpi4py import MPI

    me = MPI.COMM_WORLD.Get_rank()
    try:
        {"consistency": worker_consistency, "time-lost": worker_time_lost, "throughput": worker_throughput,
         "throughput-grow": worker_throughput_grow}[kind](out, spec)
    except BaseException as exc:  # noqa: BLE001 - reported as a crash
        import traceback

        _end(out, me, {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]})


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------

def _env(pythonpath: str) -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", PYTHONPATH=pythonpath)
    for k in list(env):
        if k.startswith("HVD_PARTIAL_"):
            del env[k]
    return env


def run_job(args, np_: int, kind: str, spec: dict, timeout: float) -> dict:
    """One elastic job; returns its reports, kills, wall time, whether it hung, and its output's tail."""
    out = tempfile.mkdtemp(prefix="hvdp-ek-")
    cmd = [args.mpirun, *ULFM_ARGS, "-n", str(np_), args.python, os.path.abspath(__file__), "worker", kind, out,
           json.dumps(spec)]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    hung = False
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
    wall = time.perf_counter() - began
    reports, kills, progress = {}, {}, {}
    for name in os.listdir(out):
        m = re.fullmatch(r"(rank|kill|progress)(\d+)\.json", name)
        if m:
            with open(os.path.join(out, name)) as fh:
                {"rank": reports, "kill": kills, "progress": progress}[m.group(1)][int(m.group(2))] = json.load(fh)
    shutil.rmtree(out, ignore_errors=True)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        log = os.path.join(args.log_dir, f"{kind}-np{np_}-{spec.get('tag', 'job')}.log")
        with open(log, "wb") as fh:
            fh.write(" ".join(cmd).encode() + b"\n" + text)
    return {"reports": reports, "kills": kills, "progress": progress, "wall": wall, "hung": hung, "rc": proc.returncode,
            "tail": text.decode(errors="replace")[-2500:]}


POINT_COUNTS = {  # point: highest count drawn (the job reaches each at least that often on every rank)
    "round_launched": STEPS, "post_submitted": STEPS, "flush_submitted": 1, "helper_started": STEPS // HELPER_EVERY,
    "registration_reported": 1,
}


def draw(seed: int, index: int, np_: int, steps: int) -> dict:
    rng = random.Random(seed * 1_000_003 + index)
    mode = rng.choice(MODES)
    victim = rng.randrange(np_)
    point = rng.choice(sorted(POINT_COUNTS))
    count = rng.randint(1, min(POINT_COUNTS[point], steps) if point in ("round_launched", "post_submitted")
                        else POINT_COUNTS[point])
    kills = [[victim, point, count]]
    if np_ >= 5 and rng.random() < 0.25:
        kills.append([rng.choice([r for r in range(np_) if r != victim]), "recovery_shrunk", 1])
    return {"mode": mode, "kills": kills, "steps": steps}


def judge(job: dict, spec: dict, np_: int) -> tuple[str, list[str]]:
    """('not reached' | 'ok' | 'violation', what was violated)."""
    reports, killed = job["reports"], sorted(job["kills"])
    if job["hung"]:
        return "violation", ["hang"]
    if not killed and len(reports) == np_ and all("error" not in r for r in reports.values()):
        return "not reached", []
    survivors = sorted(set(range(np_)) - set(killed))
    bad = []
    missing = [r for r in survivors if r not in reports]
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    stalled = {r for r, e in errors.items() if "no message from it" in e}
    if stalled:  # the survivors stalled until the liveness timeout declared one of them failed
        bad.append("hang")
    if missing or set(errors) - stalled:
        bad.append("crash")
    ok = {r: reports[r] for r in survivors if r in reports and "error" not in reports[r]}
    if any(not rep["own_once"] or rep["twice"] for rep in ok.values()):
        bad.append("conservation")
    keys = ("digest", "lost", "size", "version", "helpers", "dead_summed")
    differ = [k for k in keys if len({json.dumps(rep[k]) for rep in ok.values()}) > 1]
    if any(not rep["in_order"] for rep in ok.values()):
        differ.append("order")
    if any(rep["lost"] != killed for rep in ok.values()):
        differ.append("lost")
    if differ:
        bad.append("consistency")
        print(f"    consistency: {', '.join(differ)} differ: "
              + "; ".join(f"rank {r}: " + ", ".join(f"{k}={rep[k]}" for k in differ if k in rep)
                          for r, rep in ok.items()), flush=True)
    return ("violation" if bad else "ok"), bad


def cmd_consistency(args) -> None:
    print(f"consistency: np={args.np} kills={args.kills} seed={args.seed} steps={args.steps} "
          f"timeout={args.timeout}s; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    cols = ["kills", "conservation", "consistency", "hangs", "crashes"]
    table = {m: dict.fromkeys(cols, 0) for m in MODES}
    points: dict[str, int] = {}
    not_reached = index = 0
    walls = []
    violations = []
    indices = [args.only] if args.only is not None else None
    began = time.perf_counter()
    while True:
        if indices is not None:
            if not indices:
                break
            index = indices.pop()
        elif (sum(r["kills"] for r in table.values()) >= args.kills or index >= args.kills * 3
              or time.perf_counter() - began > args.max_seconds):
            break
        spec = draw(args.seed, index, args.np, args.steps)
        spec.update(tag=f"seed{args.seed}-job{index}", dump_after=args.dump_after)
        job = run_job(args, args.np, "consistency", spec, args.timeout)
        verdict, bad = judge(job, spec, args.np)
        walls.append(job["wall"])
        desc = f"job {index} seed {args.seed}: {spec['mode']} kills {spec['kills']} died {sorted(job['kills'])}"
        if verdict == "not reached":
            not_reached += 1
            if args.verbose:
                print(f"{desc}: point not reached", flush=True)
        else:
            row = table[spec["mode"]]
            row["kills"] += 1
            for what in bad:
                row[{"hang": "hangs", "crash": "crashes"}.get(what, what)] += 1
            for _, point, _ in spec["kills"]:
                points[point] = points.get(point, 0) + 1
            if bad:
                violations.append(desc + f": {bad}")
                print(f"VIOLATION {desc}: {bad}\n  reports: "
                      f"{json.dumps({r: {k: v for k, v in rep.items() if k != 'trace'} for r, rep in job['reports'].items()})[:1500]}"
                      f"\n  progress (last helper outcomes): {json.dumps(job['progress'])}"
                      f"\n  errors: {[rep.get('trace') for rep in job['reports'].values() if 'trace' in rep][:1]}"
                      f"\n  tail: {job['tail'][-1200:]}", flush=True)
            elif args.verbose:
                print(f"{desc}: ok ({job['wall']:.1f} s)", flush=True)
        if indices is None:
            index += 1
    total = {c: sum(r[c] for r in table.values()) for c in cols}
    print(f"\nconsistency, {args.np} ranks, seed {args.seed}: {total['kills']} kills run "
          f"({not_reached} draws whose point was not reached), {time.perf_counter() - began:.0f} s, "
          f"median job {statistics.median(walls):.1f} s, load {os.getloadavg()[0]:.1f}")
    print(f"{'mode':>9} " + " ".join(f"{c:>12}" for c in cols))
    for m in MODES + ["all"]:
        row = total if m == "all" else table[m]
        print(f"{m:>9} " + " ".join(f"{row[c]:12d}" for c in cols))
    print("kills per point: " + ", ".join(f"{p} {n}" for p, n in sorted(points.items())))
    print("violations: " + ("none" if not violations else "\n  " + "\n  ".join(violations)))


def cmd_time_lost(args) -> None:
    print(f"time-lost: np={args.np} kills={args.kills} seed={args.seed} steps={args.steps} warmup={args.warmup} "
          f"{args.mb} MB posts, {args.work_ms} ms work; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
          flush=True)
    rng = random.Random(args.seed)
    rows = []
    print(f"{'job':>3} {'mode':>8} {'victim':>6} {'point':>16} {'step ms':>8} {'kill->new round ms':>19} "
          f"{'lost ms':>8} {'recovery ms':>11}")
    for k in range(args.kills):
        mode = MODES[k % len(MODES)]
        victim = rng.randrange(args.np)
        point = ["round_launched", "post_submitted"][k % 2]
        spec = {"mode": mode, "steps": args.steps, "warmup": args.warmup, "mb": args.mb, "work_ms": args.work_ms,
                "kills": [[victim, point, rng.randint(1, 3)]]}
        job = run_job(args, args.np, "time-lost", spec, args.timeout)
        if job["hung"] or victim not in job["kills"] or len(job["reports"]) != args.np - 1 or any(
                "error" in r for r in job["reports"].values()):
            print(f"{k:3d} {mode:>8} {victim:6d} {point:>16}  FAILED: hung={job['hung']} killed={list(job['kills'])} "
                  f"reports={list(job['reports'])}\n{job['tail'][-1500:]}", flush=True)
            continue
        t_kill = job["kills"][victim]["time"]
        per = []
        for rep in job["reports"].values():
            before = [b - a for a, b in rep["steps"] if b < t_kill]
            step = statistics.median(before[len(before) // 4:])
            after = [t for _, version, _, t in rep["seen"] if version >= 1 and t > t_kill]
            per.append((step, min(after) - t_kill, statistics.median(rep["recoveries"])))
        step, gap, rec = (statistics.median(p[i] for p in per) for i in range(3))
        rows.append({"mode": mode, "step": step, "gap": gap, "lost": gap - step, "recovery": rec})
        print(f"{k:3d} {mode:>8} {victim:6d} {point:>16} {step * 1e3:8.1f} {gap * 1e3:19.1f} "
              f"{(gap - step) * 1e3:8.1f} {rec * 1e3:11.1f}", flush=True)
    if rows:
        med = {k: statistics.median(r[k] for r in rows) for k in ("step", "gap", "lost", "recovery")}
        print(f"median over {len(rows)} kills ({args.np} ranks): step {med['step'] * 1e3:.1f} ms, kill to the first "
              f"round of the new world {med['gap'] * 1e3:.1f} ms, time lost {med['lost'] * 1e3:.1f} ms, engine "
              f"recovery {med['recovery'] * 1e3:.1f} ms; max time lost {max(r['lost'] for r in rows) * 1e3:.1f} ms")


def _rate(job, t0, t1, ranks) -> float:
    """Steps per second per rank over [t0, t1] of the ranks ``ranks`` (of those that reported)."""
    counts = [sum(1 for t in job["reports"][r]["ends"] if t0 <= t < t1) for r in ranks if r in job["reports"]]
    return statistics.mean(counts) / (t1 - t0)


def cmd_throughput(args) -> None:
    n_kills = min((args.np - 1) // 2, int(args.duration // args.period) - (args.duration % args.period == 0))
    rng = random.Random(args.seed)
    victims = rng.sample(range(args.np), n_kills)
    print(f"throughput: np={args.np} period={args.period}s duration={args.duration}s kills={n_kills} "
          f"observer={'on' if args.observer else 'off'} "
          f"victims={victims} seed={args.seed}, {args.mb} MB posts, {args.work_ms} ms work, reference "
          f"{args.ref_seconds}s per size; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    base = {"mb": args.mb, "work_ms": args.work_ms, "warmup": args.warmup, "observer": args.observer}
    refs = {}
    for size in range(args.np, args.np - n_kills - 1, -1):
        job = run_job(args, size, "throughput", {**base, "duration": args.ref_seconds, "kills": []},
                      args.ref_seconds + 120)
        t0 = job["reports"][0]["t0"]
        refs[size] = _rate(job, t0 + 1, t0 + args.ref_seconds, range(size))
        print(f"reference, {size} ranks, no kill: {refs[size]:.2f} steps/s per rank", flush=True)
    spec = {**base, "duration": args.duration, "kills": [[v, args.period * (i + 1)] for i, v in enumerate(victims)]}
    job = run_job(args, args.np, "throughput", spec, args.duration + 180)
    survivors = sorted(set(range(args.np)) - set(victims))
    missing = [r for r in survivors if r not in job["reports"] or "error" in job["reports"][r]]
    if job["hung"] or missing or sorted(job["kills"]) != sorted(victims):
        print(f"FAILED: hung={job['hung']} killed={sorted(job['kills'])} missing={missing}\n{job['tail']}")
        return
    t0 = job["reports"][survivors[0]]["t0"]
    cuts = [t0] + [job["kills"][v]["time"] for v in victims] + [t0 + args.duration]
    print(f"{'segment':>14} {'ranks':>5} {'steps/s/rank':>12} {'reference':>9} {'ratio':>6}")
    done = expected = 0.0
    alive = list(range(args.np))
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        steps = sum(sum(1 for t in job["reports"][r]["ends"] if a <= t < b) for r in alive if r in job["reports"])
        # a victim's steps up to its death: it reports nothing, so count them as the survivors' mean
        per_rank = steps / len([r for r in alive if r in job["reports"]]) / (b - a)
        done += per_rank * len(alive) * (b - a)
        expected += refs[len(alive)] * len(alive) * (b - a)
        print(f"{a - t0:6.1f}-{b - t0:6.1f}s {len(alive):5d} {per_rank:12.2f} {refs[len(alive)]:9.2f} "
              f"{per_rank / refs[len(alive)]:6.3f}")
        if i < len(victims):
            alive.remove(victims[i])
    print(f"steps done {done:.0f}, the reference rates give {expected:.0f}: ratio {done / expected:.3f} "
          f"(survivors ended in a world of {job['reports'][survivors[0]]['size']}, version "
          f"{job['reports'][survivors[0]]['version']})")


def cmd_throughput_grow(args) -> None:
    n_kills = int(args.duration // args.period) - (args.duration % args.period == 0)
    # The first victim is a rank of the job mpirun started (not rank 0, which reports the time split);
    # each later one is the rank started to replace the one before (numbered np, np + 1, ...): Open MPI
    # ends the job once half of the processes it started died, and a grow's processes count apart.
    victims = [random.Random(args.seed).randrange(1, args.np)] + [args.np + i for i in range(n_kills - 1)]
    print(f"throughput with replacement: np={args.np} max_np={args.np} period={args.period}s "
          f"duration={args.duration}s kills={n_kills} victims={victims} seed={args.seed}, {args.mb} MB posts, "
          f"{args.work_ms} ms work, a flush and commit every {args.commit_every} steps, {args.state_mb} MB state; "
          f"reference {args.ref_seconds}s; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    base = {"mb": args.mb, "work_ms": args.work_ms, "warmup": args.warmup, "observer": args.observer,
            "np": args.np, "commit_every": args.commit_every, "state_mb": args.state_mb}
    ref = run_job(args, args.np, "throughput-grow", {**base, "duration": args.ref_seconds, "kills": []},
                  args.ref_seconds + 180)
    if ref["hung"] or sorted(ref["reports"]) != list(range(args.np)):
        print(f"FAILED reference: hung={ref['hung']} reports={sorted(ref['reports'])}\n{ref['tail']}")
        return
    t0 = ref["reports"][0]["t0"]
    ref_rate = _rate(ref, t0 + 1, t0 + args.ref_seconds, range(args.np))
    print(f"reference, {args.np} ranks, no kill: {ref_rate:.2f} steps/s per rank", flush=True)
    spec = {**base, "duration": args.duration, "kills": [[v, args.period * (i + 1)] for i, v in enumerate(victims)]}
    job = run_job(args, args.np, "throughput-grow", spec, args.duration + 300)
    reports = {m: r for m, r in job["reports"].items() if "error" not in r}
    if job["hung"] or 0 not in reports or not set(range(args.np)) - {victims[0]} <= set(reports):
        print(f"FAILED: hung={job['hung']} killed={sorted(job['kills'])} reports={sorted(job['reports'])}\n"
              f"{[r.get('error') for r in job['reports'].values()]}\n{job['tail']}")
        return
    t0, end = reports[0]["t0"], reports[0]["t0"] + args.duration
    done = sum(sum(1 for t in r["ends"] if t0 <= t < end) for r in reports.values()) \
        + sum(k["steps"] for k in job["kills"].values())
    expected = ref_rate * args.np * args.duration
    zero = reports[0]
    first_kill = min((k["time"] for k in job["kills"].values()), default=end)
    own_rate = _rate(job, t0 + 1, first_kill, range(args.np))  # this run's rate before its first kill
    print(f"steps done by all ranks {done}, the reference rate gives {expected:.0f}: ratio {done / expected:.3f}; "
          f"rank 0 alone {sum(1 for t in zero['ends'] if t0 <= t < end) / (ref_rate * args.duration):.3f}; "
          f"against this run's own rate before its first kill ({own_rate:.2f} steps/s per rank): "
          f"{done / (own_rate * args.np * args.duration):.3f} "
          f"(ended in a world of {zero['size']}, version {zero['version']}, {len(zero['grows'])} grows)")
    print(f"{'kill':>4} {'at s':>6} {'detect+shrink':>13} {'to commit':>9} {'check':>6} {'stop':>6} "
          f"{'spawn+merge':>11} {'start':>6} {'reset+sync':>10} {'1st round':>9} {'stalled':>8}  (ms, rank 0)")
    rows = []
    for i, victim in enumerate(victims):
        if victim not in job["kills"]:
            print(f"{i:4d} rank {victim} was not there to kill (not started yet)")
            continue
        tk = job["kills"][victim]["time"]
        grow = next((g for g in zero["grows"] if g["began"] > tk), None)
        shrink_version = next((v for t, size, v in zero["resets"] if t > tk), None)
        if grow is None or shrink_version is None:
            print(f"{i:4d} {tk - t0:6.1f} no grow after this kill (the run ended first)")
            continue
        grown_version = shrink_version + 1
        shrunk_round = zero["firsts"].get(str(shrink_version), [float("nan")])[0]
        reset_at = next(t for t, size, v in zero["resets"] if t > tk)
        grow_end = grow["began"] + sum(grow["seconds"].values())
        entry = next(t for t, size, v in zero["entries"] if v == grown_version)
        first = zero["firsts"].get(str(grown_version), [float("nan")])[0]
        row = {"detect": shrunk_round - tk, "commit": grow["began"] - reset_at, **grow["seconds"],
               "sync": entry - grow_end, "first": first - entry, "stalled": first - grow["began"]}
        rows.append(row)
        print(f"{i:4d} {tk - t0:6.1f} {row['detect'] * 1e3:13.1f} {row['commit'] * 1e3:9.1f} "
              f"{row['check'] * 1e3:6.1f} {row['stop'] * 1e3:6.1f} {row['spawn'] * 1e3:11.1f} "
              f"{row['start'] * 1e3:6.1f} {row['sync'] * 1e3:10.1f} {row['first'] * 1e3:9.1f} "
              f"{row['stalled'] * 1e3:8.1f}")
    if rows:
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print("medians (ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in med.items()))
        print(f"rank 0 stalled {sum(r['stalled'] for r in rows):.1f} s of {args.duration:g} s in {len(rows)} grows "
              f"({sum(r['stalled'] for r in rows) / args.duration:.1%})")


def cmd_elastic_off(args) -> None:
    trees = {"old": os.path.abspath(args.old), "new": REPO}
    for name, tree in trees.items():
        print(f"{name}: {tree} at {subprocess.run(['git', '-C', tree, 'log', '--oneline', '-1'], capture_output=True, text=True).stdout.strip()}")
    cmd = [*args.mpiexec.split(), "-n", str(args.np), args.engine_python, "benchmarks/engine.py", "--skip-balanced",
           "--skip-steps", "--steps", str(args.steps), "--imbalance-bytes", args.imbalance_bytes]
    print("command (in each tree, PYTHONPATH=<tree>): " + " ".join(cmd), flush=True)
    rates = {n: {} for n in trees}
    for run in range(args.runs):
        for name in (["old", "new"] if run % 2 == 0 else ["new", "old"]):
            tree = trees[name]
            check = subprocess.run([args.engine_python, "-c", "import hvd_partial; print(hvd_partial.__file__)"],
                                   cwd=tree, env=_env(tree), capture_output=True, text=True).stdout.strip()
            assert check.startswith(tree), (tree, check)
            res = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=900)
            line = []
            for m in re.finditer(r"^\s*(\d+ [KM]iB)\s+(sync|solo|majority)\s+\d+\s+[\d.]+\s+([\d.]+)", res.stdout, re.M):
                rates[name].setdefault(f"{m.group(1)} {m.group(2)}", []).append(float(m.group(3)))
                line.append(f"{m.group(1)} {m.group(2)} {m.group(3)}")
            if not line:
                print(res.stdout[-2000:], res.stderr[-2000:])
            print(f"run {run} {name}: " + ", ".join(line), flush=True)
    print(f"\nmedian rounds/s over {args.runs} runs each, {args.np} ranks, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'row':>16} {'old':>8} {'new':>8} {'new/old':>8}")
    ratios = []
    for key in rates["old"]:
        o, n = statistics.median(rates["old"][key]), statistics.median(rates["new"].get(key, [float('nan')]))
        ratios.append(n / o)
        print(f"{key:>16} {o:8.2f} {n:8.2f} {n / o:8.3f}")
    print(f"median ratio new/old: {statistics.median(ratios):.3f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mpirun", default=os.path.join(OMPI, "mpirun"))
    parser.add_argument("--python", default=os.path.join(OMPI, "python"))
    parser.add_argument("--log-dir", default="", help="keep each job's output here")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("consistency")
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a job counts as hung")
    p.add_argument("--max-seconds", type=float, default=float("inf"), help="draw no more jobs after this long")
    p.add_argument("--only", type=int, help="run job INDEX of the seed's draws alone")
    p.add_argument("--dump-after", type=float, default=20.0,
                   help="seconds after which every rank still running dumps its threads' stacks to the job's output")
    p.add_argument("--verbose", action="store_true")
    p = sub.add_parser("time-lost")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--kills", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--mb", type=float, default=1.0)
    p.add_argument("--work-ms", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=120.0)
    for name, np_, ref in (("throughput", 8, 20.0), ("throughput-grow", 4, 40.0)):
        p = sub.add_parser(name)
        p.add_argument("--np", type=int, default=np_)
        p.add_argument("--period", type=float, default=30.0)
        p.add_argument("--duration", type=float, default=120.0)
        p.add_argument("--ref-seconds", type=float, default=ref)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--mb", type=float, default=1.0)
        p.add_argument("--work-ms", type=float, default=5.0)
        p.add_argument("--warmup", type=int, default=10)
        p.add_argument("--observer", action="store_true",
                       help="keep the stall inspector and report on (off by default: with them on, the first kill "
                            "crashes a survivor's engine, MPI_ERR_RANK in observe/monitor.py, see "
                            "docs/history/elastic-measurements.md)")
    p.add_argument("--state-mb", type=float, default=8.0, help="float64 weights in the ObjectState that sync() sends")
    p.add_argument("--commit-every", type=int, default=10)
    p = sub.add_parser("elastic-off")
    p.add_argument("--old", default="/work/wt-old", help="worktree of the commit before the elastic work")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--imbalance-bytes", default="1048576")
    p.add_argument("--mpiexec", default="mpiexec", help="launcher (plain MPI, no elastic)")
    p.add_argument("--engine-python", default=sys.executable)
    args = parser.parse_args()
    {"consistency": cmd_consistency, "time-lost": cmd_time_lost, "throughput": cmd_throughput,
     "throughput-grow": cmd_throughput_grow, "elastic-off": cmd_elastic_off}[args.cmd](args)


if __name__ == "__main__":
    main()
