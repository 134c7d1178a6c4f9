"""Message tags of the control communicator (no MPI import: the engine and
the loopback world name them too)."""

TAG_TO_COORDINATOR = 11
TAG_FROM_COORDINATOR = 12
TAG_HEARTBEAT = 13
TAG_FAILURE = 14
# Messages an idle engine must act on at once: its doorbell is rung after them.
URGENT_TAGS = frozenset({TAG_TO_COORDINATOR, TAG_FROM_COORDINATOR, TAG_FAILURE})
