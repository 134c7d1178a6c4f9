"""The framework-neutral protocol core: pure Python and numpy, no MPI."""

from .control import CentralControl
from .coordinator import Coordinator
from .driver import Driver, DriverHost
from .fusion import Layout, check_array
from .rank_stream import Launch, RankStream, Waiter
from .round_result import RoundResult

__all__ = ["CentralControl", "Coordinator", "Driver", "DriverHost",
           "Layout", "check_array", "Launch", "RankStream", "Waiter", "RoundResult"]
