"""The error of the stall inspector (see :mod:`hvd_partial.observe.monitor`).

Example::

    try:
        hvd.partial_allreduce(grad, "grads")
    except StalledRankError as err:   # also a RankFailedError
        print("rank", err.rank, "stalled:", err.reason)
"""

from __future__ import annotations

from ..errors import RankFailedError


class StalledRankError(RankFailedError):
    """A rank called no hvd_partial function for ``stall_shutdown_seconds``
    while the others waited or kept posting. ``rank`` is the stalled rank;
    every rank raises it, the stalled one too (at its next call)."""
