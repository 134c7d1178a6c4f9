"""A grow without ``hvd-partial-run`` whose new process ends before it joins:
``elastic_grow_unjoined.py MARKER`` on 2 ranks under ``mpirun --with-ft ulfm``
with ``HVD_PARTIAL_ELASTIC=1``, ``HVD_PARTIAL_MAX_NP=3`` (see
tests/launch/test_grow_mpi.py).

Every old rank has looked for MARKER before ``init``; rank 0 writes it after a
collective that follows ``init``, so the process the first commit's grow
starts is the only one that finds it, and it raises before ``MPI_Init`` (as a
broken install would). No launcher records its end: the old ranks end, naming
it, once ``grow_timeout_seconds`` has passed."""

import os
import sys

marker = sys.argv[1]
if os.path.exists(marker):
    raise ImportError("this new rank cannot start")

import numpy as np  # noqa: E402

import hvd_partial as hvd  # noqa: E402
from hvd_partial.elastic import ObjectState, run  # noqa: E402

hvd.init()
hvd.allreduce(np.zeros(1), name="every_old_rank_is_past_its_check")
if hvd.rank() == 0:
    with open(marker, "w"):
        pass


@run
def train(state):
    state.commit()  # the world is below max_np: this grows it


train(ObjectState(step=0))
raise SystemExit("the grow returned: its new rank joined")
