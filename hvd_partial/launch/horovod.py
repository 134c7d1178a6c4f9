"""Running beside Horovod: when a Horovod framework module is imported and
initialized in this process, ``hvd_partial.init()`` shares its communicator.

Horovod has no getter for its communicator. When it runs on MPI over
``MPI_COMM_WORLD`` (``horovodrun --mpi`` or ``mpirun``, the default), ranks
agree and hvd_partial uses ``MPI_COMM_WORLD`` too. When Horovod was given a
sub-communicator, or runs on Gloo, the ranks cannot be matched and ``init``
raises :class:`~hvd_partial.errors.ConfigError` saying what to do.

Example::

    import horovod.torch as hvd_h
    import hvd_partial

    hvd_h.init()
    hvd_partial.init()              # same ranks as Horovod
    assert hvd_partial.rank() == hvd_h.rank()
"""

from __future__ import annotations

import logging
import os
import sys

from ..errors import ConfigError

log = logging.getLogger("hvd_partial.launch")

HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras",
                   "horovod.mxnet")


def initialized_horovod():
    """The first imported Horovod framework module that is initialized, or None.
    Never imports Horovod itself."""
    for name in HOROVOD_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        try:
            if module.is_initialized():
                return module
        except Exception:  # noqa: BLE001 - an old or broken Horovod: treat as not running
            continue
    return None


def check_launcher_environment(world_size: int, environ=None) -> None:
    """Raise ``ConfigError`` if ``horovodrun`` started this process in Gloo
    mode: it sets ``HOROVOD_RANK``/``HOROVOD_SIZE`` but starts every process
    as a singleton MPI world, so N processes would train unconnected.

    Example::

        check_launcher_environment(MPI.COMM_WORLD.Get_size())
    """
    environ = os.environ if environ is None else environ
    text = environ.get("HOROVOD_SIZE")
    if text is None or world_size != 1:
        return
    try:
        horovod_size = int(text)
    except ValueError:
        return
    if horovod_size > 1:
        raise ConfigError(
            f"this process was started as rank {environ.get('HOROVOD_RANK', '?')} of {horovod_size} by horovodrun "
            "without MPI (Gloo mode: HOROVOD_RANK/HOROVOD_SIZE are set but MPI_COMM_WORLD has 1 process), so the "
            f"{horovod_size} processes would train unconnected. hvd_partial runs on MPI: launch with "
            f"'horovodrun --mpi -np {horovod_size} ...', 'hvd-partial-run -np {horovod_size} ...' or "
            f"'mpiexec -n {horovod_size} ...'")


def shared_comm(comm=None):
    """The communicator ``init`` should use: ``comm`` if given, else Horovod's
    (``MPI_COMM_WORLD``, after checking that the ranks agree), else ``None``
    (``MPI_COMM_WORLD``). Raises ``ConfigError`` for a process that
    ``horovodrun`` started in Gloo mode."""
    if comm is not None:
        return comm
    from mpi4py import MPI

    check_launcher_environment(MPI.COMM_WORLD.Get_size())
    horovod = initialized_horovod()
    if horovod is None:
        return None
    world = MPI.COMM_WORLD
    name = horovod.__name__
    mpi_enabled = getattr(horovod, "mpi_enabled", None)
    if mpi_enabled is not None and not mpi_enabled():
        raise ConfigError(f"{name} is initialized without MPI (Gloo); hvd_partial needs MPI: launch with "
                          "'horovodrun --mpi' or mpirun, or pass hvd_partial.init(comm=...)")
    if horovod.size() != world.Get_size() or horovod.rank() != world.Get_rank():
        raise ConfigError(f"{name} is initialized as rank {horovod.rank()} of {horovod.size()} but "
                          f"MPI_COMM_WORLD has rank {world.Get_rank()} of {world.Get_size()}: Horovod was given "
                          "another communicator; pass the same one to hvd_partial.init(comm=...)")
    log.debug("sharing %s's communicator (MPI_COMM_WORLD, rank %d of %d)", name, world.Get_rank(),
              world.Get_size())
    return world
