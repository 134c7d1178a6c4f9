"""Survivors of a dead rank under MPI's fault tolerance (ULFM):
``ulfm_cases.py CASE TOKEN [ARGS]``, one registered case each, run under
``mpirun --with-ft ulfm --mca btl tcp,self`` (Open MPI 5) except
``support_probe``. Each survivor asserts what it can tell; the test checks
that every survivor reported the same.

Every kill is real (``os._exit``, no MPI call, no cleanup) at a named point:
victims die after allreduce step ``KILL_AFTER`` once every survivor has
announced finishing it (an event, not a time), so survivors fail in step
``KILL_AFTER + 1``; in ``kill_in_recovery`` a second rank dies inside
``agree_and_shrink`` when it logs the named step.

Survivors end with ``leave()``, not MPI_Finalize: Open MPI 5.0.11's finalize
after a failure now and then waits forever (found here: about one run in
twenty, every survivor in ompi_mpi_finalize).

TOKEN only marks the command lines (the test checks that nothing is left
behind). ``joiner`` is not a case: it is the process ``grow_back`` spawns,
which must not report (its world rank 0 would overwrite rank 0's report).
"""

import logging
import os
import sys

import numpy as np
from mpi4py import MPI

from support import announce, await_announced, case, phase, report, run_case

from hvd_partial.transport.ulfm import agree_and_shrink, grow, is_process_failure, join_parent, ulfm_support

STEPS = 8
KILL_AFTER = 2
CLASS_NAMES = {MPI.ERR_PROC_FAILED: "ERR_PROC_FAILED", MPI.ERR_PROC_FAILED_PENDING: "ERR_PROC_FAILED_PENDING",
               MPI.ERR_REVOKED: "ERR_REVOKED"}


def world():
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def die(point):
    """Exit at once, as a crash would: no MPI call, no cleanup."""
    phase(f"killed at {point}")
    announce(f"died-{MPI.COMM_WORLD.Get_rank()}")
    os._exit(1)


def leave():
    """End a survivor after it reported, without MPI_Finalize (see above)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def one_hot_sum(comm):
    """Allreduce of one-hot vectors: exact (all ones) only if every rank took part once."""
    send = np.zeros(comm.Get_size())
    send[comm.Get_rank()] = 1.0
    recv = np.empty_like(send)
    comm.Allreduce(send, recv)
    return recv


def run_until_failure(comm, victims):
    """Allreduce steps until one fails; the victims die after step KILL_AFTER.
    Returns (step that failed, its error) on a survivor."""
    rank, size = comm.Get_rank(), comm.Get_size()
    survivors = [r for r in range(size) if r not in victims]
    for step in range(STEPS):
        phase(f"allreduce step {step}")
        try:
            recv = one_hot_sum(comm)
        except MPI.Exception as err:
            return step, err
        assert np.array_equal(recv, np.ones(size)), (step, recv.tolist())
        if step == KILL_AFTER:
            announce(f"step{step}-done-{rank}")
            if rank in victims:
                await_announced(*[f"step{step}-done-{r}" for r in survivors])
                die(f"after allreduce step {step}")
    raise AssertionError(f"rank {rank}: no allreduce failed in {STEPS} steps though {victims} died")


def check_shrunk(comm, shrunk, failed):
    """Assert, on this survivor, that ``shrunk`` is the survivors' communicator without ``failed``."""
    rank, size = comm.Get_rank(), comm.Get_size()
    survivors = [r for r in range(size) if r not in failed]
    assert shrunk.failed == tuple(sorted(failed)), (shrunk.failed, failed)
    assert shrunk.comm.Get_size() == len(survivors), shrunk.comm.Get_size()
    assert dict(shrunk.ranks) == {old: new for new, old in enumerate(survivors)}, dict(shrunk.ranks)
    assert shrunk.comm.Get_rank() == shrunk.ranks[rank] == shrunk.new_rank(rank)
    assert all(shrunk.new_rank(r) is None for r in failed)
    assert shrunk.comm.Get_errhandler() == MPI.ERRORS_RETURN
    recv = one_hot_sum(shrunk.comm)
    assert np.array_equal(recv, np.ones(len(survivors))), recv.tolist()
    views = shrunk.comm.allgather((shrunk.failed, sorted(shrunk.ranks.items())))
    assert all(view == views[0] for view in views), views  # every survivor agreed on the same


