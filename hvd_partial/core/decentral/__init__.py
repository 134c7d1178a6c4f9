"""The peer-to-peer control plane: pure per-rank state machines.

- :class:`DecentralStream`: when each round of a solo or majority stream
  starts, decided by the ranks themselves (activation flood, staleness and
  flush gathers, a quorum counter), with facts reduced inside every round.
- :class:`Agreements`: registration, sync flush rounds and shutdown, as
  gathers to rank 0 and floods of the outcome.

Liveness (ring heartbeats and a failure flood) is :mod:`hvd_partial.core.liveness`,
which the engine and the simulator both run.

See docs/control-plane.md for the design and its proofs.
"""

from .agreement import AgreementOutcome, AgreementReport, Agreements
from .facts import RoundView
from .gather import Gather
from .messages import Activate, Complete, Defer, Gathered, Join, QuorumMet, ReleaseActivation, Send
from .quorum import QUORUM_SLOTS, QuorumCounters, SharedQuorumCounters, quorum_met
from .stream import DecentralStream

__all__ = ["DecentralStream", "Agreements", "AgreementReport", "AgreementOutcome", "RoundView", "Gather",
           "QUORUM_SLOTS", "QuorumCounters", "SharedQuorumCounters", "quorum_met", "Activate", "Complete", "Defer",
           "Gathered", "Join", "QuorumMet", "ReleaseActivation", "Send"]
