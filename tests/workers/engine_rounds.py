"""Posts one-hot contributions under a chosen mode with one slow rank, and
reports every round taken, so the test can check conservation, consistency,
staleness and the mode's rules across ranks.

usage: engine_rounds.py MODE STEPS TAU SLOW_RANK FAST_S SLOW_S [QUORUM] [SEED] [ELEMENTS]

ELEMENTS pads the posted array (zeros past the one-hot part) to that many
float64 elements. SLOW_RANK -1: every third step one rank, in turn, sleeps
SLOW_S and the others FAST_S (mostly balanced training, with a late rank now
and then).
"""

import sys
import time

import numpy as np

from support import digest, phase, report

import hvd_partial as hvd

mode_name, steps, tau, slow_rank, fast_s, slow_s = sys.argv[1:7]
steps, tau, slow_rank, fast_s, slow_s = int(steps), int(tau), int(slow_rank), float(fast_s), float(slow_s)
quorum = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] != "none" else None
seed = int(sys.argv[8]) if len(sys.argv) > 8 else 0
elements = int(sys.argv[9]) if len(sys.argv) > 9 else 0

hvd.init()
rank, size = hvd.rank(), hvd.size()
mode = hvd.mode_from_name(mode_name, seed=seed, quorum=quorum)
total = size * steps
length = max(total, elements)
taken = []
rounds_per_post = []
phase("posting")
started = time.perf_counter()
for step in range(steps):
    late = slow_rank if slow_rank >= 0 else ((step // 3) % size if step % 3 == 2 else None)
    time.sleep(slow_s if rank == late else fast_s)
    grad = np.zeros(length)
    grad[rank * steps + step] = 1.0
    results = hvd.partial_allreduce(grad, "grads", mode=mode, op=hvd.Sum, max_staleness=tau)
    rounds_per_post.append(len(results))
    taken += results
post_seconds = time.perf_counter() - started
phase("flush")
# Rounds before this index were started before this rank entered flush.
taken_before_flush = len(taken)
taken += hvd.flush("grads")
summed = np.sum([r.array for r in taken], axis=0)
padding_sum = float(summed[total:].sum())
summed = summed[:total]
stats = hvd.stats()["grads"]
# what the stream's decentralized rounds counted here: its quorum counter's use
counters = hvd.session.current().engine.readout.stream_counters("grads")
quorum_use = None if counters is None or quorum is None else [counters.quorum_additions, counters.quorum_notices,
                                                               counters.deferred_additions, counters.floods_held]
report({
    "rounds": [[r.round, r.initiator, r.contributors, {str(k): v for k, v in r.staleness.items()},
                digest([r.array]), r.flush] for r in taken],
    "summed": summed,
    "padding_sum": padding_sum,
    "rounds_per_post": rounds_per_post,
    "post_seconds": post_seconds,
    "taken_before_flush": taken_before_flush,
    "stats": stats,
    "quorum_use": quorum_use,
})
hvd.shutdown()
