"""What this build of hvd_partial supports, under Horovod's names, for every
framework adapter: it runs over MPI (mpi4py) only, so ``mpi_built()`` and
``mpi_enabled()`` are True and the other controllers' and libraries' flags
False. Reductions run on the host; the PyTorch adapter still accepts CUDA
tensors by staging them through host buffers, without a CUDA-built core.

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    if hvd.mpi_threads_supported():
        ...
"""

from __future__ import annotations

from . import session

__all__ = ["mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built",
           "ddl_built", "ccl_built", "cuda_built", "rocm_built"]


def mpi_built() -> bool:
    """True: hvd_partial always runs over MPI."""
    return True


def mpi_enabled() -> bool:
    """True: MPI is the (only) controller and data path."""
    return True


def mpi_threads_supported() -> bool:
    """True when MPI granted ``MPI_THREAD_MULTIPLE`` (so your own threads may
    call MPI too); raises ``NotInitializedError`` before ``init``, as Horovod does."""
    transport = session.require().transport
    from mpi4py import MPI

    return transport.thread_level >= MPI.THREAD_MULTIPLE


def gloo_built() -> bool:
    """False: there is no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """False: there is no Gloo controller."""
    return False


def nccl_built() -> bool:
    """False: reductions run on the host through MPI."""
    return False


def ddl_built() -> bool:
    """False."""
    return False


def ccl_built() -> bool:
    """False."""
    return False


def cuda_built() -> bool:
    """False: the core is not built against CUDA."""
    return False


def rocm_built() -> bool:
    """False."""
    return False
