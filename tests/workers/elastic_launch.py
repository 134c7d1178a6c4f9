"""Elastic launch cases: ``elastic_launch.py CASE TOKEN [ARGS]``, one
registered case each (see tests/launch/test_launch_elastic_mpi.py). TOKEN
only marks the command line, so the test can check that nothing is left."""

import os
import sys

from support import case, expect, report, run_case

import hvd_partial as hvd
from hvd_partial.errors import UlfmUnavailableError


@case
def init_refused(_token, how):
    # Where MPI has no ULFM (MPICH; Open MPI without --with-ft ulfm), elastic init
    # fails on every rank with the reason and the fix, and makes no collective call.
    if how == "keyword":
        got = expect(UlfmUnavailableError, hvd.init, elastic=True)
    else:  # HVD_PARTIAL_ELASTIC=1 in the environment
        assert os.environ.get("HVD_PARTIAL_ELASTIC") == "1"
        got = expect(UlfmUnavailableError, hvd.init)
    assert not hvd.is_initialized()
    report({"error": got})


@case
def one_dies(_token, victim):
    # Every rank starts elastic; after a barrier rank ``victim`` dies with
    # os._exit(1). The survivors make no collective call after it (the engine's
    # recovery is not the launcher's business): each reports, then ends with
    # os._exit(0), as after a failure (where MPI_Finalize may hang).
    from mpi4py import MPI

    from hvd_partial import session

    hvd.init()
    transport = session.current().transport
    assert hvd.config().elastic
    for comm in (MPI.COMM_WORLD, transport.control, transport.helpers, transport.factory):
        assert comm.Get_errhandler() == MPI.ERRORS_RETURN, comm
    hvd.barrier()
    rank = hvd.rank()
    if rank == int(victim):
        os._exit(1)
    report({"rank": rank, "size": hvd.size()})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run_case()
