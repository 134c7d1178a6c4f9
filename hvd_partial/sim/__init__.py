"""Event simulations that drive the real protocol core with a simulated clock."""

from .replay import ReplayResult, replay, sleeper_schedule

__all__ = ["ReplayResult", "replay", "sleeper_schedule"]
