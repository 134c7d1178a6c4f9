"""Message dispatch: every message this rank receives goes to the part of
the engine that handles its tag; the protocol driver's messages go out, to a
peer over the transport or to this rank itself.

A rank's messages to itself never touch MPI: reports to its own control
policy are handed over first, then the decisions it sent itself, each in
order (as the loopback world and the simulator model it).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from ..transport.protocol import Transport
from ..transport.tags import TAG_PROTOCOL

log = logging.getLogger("hvd_partial.engine")


class Dispatch:
    """Routes messages by tag. ``handlers`` maps a tag to ``handler(source,
    message)``; ``heard(source)`` is told of every message from a peer."""

    def __init__(self, transport: Transport, rank: int, driver, handlers: dict, heard: Callable[[int], None]):
        self.transport = transport
        self.rank = rank
        self.driver = driver
        self._handlers = {TAG_PROTOCOL: driver.on_message, **handlers}
        self._heard = heard
        self._own_reports: deque = deque()  # to this rank's control policy
        self._own_decisions: deque = deque()  # from it (or another policy) to this rank

    def send(self, dest: int, message) -> None:
        """Send a driver's message to ``dest``."""
        if dest != self.rank:
            self.transport.send(dest, TAG_PROTOCOL, message)
        elif self.driver.for_control(message):
            self._own_reports.append(message)
        else:
            self._own_decisions.append(message)

    def rebase(self, rank: int) -> None:
        """The world shrank: this rank is ``rank`` now. Reports to its own control
        policy are dropped (gathers begin again); its decisions to itself stay."""
        self.rank = rank
        self._own_reports.clear()

    def deliver_own(self) -> None:
        """Hand the driver the decisions this rank sent itself (no receive)."""
        while self._own_decisions:
            self.driver.on_message(self.rank, self._own_decisions.popleft())

    def deliver(self, rung: bool) -> bool:
        """Handle every message that has arrived; True if there was any.
        ``rung``: a peer rang this rank's doorbell."""
        worked = False
        handlers = self._handlers
        for source, tag, message in self.transport.receive(rung):
            self._heard(source)
            handler = handlers.get(tag)
            if handler is None:
                log.warning("rank %d: ignoring a message with unknown tag %d from rank %d", self.rank, tag, source)
            else:
                handler(source, message)
            worked = True
        on_message = self.driver.on_message
        while self._own_reports:
            on_message(self.rank, self._own_reports.popleft())
            worked = True
        while self._own_decisions:
            on_message(self.rank, self._own_decisions.popleft())
            worked = True
        return worked
