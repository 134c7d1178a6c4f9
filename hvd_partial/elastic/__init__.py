"""Horovod's elastic API, framework-neutral: :func:`run`, :class:`State`,
:class:`ObjectState`, and the epoch dealing behind the samplers. The framework
modules (``hvd_partial.torch.elastic``, ``hvd_partial.tensorflow.elastic``,
``hvd_partial.keras.elastic``) add their states on top. With
``init(elastic=True)`` a dead rank is survived in the same processes; what
``commit``, ``restore`` and ``sync`` do then is in docs/elastic.md, "Horovod's
elastic API".

Example::

    import hvd_partial.elastic as elastic

    @elastic.run
    def train(state):
        ...
        state.commit()

    train(elastic.ObjectState(epoch=0))
"""

from ..errors import HorovodInternalError, HostsUpdatedInterrupt, RankDrained
from .collectives import ElasticCollectives
from .runner import ResetLimitError, run
from .sampling import EpochShards
from .state import ObjectState, State

__all__ = ["run", "State", "ObjectState", "ElasticCollectives", "EpochShards", "ResetLimitError",
           "HorovodInternalError", "HostsUpdatedInterrupt", "RankDrained"]
