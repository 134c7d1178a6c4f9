"""Find the MPI installation's ``mpiexec`` and build command lines for it.

Example::

    cmd = mpiexec_command(4, ["python", "train.py"])
    subprocess.run(cmd, check=True)
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from enum import Enum


class MpiFlavor(Enum):
    MPICH = "mpich"  # MPICH / Hydra (also Intel MPI, MVAPICH)
    OPEN_MPI = "openmpi"
    UNKNOWN = "unknown"


def find_mpiexec() -> str:
    """The ``mpiexec`` next to the running Python first (pip-installed MPI), then PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError("no mpiexec found: pip install 'hvd-partial[mpich]' or load your cluster's MPI")
    return found


@functools.lru_cache(maxsize=None)
def detect_flavor(mpiexec: str | None = None) -> MpiFlavor:
    exe = mpiexec or find_mpiexec()
    try:
        text = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return MpiFlavor.UNKNOWN
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return MpiFlavor.MPICH
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return MpiFlavor.OPEN_MPI
    return MpiFlavor.UNKNOWN


def mpiexec_command(nprocs: int, program: list[str], *, keep_survivors: bool = False, hosts: str | None = None,
                    hostfile: str | None = None, env: dict[str, str] | None = None,
                    mpiexec: str | None = None) -> list[str]:
    """An ``mpiexec`` command line that runs ``program`` on ``nprocs`` ranks.

    Processes are not bound to cores (the engine thread must not share the
    training thread's core). ``keep_survivors`` asks the launcher not to kill
    the other ranks when one dies, so that they can report it themselves.
    """
    exe = mpiexec or find_mpiexec()
    flavor = detect_flavor(exe)
    cmd = [exe]
    if flavor is MpiFlavor.OPEN_MPI:
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
        if hosts:
            cmd += ["-H", hosts]
        if hostfile:
            cmd += ["--hostfile", hostfile]
        for key, value in (env or {}).items():
            os.environ.setdefault(key, value)
            cmd += ["-x", key]
    else:
        cmd += ["-bind-to", "none"]
        if keep_survivors and flavor is MpiFlavor.MPICH:
            cmd += ["-disable-auto-cleanup"]
        if hosts:
            cmd += ["-hosts", hosts]
        if hostfile:
            cmd += ["-f", hostfile]
        for key, value in (env or {}).items():
            cmd += ["-genv", key, value]
    cmd += ["-n", str(nprocs)]
    return cmd + list(program)
