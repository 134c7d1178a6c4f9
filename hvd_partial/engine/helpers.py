"""Helper collectives (allreduce, broadcast, barrier, ... of the Horovod
API): run one at a time, in submission order, by the engine thread.

The engine calls :meth:`HelperQueue.progress` on every step and asks
:attr:`HelperQueue.busy` whether one is in progress (it then keeps polling
MPI closely). Each helper is a generator that yields MPI requests and
returns its result.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from ..errors import HvdPartialError
from .handle import Handle


class HelperQueue:
    def __init__(self, done: Callable[[Handle], None]):
        self._queue: deque = deque()
        self._current: tuple | None = None  # (generator, handle, request)
        self._done = done  # told of every handle this queue finished

    def submit(self, start: Callable[[], Any], handle: Handle) -> None:
        self._queue.append((start, handle))

    @property
    def busy(self) -> bool:
        return self._current is not None

    def progress(self) -> bool:
        """Advance the helpers; True if anything happened."""
        worked = False
        while True:
            if self._current is None:
                if not self._queue:
                    return worked
                start, handle = self._queue.popleft()
                generator = start()
                self._current = (generator, handle, None)
            else:
                generator, handle, request = self._current
                if not request.Test():
                    return worked
            worked = True
            try:
                request = generator.send(None)
                self._current = (generator, handle, request)
            except StopIteration as stop:
                self._current = None
                self._done(handle)
                handle.set_result(stop.value)
            except HvdPartialError as err:  # e.g. ranks disagree on a helper's arguments
                self._current = None
                self._done(handle)
                handle.set_error(err)
