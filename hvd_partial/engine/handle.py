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

    __slots__ = ("name", "_event", "_value", "_error", "posted_at", "finished_at", "_consumed")

    def __init__(self, name: str):
        self.name = name
        self._event = threading.Event()
        self._value = None
        self._error: BaseException | None = None
        self.posted_at = time.perf_counter()
        self.finished_at: float | None = None
        self._consumed = False

    # engine side
    def set_result(self, value) -> None:
        if self._event.is_set():
            return
        self._value = value
        self.finished_at = time.perf_counter()
        self._event.set()

    def set_error(self, error: BaseException) -> None:
        if self._event.is_set():
            return
        self._error = error
        self.finished_at = time.perf_counter()
        self._event.set()

    # compute side
    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

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
