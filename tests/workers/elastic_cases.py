"""Training on after a dead rank (elastic training, the engine wired to ULFM):
``elastic_cases.py CASE TOKEN MODE VICTIM POINT COUNT``, run under
``mpirun --with-ft ulfm --mca btl tcp,self`` (Open MPI 5).

The victim dies by ``os._exit`` when the named point of hvd_partial's code
(:mod:`hvd_partial.faults`) is reached for the COUNT-th time: no timing.
VICTIM, POINT and COUNT may be comma-separated lists, one entry per victim
(two ranks at once, or a second one during the recovery from the first). Every
rank posts one-hot contributions (rank r's post t is 1 at ``r * STEPS + t``)
with ``op=Sum``; each survivor reports what the test checks across survivors:
its own posts each summed exactly once, the dead rank's each at most once,
the digest of every result in round order, the world it ends in.

Survivors read what they report before any of them shuts down (shutdown is
collective, so none has left by then), report, shut down, then end with
``os._exit`` (Open MPI 5.0's MPI_Finalize after a failure now and then waits
forever; and its launcher counts a rank that exits without it as dead, so the
job may be ended once half have: the reports are written by then).
"""

import hashlib
import os
import signal
import sys

import numpy as np

from support import case, phase, report, run_case

import hvd_partial as hvd
from hvd_partial import faults
from hvd_partial.collectives.process_sets import set_engine

STEPS = 16


def _stop_self():
    """Stop this process (SIGSTOP): alive to MPI, silent to its peers."""
    os.kill(os.getpid(), signal.SIGSTOP)


@case(names=("train_through_a_kill", "train_through_a_stop"))
def train_through(how, _token, mode, victim, point, count):
    """``train_through_a_kill``: the victim exits; ``..._a_stop``: it stops, and its
    ring successor's liveness declares it and ends it (the rank's failure timeout is short)."""
    victims = [int(v) for v in victim.split(",")]
    kills = dict(zip(victims, zip(point.split(","), (int(c) for c in count.split(",")))))
    stops = how == "train_through_a_stop"
    hvd.init(elastic=True, mode=mode, **({"heartbeat_seconds": 0.2, "failure_timeout_seconds": 2.0} if stops else {}))
    me, size = hvd.rank(), hvd.size()
    if me in kills:
        end = _stop_self if stops else (lambda: os._exit(1))
        where, count = kills[me]
        faults.at(where, lambda n: n >= count and end())
    length = size * STEPS
    results = []
    for t in range(STEPS):
        x = np.zeros(length, np.float64)
        x[me * STEPS + t] = 1.0
        results += hvd.partial_allreduce(x, "g", op=hvd.Sum)
    results += hvd.flush("g")
    total = sum(r.array for r in results)
    world = hvd.world()
    mine = total[me * STEPS:(me + 1) * STEPS]
    assert (mine == 1).all(), f"rank {me}: own posts summed {mine.tolist()}"
    assert total.max() <= 1, f"rank {me}: a post summed twice: {np.flatnonzero(total > 1).tolist()}"
    dead = np.concatenate([total[v * STEPS:(v + 1) * STEPS] for v in victims])
    assert [r.round for r in results] == list(range(len(results))), "rounds out of order"
    sizes = sorted({r.world_size for r in results})
    phase("reporting")
    report({"lost": list(world.lost), "size": hvd.size(), "version": world.version, "sizes": sizes,
            "rounds": len(results), "dead_summed": int(dead.sum()),
            "survivors_whole": bool(all((total[m * STEPS:(m + 1) * STEPS] == 1).all() for m in world.members)),
            "digest": hashlib.sha1(b"".join(r.array.tobytes() for r in results)).hexdigest()})
    _leave()


def _leave():
    """Shut down (collective: no survivor leaves while another still needs it), then exit at once."""
    try:
        hvd.shutdown()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@case
def helper_fails_alike(_token, victim):
    """A metric allreduce in flight at the kill has one outcome on every survivor: the
    result where some survivor completed it (then the next call fails), else
    HorovodInternalError; after acknowledge_world_change() helpers run on the new world."""
    victim = int(victim)
    hvd.init(elastic=True)
    me = hvd.rank()
    if me == victim:
        faults.at("helper_started", lambda n: os._exit(1))
    outcome = "no error"
    for name in ("metric", "metric2"):  # the first in flight at the kill; the next refused until acknowledged
        try:
            hvd.allreduce(np.ones(4), name=name, op=hvd.Sum)
        except hvd.HorovodInternalError:
            outcome = f"{name}: HorovodInternalError"
            break
    hvd.acknowledge_world_change()
    after = hvd.allreduce(np.ones(4), name="after", op=hvd.Sum)
    report({"outcome": outcome, "after": after.tolist(), "size": hvd.size()})
    _leave()


@case
def process_sets_dropped(_token, victim):
    """A world change drops every process set: after acknowledge_world_change() a set
    added before raises ProcessSetError (no hang), and a set added again runs on the new world."""
    victim = int(victim)
    hvd.init(elastic=True)
    me = hvd.rank()
    pair = hvd.add_process_set([0, 1])
    try:  # what a solo or majority optimizer on the set asks first: its engine (refused with elastic)
        set_engine(pair)
        solo_refused = None
    except hvd.HvdPartialError as err:
        solo_refused = type(err).__name__
    if me == victim:
        faults.at("helper_started", lambda n: os._exit(1))
    for name in ("metric", "metric2"):
        try:
            hvd.allreduce(np.ones(1), name=name, op=hvd.Sum)
        except hvd.HorovodInternalError:
            break
    hvd.acknowledge_world_change()
    try:
        hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=pair)
        dropped = None
    except hvd.ProcessSetError as err:
        dropped = str(err)
    again = hvd.add_process_set([0, 1])
    pair_sum = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=again).tolist() if again.included() else None
    report({"dropped": dropped, "again": again.process_set_id, "pair_sum": pair_sum, "size": hvd.size(),
            "solo_refused": solo_refused})
    _leave()


if __name__ == "__main__":
    run_case()
