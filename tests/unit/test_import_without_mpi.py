"""The package, its protocol core and its simulator import and run without
mpi4py; init() then fails with an error that says what to install."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HIDE_MPI4PY = textwrap.dedent("""
    import importlib.abc
    import sys

    class HideMpi4py(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "mpi4py" or name.startswith("mpi4py."):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, HideMpi4py())
""")


def run_without_mpi4py(body: str) -> subprocess.CompletedProcess:
    code = HIDE_MPI4PY + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_package_core_and_simulator_work_without_mpi4py():
    res = run_without_mpi4py("""
        import numpy as np
        import hvd_partial as hvd
        from hvd_partial.core import Layout
        from hvd_partial.sim import replay

        result = replay(4, hvd.Solo(), max_staleness=2, steps=10,
                        compute_seconds=lambda rank, step: 0.1 if rank == 3 else 0.02)
        assert result.rounds > 10, result
        assert Layout.of([np.zeros(3)]).sizes() == [3]
        assert "mpi4py" not in sys.modules
        try:
            hvd.init()
        except hvd.MpiUnavailableError as err:
            assert isinstance(err, ImportError)
            print("INIT:", err)
        else:
            raise AssertionError("init() without mpi4py did not fail")
    """)
    assert res.returncode == 0, res.stderr
    assert "INIT: hvd_partial.init() needs mpi4py" in res.stdout and "pip install mpi4py mpich" in res.stdout
