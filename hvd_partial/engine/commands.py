"""Command intake: what compute threads ask of the engine thread.

A compute thread appends a command and pokes the engine; the engine thread
takes every queued command at the start of each step. Each command carries
the :class:`~hvd_partial.engine.handle.Handle` its caller waits on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from ..core.post_request import PostRequest
from .handle import Handle


@dataclass(slots=True)
class PostCommand:
    """Post ``request`` (built once by the API, handed to the driver as it is)."""

    request: PostRequest
    handle: Handle

    def describe(self) -> str:
        return f"post {self.request.name!r}"


@dataclass
class FlushCommand:
    name: str
    handle: Handle

    def describe(self) -> str:
        return f"flush {self.name!r}"


@dataclass
class HelperCommand:
    request: Any  # a hvd_partial.collectives request, for the negotiator
    handle: Handle

    def describe(self) -> str:
        return self.handle.name


@dataclass
class TakeCommand:
    """Take a stream's completed rounds without posting."""

    name: str
    handle: Handle

    def describe(self) -> str:
        return f"take {self.name!r}"


@dataclass
class ParkCommand:
    """A compute thread begins (``+1``) or ends (``-1``) waiting in a call that needs every rank."""

    delta: int


@dataclass
class ShutdownCommand:
    handle: Handle

    def describe(self) -> str:
        return "shutdown"


@dataclass
class AbortCommand:
    reason: str
    handle: Handle

    def describe(self) -> str:
        return "abort"


class CommandIntake:
    """The queue between compute threads and the engine thread. ``poke`` is
    called after every append: it wakes the engine thread if it sleeps."""

    def __init__(self):
        self.queue: deque = deque()  # the engine thread tests and pops it directly
        self.poke: Callable[[], None] = lambda: None

    def submit(self, command) -> None:
        self.queue.append(command)
        self.poke()
