"""The framework-neutral protocol core: pure Python and numpy, no MPI."""

from .control import ControlPolicy, DecentralControl
from .driver import Driver, DriverHost
from .fusion import Layout, check_array
from .rank_stream import Launch, RankStream, Waiter
from .round_result import RoundResult

__all__ = ["ControlPolicy", "DecentralControl", "Driver", "DriverHost",
           "Layout", "check_array", "Launch", "RankStream", "Waiter", "RoundResult"]
