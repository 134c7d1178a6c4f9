"""Horovod's elastic state objects, framework-neutral: what ``commit``,
``restore`` and ``sync`` mean when the survivors of a dead rank go on in the
same processes (docs/elastic.md, "Horovod's elastic API").

- ``save()`` copies the state to host memory; ``restore()`` puts the last
  copy back; ``sync()`` makes every rank's state rank 0's.
- ``commit()`` is ``save()`` then ``check_host_updates()``.
- ``check_host_updates()`` makes one helper collective, so that every
  survivor of a world change learns of it at the same call (it raises
  ``HorovodInternalError`` there, on every survivor, until the reset
  acknowledges the change), then raises ``HostsUpdatedInterrupt(skip_sync=True)``
  if the world changed since this state last saw it (a change this program
  acknowledged itself).

Example::

    state = ObjectState(epoch=0, batch=0)
    state.batch = 5
    state.commit()            # saved: epoch 0, batch 5
    state.batch = 9
    state.restore()           # state.batch == 5 again
"""

from __future__ import annotations

import copy
import logging

from ..errors import HostsUpdatedInterrupt
from .collectives import CHECK_NAME, ElasticCollectives

log = logging.getLogger("hvd_partial.elastic")


class State:
    """The base of every elastic state. Subclasses define ``save``,
    ``restore`` and ``sync``; ``reset`` (nothing here) re-reads what depends
    on the world after a change, before the reset callbacks run.

    ``collectives``: the calls made on the world (default hvd_partial's own)."""

    def __init__(self, collectives: ElasticCollectives | None = None):
        self._collectives = collectives or ElasticCollectives.default()
        self._reset_callbacks: list = []
        self._seen_version: int | None = None  # the world version this state last saw

    @property
    def collectives(self) -> ElasticCollectives:
        return self._collectives

    def register_reset_callbacks(self, callbacks) -> None:
        """Run ``callbacks`` (functions of no argument), in order, after every
        reset, e.g. to scale the learning rate by the new ``hvd.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """After a world change: note the new world, ``reset()``, then the
        reset callbacks (``hvd.elastic.run`` calls it)."""
        self._seen_version = self._collectives.world().version
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state, then check for a world change (raising as
        :meth:`check_host_updates` says)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Collective (every rank, at the same point of the program). Raises
        ``HorovodInternalError`` on every survivor when the world changed and
        the change is not yet acknowledged, and
        ``HostsUpdatedInterrupt(skip_sync=True)`` when the world changed since
        this state last saw it but the program already acknowledged it. With
        ``hosts_file`` set, ranks whose hosts were drained raise
        :class:`~hvd_partial.errors.RankDrained` here (docs/elastic.md, "Hosts from
        a discovery script")."""
        world = self._collectives.world()
        # A helper collective: it fails on every survivor alike after a change nobody has acknowledged,
        # so that survivors that read the world version at different moments still leave at the same call.
        self._collectives.broadcast_object(world.version, CHECK_NAME)
        # Every rank is here and agrees on the world: where it is below max_np, new ranks may join now.
        started = self._collectives.grow()
        if started:
            self._seen_version = self._collectives.world().version
            raise HostsUpdatedInterrupt(skip_sync=False, message=f"{started} rank(s) joined: the world has "
                                                                 f"{self._collectives.world().size} ranks now")
        version = self._collectives.world().version
        if self._seen_version is None:
            self._seen_version = version
        elif version != self._seen_version:
            log.info("rank %d: world version %d (was %d), lost %s", world.rank, version, self._seen_version,
                     list(self._collectives.world().lost))
            self._seen_version = version
            raise HostsUpdatedInterrupt(skip_sync=True, message=f"the world changed to version {version}")

    def save(self) -> None:
        """Copy the state to host memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Put back the last saved state, dropping changes made since."""
        raise NotImplementedError

    def sync(self) -> None:
        """Collective: make every rank's state rank 0's."""
        raise NotImplementedError

    def reset(self) -> None:
        """Re-read what depends on the world (ranks, size), after a change and
        before the reset callbacks."""


class ObjectState(State):
    """Plain Python values, given as keyword arguments and kept as attributes.
    ``save`` deep-copies them, ``restore`` assigns deep copies of the saved
    values back, ``sync`` broadcasts the saved values from rank 0 and assigns
    them (as Horovod's does: values changed since the last commit are
    replaced). The keyword ``collectives`` is the state's own (see
    :class:`State`), not an attribute.

    Example::

        state = ObjectState(epoch=1, batch=0)
        state.sync()          # every rank: rank 0's epoch and batch
    """

    def __init__(self, collectives: ElasticCollectives | None = None, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._assign_saved()
        super().__init__(collectives)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._assign_saved()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._collectives.broadcast_object(self._saved_state,
                                                                   "hvd_partial.elastic.sync.objects")
            self._assign_saved()

    def _assign_saved(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
