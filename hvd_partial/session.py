"""The one object that holds a process's hvd_partial state between ``init()``
and ``shutdown()``.

``init()`` creates a :class:`Session`; ``shutdown()`` drops it, so a later
``init()`` starts from nothing. Framework adapters keep their own per-run
state here too (one typed field per adapter, see :class:`Session`), never in
module globals, so that it cannot outlive the run it belongs to.

Example::

    from hvd_partial import session

    s = session.require()          # NotInitializedError before init()
    print(s.transport.rank, s.config.max_staleness)
    results = session.wait(handle)  # what hvd_partial.synchronize does
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .collectives.set_engines import SetEngines
from .config import Config
from .errors import NotInitializedError

if TYPE_CHECKING:  # annotations only: the engine's modules import this one
    from .core.buffer_pool import BufferPool
    from .core.fusion import Layout
    from .core.messages import StreamSignature
    from .engine.engine import Engine
    from .engine.handle import Handle
    from .tensorflow.state import TensorFlowState
    from .transport.protocol import Transport


@dataclass
class Session:
    """State of one ``init()`` ... ``shutdown()`` run of this process.

    - ``engine``: the background engine (its thread, streams and rounds).
    - ``transport``: the transport the engine runs on (rank, size, placement).
    - ``config``: the configuration in effect.
    - ``signatures``: per stream name, the settings of its first post on this
      rank, the rank, and what they were made of (a later post with other
      settings is refused locally).
    - ``pack_pools``: per grouped stream, the buffers its fused posts are packed into.
    - ``layouts``: per stream name, the shapes and dtypes of its last post,
      their :class:`~hvd_partial.core.fusion.Layout` and its groups (reused while they match:
      a layout derives its buckets and offsets once).
    - ``set_engines``: the process sets' own engines (solo and majority among a
      set's members), started on first use, stopped by ``remove_process_set``
      and ``shutdown()`` (:class:`~hvd_partial.collectives.set_engines.SetEngines`).
    - ``adapters``: state of other per-session users (the helper collectives'
      names), by name, made on first use by :meth:`adapter_state`.
    - then the framework adapters' state: one typed field per adapter.
    - ``tensorflow``: the TensorFlow adapter's tape streams, hand-outs and
      posted streams (:class:`~hvd_partial.tensorflow.state.TensorFlowState`,
      made by :func:`hvd_partial.tensorflow.state.require`).
    """

    engine: Engine
    transport: Transport
    config: Config
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards the fields below
    # -- the partial allreduce API's (hvd_partial.api)
    signatures: dict[str, tuple[StreamSignature, int, tuple]] = field(default_factory=dict)
    pack_pools: dict[str, BufferPool] = field(default_factory=dict)
    layouts: dict[str, tuple[tuple, Layout, list | None]] = field(default_factory=dict)  # name -> (shapes, layout, groups)
    # -- the process sets' own engines (they own their locks)
    set_engines: SetEngines = field(default_factory=SetEngines)
    # -- other users' state by name, made on first use (adapter_state): the helper collectives' names
    adapters: dict[str, Any] = field(default_factory=dict)
    # -- framework adapters' state: one typed field per adapter, None until the adapter first runs
    tensorflow: TensorFlowState | None = None

    def adapter_state(self, name: str, make: Callable[[], Any]) -> Any:
        """The state object of adapter ``name`` in this session, made by ``make()`` on first use."""
        with self.lock:
            state = self.adapters.get(name)
            if state is None:
                state = self.adapters[name] = make()
            return state


_current: Session | None = None
_ended = False  # a session existed and was shut down (for clearer errors)


def current() -> Session | None:
    """The running session, or None before ``init()`` and after ``shutdown()``."""
    return _current


def begin(session: Session) -> None:
    global _current, _ended
    _current, _ended = session, False


def end() -> None:
    global _current, _ended
    if _current is not None:
        _current, _ended = None, True


def require() -> Session:
    """The running session; raises the engine's failure if it failed, else
    :class:`NotInitializedError` before ``init()`` or after ``shutdown()``."""
    s = _current
    if s is None or not s.engine.running:
        if s is not None and s.engine.failure is not None:
            raise s.engine.failure
        when = "after shutdown()" if _ended else "before init()"
        raise NotInitializedError(f"hvd_partial was called {when}; call hvd_partial.init() first")
    return s


def wait(handle: Handle):
    """Wait for ``handle`` on the running session's engine and return its value
    (a handle that completed before ``shutdown()`` still gives its value after)."""
    s = _current
    if s is None:
        if handle.done():
            return handle.value()
        raise NotInitializedError("synchronize() after shutdown() on a handle that never completed")
    return s.engine.wait(handle)
