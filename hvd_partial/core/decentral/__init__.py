"""The control plane without a coordinator: pure per-rank state machines.

- :class:`DecentralStream`: when each round of a solo or majority stream
  starts, decided by the ranks themselves (activation flood, staleness and
  flush gathers, a quorum counter), with facts reduced inside every round.
- :class:`Agreements`: registration, sync flush rounds and shutdown, as
  gathers to rank 0 and floods of the outcome.
- :class:`RingLiveness`: ring heartbeats and a failure flood, O(1) messages
  per rank per period.

See docs/control-plane.md for the design and its proofs.
"""

from .agreement import AgreementOutcome, AgreementReport, Agreements
from .facts import RoundView
from .gather import Gather
from .liveness import RingLiveness
from .messages import (Activate, Complete, Defer, Failed, Gathered, Heartbeat, Join, PeerFailed, QuorumMet, Rejected,
                       ReleaseActivation, Send)
from .quorum import QUORUM_SLOTS, QuorumCounters, SharedQuorumCounters, quorum_met
from .stream import DecentralStream

__all__ = ["DecentralStream", "Agreements", "AgreementReport", "AgreementOutcome", "RingLiveness", "RoundView", "Gather",
           "QUORUM_SLOTS", "QuorumCounters", "SharedQuorumCounters", "quorum_met", "Activate", "Complete", "Defer", "Failed",
           "Gathered", "Heartbeat", "Join", "PeerFailed", "QuorumMet", "Rejected", "ReleaseActivation", "Send"]
