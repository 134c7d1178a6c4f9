"""``hvd.elastic`` (Horovod's elastic training) is not provided by hvd_partial.

Elastic Horovod adds and removes workers while training runs, which needs a
launcher that restarts processes and a rendezvous outside MPI. hvd_partial
runs in a fixed MPI job: every name below exists, so scripts import and
reference them, and each raises :class:`~hvd_partial.errors.NotSupportedError`
at first use, saying what to do instead.

Example::

    @hvd.elastic.run          # raises NotSupportedError here, not an AttributeError
    def train(state): ...
"""

from __future__ import annotations

from ..errors import NotSupportedError

_WHY = ("hvd.elastic (elastic training) is not supported by hvd_partial: it runs in a fixed MPI job. Run without "
        "the elastic wrapper (call your training function directly, save checkpoints with the optimizer's "
        "flush() and state_dict(), and restart the job from the last checkpoint); partial collectives already "
        "keep the fast ranks going when some are slow")


def _refuse(what: str):
    raise NotSupportedError(f"{what}: {_WHY}")


def run(func):
    """Horovod's ``@hvd.elastic.run``: refused at decoration."""
    _refuse("hvd.elastic.run")


class State:
    """Horovod's elastic state base class: refused when created."""

    def __init__(self, *args, **kwargs):
        _refuse(f"hvd.elastic.{type(self).__name__}")


class ObjectState(State):
    pass


class TorchState(ObjectState):
    pass


class ElasticSampler:
    """Horovod's elastic sampler: refused when created (use a
    ``torch.utils.data.distributed.DistributedSampler`` with
    ``num_replicas=hvd.size(), rank=hvd.rank()``)."""

    def __init__(self, *args, **kwargs):
        _refuse("hvd.elastic.ElasticSampler")


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler"]
