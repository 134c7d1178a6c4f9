"""The examples run as smoke tests, so they cannot rot."""

import pytest

from mpi_run import ROOT, run_mpi

pytestmark = pytest.mark.mpi


def test_straggler_demo_runs_and_checks_itself():
    res = run_mpi(str(ROOT / "examples" / "straggler_demo.py"), 3, "--steps", "12", "--step-ms", "10",
                  timeout=120, require_reports=False)
    assert "OK: nothing lost, all ranks identical" in res.stdout
    assert "solo: the fast ranks finished" in res.stdout
