"""Following a host discovery script under ``hvd-partial-run --elastic
--host-discovery-script`` (see tests/launch/test_discovery_mpi.py):
``elastic_discovery.py TOKEN SLOTS_FILE CHANGE_STEP NEW_SLOTS STEPS [joined-fails]``
(``joined-fails``: a new rank raises ImportError before ``hvd.init()``).

The script the test gives the launcher prints ``localhost:N``, N read from
SLOTS_FILE. A numpy training loop in ``hvd.elastic.run``: each step posts a
one-hot gradient (at the rank's number) to a solo stream (``op=Sum``) and
adds every round taken to ``state.weights``; every 3 steps it flushes and
commits. When rank 0 reaches step CHANGE_STEP it writes NEW_SLOTS into
SLOTS_FILE and waits until the launcher's hosts file lists that many slots
(a condition, not a time), so the change is seen at the next commit whatever
the timing: the ranks beyond NEW_SLOTS leave there, or new ranks start.

Every rank that ends, stayed, drained or new, writes ``member.<n>.json`` into
``HVD_TEST_OUT``: its world, step, weights and how it ended. A drained rank
lets :class:`hvd_partial.errors.RankDrained` end it (status 0); the others
shut down and return, as a user's script does (through ``MPI_Finalize``: the
ranks a grow started are a job of their own to Open MPI's launcher, which ends
the whole of it when one of them exits without finalizing).
"""

import json
import os
import sys
import time

import numpy as np

import hvd_partial as hvd
from elastic_grow import WIDTH, train  # (this folder is the script's: first on sys.path)
from hvd_partial.errors import RankDrained
from hvd_partial.launch.rank_status import EXIT_MARK_ENV
from hvd_partial.elastic import ObjectState


def main(_token, slots_file, change_step, new_slots, steps, joined_fails=""):
    change_step, new_slots, steps = int(change_step), int(new_slots), int(steps)
    if joined_fails and "joined." in os.environ.get(EXIT_MARK_ENV, ""):  # a new rank's wrapper marks it so
        raise ImportError("this new rank cannot start")  # before MPI_Init, as a broken install would
    hvd.init()
    me = hvd.world()
    is_new = me.original_rank in me.joined
    state = ObjectState(weights=np.zeros(WIDTH), step=0)
    seen = {"sizes": set(), "resets": 0, "changed": is_new}
    state.register_reset_callbacks([lambda: seen.__setitem__("resets", seen["resets"] + 1)])

    def apply(results):
        for result in results:
            state.weights += result.array
            seen["sizes"].add(result.world_size)

    def each_step(state):
        if state.step == change_step and hvd.world().rank == 0 and not seen["changed"]:
            seen["changed"] = True
            change_slots(slots_file, new_slots)

    try:
        train(state, steps, apply, each_step)
    except RankDrained as drained:
        report(me.original_rank, state, seen, is_new, drained=str(drained))
        raise
    report(me.original_rank, state, seen, is_new, world=hvd.world())
    hvd.shutdown()
    if me.original_rank == 3: time.sleep(3)


def change_slots(slots_file, slots):
    """Write the slots the discovery script prints, then wait for the launcher to have run it."""
    with open(slots_file + ".tmp", "w") as fh:
        fh.write(str(slots))
    os.replace(slots_file + ".tmp", slots_file)
    hosts_file = os.environ["HVD_PARTIAL_HOSTS_FILE"]
    while True:
        try:
            with open(hosts_file) as fh:
                if sum(n for _, n in json.load(fh)["hosts"]) == slots:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)  # polls the launcher's file: the test's timeout bounds it


def report(member, state, seen, is_new, world=None, drained=None):
    out = {"member": member, "step": state.step, "weights": state.weights.tolist(), "sizes": sorted(seen["sizes"]),
           "resets": seen["resets"], "is_new": is_new, "drained": drained}
    if world is not None:
        out.update(rank=world.rank, size=world.size, version=world.version, members=list(world.members),
                   joined=list(world.joined), left=list(world.left), lost=list(world.lost))
    path = os.path.join(os.environ["HVD_TEST_OUT"], f"member.{member}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(*sys.argv[1:])
