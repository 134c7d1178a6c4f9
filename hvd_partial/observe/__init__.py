"""Observing a running job: the slow-rank report, the stall inspector and the
Chrome-trace timeline. The engine calls :func:`attach_observer` once; when
every feature is off it gets ``None`` and pays nothing.

Example::

    HVD_PARTIAL_TIMELINE_FILENAME=/tmp/tl.json HVD_PARTIAL_LOG_LEVEL=INFO mpiexec -n 4 python train.py
"""

from __future__ import annotations

from .monitor import TAG_STATUS, Observer, RankStatus, status_interval
from .stall import StalledRankError
from .timeline import Timeline, load_events, merge, rank_files, rank_path

__all__ = ["attach_observer", "Observer", "RankStatus", "StalledRankError", "TAG_STATUS", "Timeline",
           "load_events", "merge", "rank_files", "rank_path"]


def attach_observer(engine):
    """The observer for ``engine`` (``None`` when the stall inspector, the
    report and the timeline are all off)."""
    config = engine.config
    timeline = None
    if config.timeline_filename:
        timeline = Timeline(config.timeline_filename, engine.rank, engine.size)
    if timeline is None and status_interval(config) is None:
        return None
    return Observer(engine, timeline)
