"""Named points in the code where a test may act: kill the process there
(``os._exit``), at a chosen count, with no timing involved.

The library calls :func:`point` at each; nothing happens unless a test
installed an action with :func:`at`. The points: ``round_launched`` (a
round's reduction started on this rank), ``round_completed``,
``post_submitted`` (the engine took a post), ``flush_submitted``,
``helper_started`` (a helper collective's data exchange started),
``registration_reported`` (a stream's first post went into its registration)
``recovery_shrunk`` (survivors agreed and shrank; a second failure here
is one during recovery), ``grow_stopped`` (a grow stopped the engine, before
``Spawn``) and ``grow_merged`` (a grow's ``Spawn`` and ``Merge`` are done,
before the handshake).

Example (a test's worker)::

    from hvd_partial import faults
    faults.at("round_launched", lambda count: count == 5 and os._exit(1))
"""

from __future__ import annotations

from typing import Callable

_actions: dict[str, Callable[[int], object]] = {}
_counts: dict[str, int] = {}


def at(name: str, action: Callable[[int], object]) -> None:
    """Call ``action(count)`` each time point ``name`` is reached (count from 1)."""
    _actions[name] = action
    _counts[name] = 0


def clear() -> None:
    _actions.clear()
    _counts.clear()


def point(name: str) -> None:
    """Point ``name`` is reached (a dictionary lookup when no test acts)."""
    if _actions:
        action = _actions.get(name)
        if action is not None:
            _counts[name] += 1
            action(_counts[name])
