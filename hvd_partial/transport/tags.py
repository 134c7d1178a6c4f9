"""Message tags of the control communicator (no MPI import: the engine and
the loopback world name them too)."""

TAG_PROTOCOL = 11  # every message between two ranks' protocol drivers
TAG_HEARTBEAT = 13
TAG_FAILURE = 14
# Messages an idle engine must act on at once: its doorbell is rung after them.
URGENT_TAGS = frozenset({TAG_PROTOCOL, TAG_FAILURE})
