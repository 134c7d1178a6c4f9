"""Horovod's process queries and build flags, for ``hvd_partial.torch``
(the flags are every adapter's, from :mod:`hvd_partial.build_flags`: MPI
only; CUDA tensors work through host staging, not a CUDA-built core).

Example::

    import hvd_partial.torch as hvd

    hvd.init()
    if hvd.mpi_threads_supported():
        ...
"""

from __future__ import annotations

from .. import api, session
from ..build_flags import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,  # noqa: F401
                           mpi_enabled, mpi_threads_supported, nccl_built, rocm_built)
from ..collectives.functions import run_on_engine
from ..errors import ConfigError


def cross_size() -> int:
    """The number of nodes (processes with the same local rank), assuming
    every node runs ``local_size()`` ranks, placed node by node."""
    return api.size() // api.local_size()


def cross_rank() -> int:
    """This process's node index, under the same placement as :func:`cross_size`."""
    return api.rank() // api.local_size()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing this rank's Chrome-trace timeline to ``file_path``
    (``{rank}`` in the name is replaced, else ``.rank<N>`` is added before
    the suffix; see docs/operations.md). ``mark_cycles`` is accepted for
    Horovod's signature. Also settable at start-up: ``init(timeline_filename=...)``.

    Example::

        hvd.start_timeline("/tmp/timeline.json")
    """
    engine = session.require().engine
    if not isinstance(file_path, str) or not file_path:
        raise ConfigError(f"start_timeline: file_path must be a non-empty str, got {file_path!r}")
    from ..observe import Observer, Timeline

    def attach():
        if engine.timeline is not None:
            raise ConfigError(f"start_timeline: a timeline is already being written ({engine.timeline.path}); "
                              "call stop_timeline() first")
        timeline = Timeline(file_path, engine.rank, engine.size)
        if engine.observer is None:
            engine.observer = Observer(engine, timeline)
        else:
            engine.observer.timeline = timeline
        engine.timeline = timeline

    run_on_engine(attach)


def stop_timeline() -> None:
    """Stop and close the timeline started by :func:`start_timeline` (or by
    ``timeline_filename``); does nothing when none is being written."""
    engine = session.require().engine

    def detach():
        timeline = engine.timeline
        if timeline is None:
            return
        engine.timeline = None
        if engine.observer is not None:
            engine.observer.timeline = None
        timeline.close()

    run_on_engine(detach)