def fail_and_recover(comm, victims):
    step, err = run_until_failure(comm, victims)
    assert step == KILL_AFTER + 1, (step, err)
    assert is_process_failure(err), f"not a process failure: {err}"
    phase("agree_and_shrink")
    shrunk = agree_and_shrink(comm)
    return step, err, shrunk


def outcome(step, err, shrunk):
    return {"step": step, "error": CLASS_NAMES.get(err.Get_error_class(), str(err)), "failed": list(shrunk.failed),
            "size": shrunk.comm.Get_size(), "rounds": shrunk.rounds}


@case
def kill_in_allreduce(_token, victims):
    # The ranks in ``victims`` (comma-separated) die together after step KILL_AFTER.
    victims = [int(v) for v in victims.split(",")]
    comm = world()
    step, err, shrunk = fail_and_recover(comm, victims)
    check_shrunk(comm, shrunk, victims)
    report(outcome(step, err, shrunk))
    leave()


class _DieAt(logging.Handler):
    """Kill this process when agree_and_shrink logs the step ``step``."""

    def __init__(self, step):
        super().__init__(logging.DEBUG)
        self.step = step

    def emit(self, record):
        if getattr(record, "ulfm_step", None) == self.step:
            die(f"agree_and_shrink step {self.step}")


@case
def kill_in_recovery(_token, step):
    # Rank 1 dies after step KILL_AFTER; rank 2 dies inside agree_and_shrink
    # when it reaches ``step``: a second failure during recovery.
    comm = world()
    if comm.Get_rank() == 2:
        logger = logging.getLogger("hvd_partial.ulfm")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_DieAt(step))
    step_failed, err, shrunk = fail_and_recover(comm, [1])
    check_shrunk(comm, shrunk, [1, 2])
    if step == "confirm":  # rank 2 was in the shrunk communicator: another round had to drop it
        assert shrunk.rounds >= 2, shrunk.rounds
    report(outcome(step_failed, err, shrunk))
    leave()


@case
def grow_back(token):
    # Rank 1 dies; the 3 survivors shrink, then grow by one spawned process.
    comm = world()
    step, err, shrunk = fail_and_recover(comm, [1])
    check_shrunk(comm, shrunk, [1])
    phase("grow")
    merged = grow(shrunk.comm, [sys.executable, os.path.abspath(__file__), "joiner", token], 1)
    assert merged.Get_size() == 4, merged.Get_size()
    assert merged.Get_rank() == shrunk.comm.Get_rank(), (merged.Get_rank(), shrunk.comm.Get_rank())
    assert merged.Get_errhandler() == MPI.ERRORS_RETURN
    recv = one_hot_sum(merged)
    assert np.array_equal(recv, np.ones(4)), recv.tolist()
    views = merged.allgather((os.getpid(), MPI.COMM_WORLD.Get_size(), MPI.Comm.Get_parent() != MPI.COMM_NULL))
    child = views[3]
    assert child[1] == 1 and child[2], child  # a world of its own, started by grow
    assert child[0] not in [v[0] for v in views[:3]], views
    report({**outcome(step, err, shrunk), "merged_size": merged.Get_size(), "child": child})
    merged.barrier()  # the joiner ends after every report: Open MPI's launcher ends the job when it does
    leave()


def joiner():
    spawned = MPI.Comm.Get_parent() != MPI.COMM_NULL
    merged = join_parent()
    assert merged.Get_size() == 4 and merged.Get_rank() == 3, (merged.Get_size(), merged.Get_rank())
    recv = one_hot_sum(merged)
    assert np.array_equal(recv, np.ones(4)), recv.tolist()
    merged.allgather((os.getpid(), MPI.COMM_WORLD.Get_size(), spawned))
    merged.barrier()  # until the others reported (see grow_back)
    leave()


@case
def support_probe(_token):
    # What ulfm_support says here, and which errors count as process failures.
    checks = {name: is_process_failure(MPI.Exception(getattr(MPI, name)))
              for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_OTHER", "ERR_UNKNOWN")}
    checks["ValueError"] = is_process_failure(ValueError("not an MPI error"))
    assert not checks["ERR_OTHER"] and not checks["ERR_UNKNOWN"] and not checks["ValueError"], checks
    fatal = world()
    fatal.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    report({"reason": ulfm_support(world()), "failure_checks": checks, "fatal_handler": ulfm_support(fatal)})


if __name__ == "__main__":
    if sys.argv[1:2] == ["joiner"]:
        joiner()
    else:
        run_case()
