import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


import pytest  # noqa: E402


@pytest.fixture
def ulfm():
    """mpiexec's arguments for Open MPI's fault tolerance; skips the test where the launcher has none."""
    from mpi_run import ULFM_ARGS, no_ulfm_launcher

    reason = no_ulfm_launcher()
    if reason:
        pytest.skip(reason)
    return ULFM_ARGS
