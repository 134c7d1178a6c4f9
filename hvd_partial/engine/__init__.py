"""The background engine thread and its handles."""

from .engine import Engine
from .handle import Handle

__all__ = ["Engine", "Handle"]
