"""The negotiation of helper collectives, run by the engine thread.

Horovod's coordinator matches every named request across ranks before data
moves. This does the same without a coordinator:

- A *cycle* is a nonblocking allgather, on the one helper communicator, of
  what each rank submitted since its previous cycle (its announcements), so
  after every cycle all ranks hold the same *view*: which rank submitted
  which name, with which signature.
- After each cycle every rank walks the view in the same order. A name that
  every rank still in play (not joined) has submitted is compared field by
  field: on a mismatch, each rank that submitted it gets the same
  :class:`~hvd_partial.errors.MismatchError`; otherwise its data collective
  starts, on the same communicator, in the same order everywhere. Joined
  ranks contribute zeros (allreduce, reducescatter) or nothing (allgather,
  alltoall).
- While names stay unmatched, cycles follow each other, paced (1 ms, 10 ms
  after 100 quiet cycles) when nothing changes. When nothing is pending
  anywhere, the ranks stop cycling; a rank with a new request then sends
  every peer a wake-up notice for the next cycle (and rings its doorbell).
- A name that some ranks never submit is reported after
  ``stall_warning_seconds`` (a warning naming the name and the missing
  ranks, by the lowest rank that submitted it); past
  ``stall_shutdown_seconds`` (if set) every rank fails with
  :class:`~hvd_partial.observe.stall.StalledRankError`.

The engine sees a small seam: :meth:`Negotiator.submit` (a request, on the
engine thread), :meth:`Negotiator.progress` (each engine step; True if it did
anything), :attr:`Negotiator.busy` (poll closely), :meth:`Negotiator.shutdown`
and :attr:`Negotiator.finished` (shutdown waits until every rank has left
the negotiation, so no peer's cycle is left without this rank). The engine
passes its set of awaited handles as ``pending``; a request's handle leaves
it when the request finishes.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from typing import Callable

import numpy as np

from .. import faults
from ..errors import (EngineError, HvdPartialError, MismatchError, NotSupportedError, PartialResultError,
                      ProcessSetError, RankFailedError)
from ..transport.protocol import Transport
from . import requests as kinds
from .requests import Request, differences

log = logging.getLogger("hvd_partial.collectives")

_PACE_SECONDS = 1e-3  # Horovod's default cycle time
_SLOW_PACE_SECONDS = 1e-2
_QUIET_BEFORE_SLOW = 100
_QUIET_BEFORE_NAPS = 3
_STALL_CHECK_SECONDS = 1.0
# Bytes per rank of a cycle's first allgather: most cycles' announcements fit.
_SLOT_BYTES = 512


# What Horovod refuses while some ranks have joined (it has no rows or root to take from them).
_NOT_WITH_JOIN = (kinds.ALLGATHER, kinds.ALLTOALL, kinds.BROADCAST, kinds.REDUCESCATTER)

# Elastic training: how many of the latest executions' results a rank keeps (a survivor whose
# execution failed gets the result from one where it completed; ranks are never further apart).
_KEPT_EXECUTIONS = 64


class _Entry:
    __slots__ = ("name", "kind", "set_id", "sigs", "infos", "first_seen", "warned")

    def __init__(self, name: str, kind: str, set_id: int = 0):
        self.name = name
        self.kind = kind
        self.set_id = set_id
        self.sigs: dict[int, tuple] = {}
        self.infos: dict[int, object] = {}
        self.first_seen = time.monotonic()
        self.warned = False


class Negotiator:
    """Negotiated helper collectives of one engine (see the module docstring)."""

    def __init__(self, transport: Transport, config, fail: Callable[[HvdPartialError], None] | None = None,
                 pending: set | None = None):
        self._transport = transport
        # The engine's set of handles that compute threads wait on: a finished
        # request's handle leaves it.
        self._pending = pending if pending is not None else set()
        self._config = config
        self._fail = fail
        self.rank = transport.rank
        self.size = transport.size
        self._channel = None
        self._new: deque[Request] = deque()  # submitted here, not yet announced
        self._mine: dict[tuple, Request] = {}  # announced by this rank, not finished, by (process set, name)
        self._view: dict[tuple, _Entry] = {}  # identical on every rank after each cycle, by (process set, name)
        # Process sets added (identical on every rank): id -> (ranks, this rank's channel on the set or None)
        self._sets: dict[int, tuple] = {}
        self._joined: dict[int, int] = {}  # rank -> cycle in which it joined
        self._left: set[int] = set()
        self._cycle = 0  # cycles completed
        self._wanted = 0  # the highest cycle a peer asked this rank to join
        self._steps = None  # the cycle in flight: (generator, MPI request)
        self._running: list = []  # data collectives in flight: (execution number, MPI requests, completion, request)
        self._active = False  # work is pending somewhere: the next cycle needs no wake-up
        self._quiet = 0
        self._next_cycle_at = 0.0
        self._leaving = False
        self._announced_leaving = False
        self._next_stall_check = time.monotonic() + _STALL_CHECK_SECONDS
        self.cycles = 0  # statistics, for tests and benchmarks
        self.executed = 0
        # Elastic training: the raw results of the latest executions completed here, by number,
        # so that after a failure a survivor hands them to those whose execution failed.
        self.kept: dict[int, object] | None = None

    # ===== the engine's seam ===================================================================

    def submit(self, request: Request) -> None:
        """Queue ``request`` (engine thread)."""
        if self._transport.helpers is None:
            self._finish_error(request, EngineError("this transport has no helper communicator"))
            return
        if request.kind == kinds.LOCAL:
            try:
                self._finish_value(request, request.finish(None))
            except Exception as err:  # noqa: BLE001 - handed to the caller
                self._finish_error(request, err)
            return
        if self._leaving:
            self._finish_error(request, EngineError(f"rank {self.rank}: {request.kind} {request.name!r} "
                                                    "submitted while shutting down"))
            return
        if request.process_set and self.rank not in self._sets.get(request.process_set, ((),))[0]:
            self._finish_error(request, ProcessSetError(
                f"rank {self.rank}: {request.kind} {request.name!r}: process set {request.process_set} is not "
                "registered on this rank's engine, or this rank is not in it (removed, or dropped when the world "
                "changed?)"))
            return
        self._new.append(request)

    def abandon(self, error: HvdPartialError) -> None:
        """The world changed under every helper collective in progress (elastic
        training): each fails with ``error``; this negotiator is done with."""
        for request in [*self._new, *self._mine.values(), *(item[3] for item in self._running if item[3] is not None)]:
            self._finish_error(request, error)
        self._new.clear()
        self._mine.clear()
        self._running = []
        self._steps = None
        for _, channel in self._sets.values():  # their communicators hold ranks of the old world
            if channel is not None:
                channel.abandon()
        self._sets.clear()

    @property
    def busy(self) -> bool:
        """True while the engine should poll closely (a cycle, a collective or
        a paced next cycle is due)."""
        # While names only wait for ranks that have not submitted them (computing,
        # say), the engine naps between paced cycles instead of polling closely.
        return bool(self._steps is not None or self._running or self._new
                    or (self._active and self._quiet < _QUIET_BEFORE_NAPS)
                    or (self._leaving and not self._announced_leaving))

    def shutdown(self) -> None:
        """This rank leaves: announce it, then keep answering cycles until all have left."""
        self._leaving = True

    @property
    def finished(self) -> bool:
        """After :meth:`shutdown`: every rank has left and nothing is in flight."""
        if self._channel is None:
            return not self._new
        return self._leaving and len(self._left) == self.size and not self.busy

    def progress(self) -> bool:
        """Move the negotiation and the collectives on; True if anything happened."""
        if self._channel is None:
            helpers = self._transport.helpers
            if helpers is None or self.size == 1 and not (self._new or self._leaving):
                return False
            from ..transport.helper_channel import HelperChannel  # MPI only where the transport has it

            self._channel = HelperChannel(helpers, self._transport.doorbell, self._transport.tag_base)
            self._channel.count_parts = self.kept is not None  # (elastic training)
        worked = self._complete_collectives()
        for cycle in self._channel.wakes():
            self._wanted = max(self._wanted, cycle)
            worked = True
        while True:
            if self._steps is not None:
                if not self._advance_cycle():
                    break
                worked = True
                continue
            if self._should_start():
                self._start_cycle()
                worked = True
                continue
            break
        now = time.monotonic()
        if now >= self._next_stall_check:
            self._next_stall_check = now + _STALL_CHECK_SECONDS
            self._inspect_stalls(now)
        return worked

    # ===== cycles ==================================================================================

    def _should_start(self) -> bool:
        if len(self._left) == self.size:
            return False
        news = bool(self._new) or (self._leaving and not self._announced_leaving)
        if self._active:
            return news or time.monotonic() >= self._next_cycle_at
        if self._wanted > self._cycle:
            return True
        if news:
            self._channel.wake(self._cycle + 1)
            return True
        return False

    def _start_cycle(self) -> None:
        announcements = []
        while self._new:
            request = self._new.popleft()
            self._mine[(request.process_set, request.name)] = request
            announcements.append(request.announcement())
        leaving = self._leaving and not self._announced_leaving
        self._announced_leaving |= leaving
        payload = pickle.dumps((announcements, leaving), protocol=pickle.HIGHEST_PROTOCOL) if announcements or leaving else b""
        generator = self._cycle_steps(np.frombuffer(payload, dtype=np.uint8).copy())
        self._steps = (generator, next(generator))

    def _cycle_steps(self, payload: np.ndarray):
        """One cycle: an allgather of fixed slots (a length, then the payload
        when it fits), and a second, variable one only when some payload did not fit."""
        channel = self._channel
        slot = np.zeros(_SLOT_BYTES, dtype=np.uint8)
        slot[:8].view(np.int64)[0] = payload.size
        inline = payload.size <= _SLOT_BYTES - 8
        if inline:
            slot[8:8 + payload.size] = payload
        slots = np.empty(self.size * _SLOT_BYTES, dtype=np.uint8)
        yield channel.allgather_bytes(slot, slots, [_SLOT_BYTES] * self.size)
        slots = slots.reshape(self.size, _SLOT_BYTES)
        counts = slots[:, :8].copy().view(np.int64).reshape(-1)
        spilled = counts > _SLOT_BYTES - 8
        gathered = offsets = None
        if spilled.any():
            sizes = np.where(spilled, counts, 0)
            gathered = np.empty(int(sizes.sum()), dtype=np.uint8)
            offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            yield channel.allgather_bytes(payload if not inline else payload[:0], gathered, sizes)
        tables = []
        for rank, n in enumerate(counts):
            n = int(n)
            if n == 0:
                tables.append(None)
            elif spilled[rank]:
                tables.append(pickle.loads(gathered[offsets[rank]:offsets[rank] + n].tobytes()))
            else:
                tables.append(pickle.loads(slots[rank, 8:8 + n].tobytes()))
        return tables

    def _advance_cycle(self) -> bool:
        generator, request = self._steps
        if not self._channel.done(request):
            return False
        try:
            self._steps = (generator, generator.send(None))
        except StopIteration as stop:
            self._steps = None
            self._cycle += 1
            self.cycles += 1
            self._after_cycle(stop.value)
        return True

    def _after_cycle(self, tables) -> None:
        """Apply one cycle's tables to the view, then act on it: the same on every rank."""
        news = False
        for rank, table in enumerate(tables):
            if table is None:
                continue
            announcements, leaving = table
            for set_id, name, kind, signature, info in announcements:
                entry = self._view.get((set_id, name))
                if entry is None:
                    entry = self._view[(set_id, name)] = _Entry(name, kind, set_id)
                entry.sigs[rank] = signature
                entry.infos[rank] = info
                if kind == kinds.JOIN:
                    self._joined[rank] = self._cycle
                news = True
            if leaving:
                self._left.add(rank)
                news = True
        executed = self._act()
        self._active = bool(self._view) and len(self._left) < self.size
        if executed or news:
            self._quiet = 0
        else:
            self._quiet += 1
        pace = _PACE_SECONDS if self._quiet < _QUIET_BEFORE_SLOW else _SLOW_PACE_SECONDS
        self._next_cycle_at = time.monotonic() + (0.0 if executed or news else pace)

    def _members(self, entry: _Entry):
        """The ranks ``entry`` runs among (every rank for the global set and set changes)."""
        if entry.set_id == 0:
            return range(self.size)
        members = self._sets.get(entry.set_id)
        return members[0] if members is not None else ()

    def _in_play(self, entry: _Entry) -> list[int]:
        """The ranks that must submit ``entry``: its members that have not joined
        (a process set change needs every rank: each makes the set's communicator)."""
        if entry.kind == kinds.PROCESS_SET:
            return list(range(self.size))
        return [r for r in self._members(entry) if r not in self._joined]

    def _act(self) -> bool:
        acted = False
        for key, entry in list(self._view.items()):
            if entry.kind == kinds.JOIN:
                continue
            name = entry.name
            if entry.set_id and entry.set_id not in self._sets:  # the set was removed under it
                del self._view[key]
                acted = True
                self._fail_local(key, ProcessSetError(
                    f"rank {self.rank}: {entry.kind} {name!r}: process set {entry.set_id} was removed before "
                    f"ranks {[r for r in range(self.size) if r not in entry.sigs]} submitted it"))
                continue
            missing = [r for r in self._in_play(entry) if r not in entry.sigs]
            if missing:
                gone = [r for r in missing if r in self._left]
                if gone:
                    del self._view[key]
                    acted = True
                    self._fail_local(key, RankFailedError(gone[0], f"it shut down without submitting "
                                                                   f"{entry.kind} {name!r}"))
                continue
            del self._view[key]
            acted = True
            problem = differences(name, entry.kind, entry.sigs)
            if problem is not None:
                self._fail_local(key, MismatchError(problem))
                continue
            joined = sorted(r for r in self._joined if r in self._members(entry))
            if joined and entry.kind in _NOT_WITH_JOIN:
                self._fail_local(key, NotSupportedError(
                    f"{entry.kind} {name!r}: ranks {joined} have joined; as in Horovod, only "
                    "allreduce, grouped allreduce and barrier run while some ranks have joined"))
                continue
            if entry.kind == kinds.PROCESS_SET:
                self._change_sets(key, entry)
                continue
            self._execute(key, entry)
        if self._joined and len(set(self._joined) | self._left) == self.size:
            last_cycle = max(self._joined.values())
            last = max(r for r, c in self._joined.items() if c == last_cycle)
            for key, entry in list(self._view.items()):
                if entry.kind == kinds.JOIN:
                    del self._view[key]
                    request = self._mine.pop(key, None)
                    if request is not None:
                        self._finish_value(request, last)
            self._joined.clear()
            acted = True
        return acted

    # ===== data ======================================================================================

    def _execute(self, key: tuple, entry: _Entry) -> None:
        from .execute import start  # the collectives proper

        request = self._mine.pop(key, None)
        channel, rank, size = self._channel, self.rank, self.size
        if entry.set_id:
            members, channel = self._sets[entry.set_id]
            if channel is None:  # not a member: the number is taken all the same (elastic recovery matches them)
                self.executed += 1
                return
            entry, rank, size = _on_set(entry, members), members.index(self.rank), len(members)
        try:
            requests, complete = start(channel, entry, request, rank, size)
        except HvdPartialError as err:
            if request is not None:
                self._finish_error(request, err)
            return
        self._running.append((self.executed, requests, complete, request))
        self.executed += 1
        faults.point("helper_started")

    def _change_sets(self, key: tuple, entry: _Entry) -> None:
        """Add or remove a process set, at the same point on every rank (a split of the
        helper communicator, or the set's communicator freed)."""
        # (taken only once done: a failure in the split, elastic training, leaves it for abandon())
        request = self._mine.get(key)
        fields = dict(entry.sigs[min(entry.sigs)])
        if fields["action"] == kinds.ADD:
            ranks = tuple(fields["ranks"])
            clash = [i for i, (members, _) in self._sets.items() if tuple(members) == ranks]
            if clash or len(ranks) == self.size:
                what = f"process set {clash[0]}" if clash else "the global process set"
                self._fail_local(key, ProcessSetError(f"rank {self.rank}: add_process_set({list(ranks)}): a duplicate "
                                                      f"of {what}, which has the same ranks"))
                return
            set_id = next(i for i in range(1, len(self._sets) + 2) if i not in self._sets)
            comm = self._channel.split(self.rank in ranks)
            channel = None if comm is None else self._channel.on(comm)
            self._sets[set_id] = (list(ranks), channel)
            value = (set_id, None if channel is None else channel.engine_comm)
        else:
            removed = self._sets.pop(fields["process_set_id"][0], None)
            if removed is not None and removed[1] is not None:
                removed[1].free()
            value = removed is not None
        if request is not None:
            del self._mine[key]
            self._finish_value(request, value)

    def free_sets(self) -> None:
        """Free every process set's communicator (after a clean stop: every rank frees them in id order)."""
        for set_id in sorted(self._sets):
            channel = self._sets.pop(set_id)[1]
            if channel is not None:
                channel.free()

    def _complete_collectives(self) -> bool:
        if not self._running:
            return False
        still, worked = [], False
        for item in self._running:
            number, requests, complete, request = item
            if requests and not self._channel.done(requests):
                still.append(item)
                continue
            worked = True
            self._deliver(number, complete, request)
        self._running = still
        return worked

    def _deliver(self, number: int, complete, request) -> None:
        """Execution ``number`` completed here: hand its value to the caller, if any."""
        try:
            raw = complete()
        except PartialResultError:
            raise  # not completed here: the survivors' recovery decides
        except HvdPartialError as err:
            if request is not None:
                self._finish_error(request, err)
            return
        if self.kept is not None:
            self.kept[number] = raw
            for old in [n for n in self.kept if n < number - _KEPT_EXECUTIONS]:
                del self.kept[old]
        if request is None:
            return  # a joined rank's share: nothing to hand back
        try:
            value = request.finish(raw) if request.finish is not None else raw
        except HvdPartialError as err:
            self._finish_error(request, err)
            return
        self._finish_value(request, value)

    # ===== elastic training: the outcome of executions in flight at a failure ======================

    def complete_finished(self, is_failure) -> None:
        """Complete every execution whose collectives finished here before the failure."""
        if self._channel is None:
            return
        still = []
        for item in self._running:
            try:
                finished = not item[1] or self._channel.done(item[1])
            except Exception as err:  # noqa: BLE001 - MPI's error types stay in the transport
                if not is_failure(err):
                    raise
                finished = False
            if finished:
                try:
                    self._deliver(item[0], item[2], item[3])
                    continue
                except PartialResultError:
                    pass
            still.append(item)
        self._running = still

    def recovery_report(self) -> tuple[list, list]:
        """(executions completed here and kept, executions still in flight here)."""
        return sorted(self.kept or ()), [item[0] for item in self._running]

    def kept_result(self, number: int):
        return self.kept[number]

    def finish_from_peer(self, number: int, raw) -> None:
        """Execution ``number``, in flight here, completed at another survivor with ``raw``."""
        for item in self._running:
            if item[0] == number:
                self._running.remove(item)
                self._deliver(number, lambda: raw, item[3])
                return

    # ===== outcomes ==================================================================================

    def _fail_local(self, key: tuple, error: HvdPartialError) -> None:
        request = self._mine.pop(key, None)
        if request is not None:
            self._finish_error(request, error)

    def _finish_value(self, request: Request, value) -> None:
        if request.release is not None:
            request.release()
        self._pending.discard(request.handle)
        request.handle.set_result(value)

    def _finish_error(self, request: Request, error: BaseException) -> None:
        if request.release is not None:
            request.release()
        self._pending.discard(request.handle)
        request.handle.set_error(error)

    # ===== stall inspection ===========================================================================

    def _inspect_stalls(self, now: float) -> None:
        warn_after = self._config.stall_warning_seconds
        stop_after = self._config.stall_shutdown_seconds
        if warn_after <= 0 and stop_after <= 0:
            return
        for entry in self._view.values():
            if entry.kind == kinds.JOIN:
                continue
            missing = [r for r in self._in_play(entry) if r not in entry.sigs]
            if not missing:
                continue
            age = now - entry.first_seen
            if warn_after > 0 and age >= warn_after and not entry.warned:
                entry.warned = True
                if self.rank == min(entry.sigs):
                    log.warning("%s %r was submitted by ranks %s %.0f s ago, but ranks %s have not submitted it "
                                "(stalled: a rank skipped this collective, named it differently, or waits in "
                                "another blocking call such as a sync stream's post; a partial stream's post "
                                "is never held back by a rank waiting here)",
                                entry.kind, entry.name, sorted(entry.sigs), age, missing)
            if stop_after > 0 and age >= stop_after and self._fail is not None:
                from ..observe.stall import StalledRankError

                self._fail(StalledRankError(missing[0], f"{entry.kind} {entry.name!r} waited {age:.0f} s for "
                                                        f"ranks {missing} (stall_shutdown_seconds={stop_after:g})"))
                return


def _on_set(entry: _Entry, members: list[int]) -> _Entry:
    """``entry`` numbered by rank in the set (``members``, global ranks in order):
    what the collective on the set's communicator reads (a broadcast's root too)."""
    index = {r: i for i, r in enumerate(members)}
    local = _Entry(entry.name, entry.kind, entry.set_id)
    for r, signature in entry.sigs.items():
        local.sigs[index[r]] = tuple((k, index.get(v, v) if k == "root" else v) for k, v in signature)
    for r, info in entry.infos.items():
        local.infos[index[r]] = info
    return local
