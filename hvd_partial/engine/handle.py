"""Handles: what a compute thread holds while the engine works for it."""

from __future__ import annotations

import threading
import time


class Handle:
    """An operation in progress. Pass it to ``poll`` or ``synchronize``.

    Example::

        handle = hvd.partial_allreduce_async(grad, "grads")
        ...  # overlap other work
        results = hvd.synchronize(handle)
    """

    __slots__ = ("name", "parks", "_signal", "_done", "_value", "_error", "posted_at", "finished_at")

    def __init__(self, name: str, parks: bool = False):
        self.name = name
        # a call that needs every rank: a rank waiting on it holds no partial stream back
        self.parks = parks
        # A bare lock, held until the engine finishes: cheaper to hand over
        # than threading.Event, and this is on every post's path.
        self._signal = threading.Lock()
        self._signal.acquire()
        self._done = False
        self._value = None
        self._error: BaseException | None = None
        self.posted_at = time.perf_counter()
        self.finished_at: float | None = None

    # engine side
    def set_result(self, value) -> None:
        if self._done:
            return
        self._value = value
        self._finish()

    def set_error(self, error: BaseException) -> None:
        if self._done:
            return
        self._error = error
        self._finish()

    def _finish(self) -> None:
        self.finished_at = time.perf_counter()
        self._done = True
        self._signal.release()

    # compute side
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        if self._signal.acquire(timeout=-1 if timeout is None else timeout):
            self._signal.release()  # let any other waiter through too
            return True
        return self._done

    def value(self):
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def wait_seconds(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.posted_at

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<hvd_partial.Handle {self.name!r} {state}>"
