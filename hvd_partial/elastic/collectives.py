"""The calls an elastic state makes on the world, in one object, so that the
states compose with hvd_partial's functions in a job and with fakes in tests.

Example::

    collectives = ElasticCollectives.default()   # hvd_partial.broadcast_object, world(), ...
    version = collectives.world().version
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

#: The helper collective every rank makes in ``check_host_updates``: its name,
#: so that it never meets another call of the program.
CHECK_NAME = "hvd_partial.elastic.check_host_updates"


@dataclass(frozen=True)
class ElasticCollectives:
    """``broadcast_object(obj, name)`` returns rank 0's ``obj``;
    ``allgather_object(obj, name)`` every rank's, in rank order; ``world()``
    the :class:`~hvd_partial.core.world.World`; ``acknowledge_world_change()``
    lets the helper collectives run again after a change; ``grow()`` (collective)
    starts new ranks where the world is below ``max_np`` and returns how many
    (default: never)."""

    broadcast_object: Callable[[Any, str], Any]
    allgather_object: Callable[[Any, str], list]
    world: Callable[[], Any]
    acknowledge_world_change: Callable[[], None]
    grow: Callable[[], int] = lambda: 0

    @classmethod
    def default(cls) -> "ElasticCollectives":
        """hvd_partial's own functions, looked up at each call (so that a test
        may replace ``hvd_partial.world``)."""
        import hvd_partial

        return cls(
            broadcast_object=lambda obj, name: hvd_partial.broadcast_object(obj, 0, name=name),
            allgather_object=lambda obj, name: hvd_partial.allgather_object(obj, name=name),
            world=lambda: hvd_partial.world(),
            acknowledge_world_change=lambda: hvd_partial.acknowledge_world_change(),
            grow=_grow_world,
        )


def _grow_world() -> int:
    from ..engine.growth import grow_world

    return grow_world()
