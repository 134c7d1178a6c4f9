"""The timer of held-back floods (the activation delay).

In balanced training a round that a rank starts on its own is not announced
at once: its flood (with a quorum, its counter additions too) is held back
for ``activation_delay_us``, so that a round every rank joins meanwhile needs
no flood at all (docs/design.md, the protocol table's `Activate` row). The driver asks the
engine to time one (``DriverHost.defer_activation``); this part keeps the
deadlines and, when one passes, calls the driver to release the flood.

Example::

    floods = HeldFloods(delay, driver.holds_flood, driver.release_flood, reductions.everyone_joined)
    floods.hold(stream_id, round_number)   # the driver held a flood back
    if floods.deadline is not None and floods.deadline <= time.perf_counter():
        worked |= floods.release_due()      # an engine step
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable


class HeldFloods:
    """Deadlines of the floods this rank holds back, oldest first.

    ``holds(stream id, round)``: the driver still holds that flood (the round
    may have completed meanwhile, and then there is nothing to time);
    ``release(stream id, round, everyone_joined)``: its delay passed;
    ``everyone_joined(stream id, round)``: this rank knows that every rank
    joined the round (its facts are reduced), so the flood is dropped, not sent.
    """

    def __init__(self, delay: float, holds: Callable[[int, int], bool],
                 release: Callable[[int, int, bool], None], everyone_joined: Callable[[int, int], bool]):
        self.delay = delay
        self._holds = holds
        self._release = release
        self._everyone_joined = everyone_joined
        # (deadline, stream id, round), oldest first; the engine reads the oldest deadline each step
        self.held: deque[tuple[float, int, int]] = deque()

    def hold(self, stream_id: int, round_number: int) -> None:
        """Time the flood of ``round_number`` of stream ``stream_id``, held back from now."""
        self.held.append((time.perf_counter() + self.delay, stream_id, round_number))

    @property
    def deadline(self) -> float | None:
        """When the oldest held flood's delay ends (``time.perf_counter()``), or None."""
        return self.held[0][0] if self.held else None

    def release_due(self) -> bool:
        """Release every flood whose delay passed; True if any was released.
        Floods the driver dropped already leave the timer and count as no work,
        so that the engine does not stay awake for them."""
        held = self.held
        now = time.perf_counter()
        released = False
        while held:
            deadline, sid, round_number = held[0]
            if not self._holds(sid, round_number):
                held.popleft()  # dropped already (the round completed): nothing to time
                continue
            if deadline > now:
                break
            held.popleft()
            self._release(sid, round_number, self._everyone_joined(sid, round_number))
            released = True
        return released
