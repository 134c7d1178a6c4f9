"""Launching jobs: building the right ``mpiexec`` command line."""

from .mpiexec import MpiFlavor, detect_flavor, mpiexec_command

__all__ = ["MpiFlavor", "detect_flavor", "mpiexec_command"]
