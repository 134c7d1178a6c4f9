"""Growing back under ``hvd-partial-run --elastic -np N --max-np N``:
``elastic_grow.py TOKEN VICTIM KILL_ROUND STEPS [POINT]`` (see tests/launch/test_grow_mpi.py).

A numpy training loop in ``hvd.elastic.run``: each step posts a gradient to a
solo stream (``op=Sum``) and adds every round taken to ``state.weights``;
every 3 steps it flushes the stream and commits. Rank VICTIM (as numbered at
init) dies by ``os._exit(1)`` when it launches its KILL_ROUND-th round
(:mod:`hvd_partial.faults`: no timing), or at the KILL_ROUND-th time it reaches
the named point POINT instead (``grow_stopped``, ``grow_merged``: during a grow). The survivors fail the next commit
(``HorovodInternalError``, restore, reset), and at the commit after it the
world grows back: a new process runs this same script, joins in ``init`` and
starts ``run`` with ``sync()``.

Every rank that ends, survivor or new, writes ``member.<n>.json`` into
``HVD_TEST_OUT`` (``n``: its number, as at init, or after every earlier rank
for a new one): its world, a digest of its weights and what the rounds after
the grow said. Then it shuts down; a survivor ends with ``os._exit(0)``
(MPI_Finalize may wait forever after a failure), the new rank returns through
``MPI_Finalize`` (it saw no failure, and Open MPI's launcher ends the whole job
when a rank a grow started exits without finalizing).
"""

import json
import os
import sys
import time

import numpy as np

import hvd_partial as hvd
from hvd_partial import faults
from hvd_partial.elastic import ObjectState, run

WIDTH = 16


def main(_token, victim, kill_round, steps, point="round_launched"):
    victim, kill_round, steps = int(victim), int(kill_round), int(steps)
    hvd.init()
    me = hvd.world()
    joined = me.original_rank in me.joined
    if me.original_rank == victim and not joined:
        faults.at(point, lambda n: n >= kill_round and os._exit(1))
    state = ObjectState(weights=np.zeros(WIDTH), step=0)
    seen = {"sizes": set(), "new_rank_contributed": False, "first_grown_round": None, "resets": 0}
    state.register_reset_callbacks([lambda: seen.__setitem__("resets", seen["resets"] + 1)])

    def apply(results):
        world = hvd.world()
        for result in results:
            state.weights += result.array
            seen["sizes"].add(result.world_size)
            if result.world_size == world.size and world.joined and result.world_version == world.version:
                if seen["first_grown_round"] is None:
                    seen["first_grown_round"] = time.perf_counter()
                if world.size - 1 in result.contributors:
                    seen["new_rank_contributed"] = True

    train(state, steps, apply)
    world = hvd.world()
    from hvd_partial.engine.growth import history

    grows = [{"before": g.before, "after": g.after, "started": list(g.started), "bytes": g.handshake_bytes,
              "seconds": g.seconds, "began": g.began} for g in history()]
    out = {"member": world.original_rank, "rank": world.rank, "size": world.size, "version": world.version,
           "lost": list(world.lost), "joined": list(world.joined), "members": list(world.members),
           "step": state.step, "digest": hvd_digest(state.weights), "sizes": sorted(seen["sizes"]),
           "new_rank_contributed": seen["new_rank_contributed"], "resets": seen["resets"],
           "is_new": joined, "grows": grows, "first_grown_round": seen["first_grown_round"]}
    path = os.path.join(os.environ["HVD_TEST_OUT"], f"member.{world.original_rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)
    hvd.shutdown()
    if joined:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@run
def train(state, steps, apply, each_step=lambda state: None):
    """Each step posts a one-hot gradient (at the rank's number) to a solo stream and
    ``apply``s the rounds taken; every 3 steps a flush and a commit. ``each_step(state)``
    runs after each step's post."""
    while state.step < steps:
        grad = np.zeros(WIDTH)
        grad[hvd.world().original_rank % WIDTH] = 1.0
        apply(hvd.partial_allreduce(grad, "grads", mode=hvd.Solo(), op=hvd.Sum))
        state.step += 1
        each_step(state)
        if state.step % 3 == 0:
            apply(hvd.flush("grads"))
            state.commit()
    apply(hvd.flush("grads"))


def hvd_digest(array) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


if __name__ == "__main__":
    main(*sys.argv[1:])
