"""The engine's side of parked ranks (docs/design.md, "Parked ranks").

A compute thread that waits in a call that needs every rank (a helper
collective, a barrier, a flush) holds no partial stream back meanwhile: once
the wait has lasted the activation delay (at once without one) this part
parks the rank's streams in the driver, and unparks them when the last such
wait ends. A wait that ends sooner (every rank came at once) parks nothing,
so it starts no round a designated rank would otherwise start there.

Takes that come while rounds joined parked are still in flight wait here
until those rounds complete (``Driver.take`` says None until then).

Example::

    parking = Parking(driver, delay, failure=lambda: engine.failure)
    parking.change(+1)        # a compute thread begins such a wait
    if parking.park_at is not None and parking.park_at <= time.perf_counter():
        parking.park_streams()
"""

from __future__ import annotations

import time
from typing import Callable


class Parking:
    """Whether this rank's streams are parked, and the takes waiting for rounds joined parked.

    ``failure()``: this rank's failure, or None (a failed rank's driver is told nothing more).
    """

    def __init__(self, driver, delay: float, failure: Callable[[], BaseException | None]):
        self._driver = driver
        self._delay = delay
        self._failure = failure
        self.waiting = 0  # compute threads waiting in a call that needs every rank
        self.park_at: float | None = None  # when the streams are parked, while such a wait lasts
        self.parked = False  # the driver's streams are parked
        self.takes: list = []  # TakeCommands waiting for rounds joined parked to complete

    def change(self, delta: int) -> None:
        """A compute thread begins (``+1``) or ends (``-1``) waiting in a call that needs every rank."""
        before = self.waiting
        self.waiting += delta
        if before == 0 and self.waiting > 0:
            self.park_at = time.perf_counter() + self._delay
            if self._delay <= 0:
                self.park_streams()
        elif before > 0 and self.waiting == 0:
            self.park_at = None
            if self.parked:
                self.parked = False
                if self._failure() is None:
                    self._driver.unpark()

    def park_streams(self) -> None:
        """The wait has lasted the delay: park the streams."""
        self.park_at = None
        if self._failure() is None and not self.parked:
            self.parked = True
            self._driver.park()

    def add_take(self, command) -> None:
        """A take (:class:`~.commands.TakeCommand`): answered now, or once its rounds are complete."""
        self.takes.append(command)
        self.finish_takes()

    def finish_takes(self) -> None:
        """Answer every waiting take whose rounds are complete (every one, with this rank's failure)."""
        failure = self._failure()
        waiting = []
        for command in self.takes:
            if failure is not None:
                command.handle.set_error(failure)
                continue
            results = self._driver.take(command.name)
            if results is None:
                waiting.append(command)
            else:
                command.handle.set_result(results)
        self.takes = waiting
