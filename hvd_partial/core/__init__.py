"""The framework-neutral protocol core: pure Python and numpy, no MPI."""

from .coordinator import Coordinator
from .fusion import Layout, check_array
from .rank_stream import Launch, RankStream, Waiter
from .round_result import RoundResult

__all__ = ["Coordinator", "Layout", "check_array", "Launch", "RankStream", "Waiter", "RoundResult"]
