"""Event simulations that drive the real protocol core with a simulated clock.

- :func:`replay`: free communication, the yardstick of the benchmarks;
- :func:`simulate`: communication priced by a :class:`NetworkModel`, for
  projections to cluster scale.
"""

from .cluster import SimResult, simulate
from .network import NetworkModel
from .replay import ReplayResult, replay, sleeper_schedule
from .schedules import persistent_straggler, random_delays

__all__ = ["ReplayResult", "replay", "sleeper_schedule", "SimResult", "simulate", "NetworkModel",
           "random_delays", "persistent_straggler"]
