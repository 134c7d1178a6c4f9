"""Surviving a dead rank with MPI's fault tolerance (ULFM): find out whether
the MPI in use has it, tell a process failure from other MPI errors, agree on
who failed and shrink a communicator to the survivors, and grow one again with
spawned processes.

The engine's recovery (:mod:`hvd_partial.engine.recovery`) and growth
(:mod:`hvd_partial.engine.growth`) call these. Every function is a plain
blocking MPI call sequence, made on the calling thread; no threads, no engine.

Only Open MPI 5 provides this, and only when the job is launched with
``mpirun --with-ft ulfm --mca btl tcp,self`` (see :func:`ulfm_support`).
Every communicator used with these functions must have the
``MPI.ERRORS_RETURN`` error handler (mpi4py then raises ``MPI.Exception``);
every communicator they return has it. One-sided windows do not survive a
failure: recreate them on the shrunk communicator.

Typical use by every survivor::

    try:
        comm.Allreduce(send, recv)
    except MPI.Exception as err:
        if not is_process_failure(err):
            raise
        shrunk = agree_and_shrink(comm)     # every survivor, same result
        comm = shrunk.comm                  # shrunk.failed: the dead ranks
        comm = grow(comm, [sys.executable, "worker.py"], len(shrunk.failed))

and in ``worker.py``: ``comm = join_parent()``.

Steps of :func:`agree_and_shrink` are logged at DEBUG level on the
``hvd_partial.ulfm`` logger, each record with an ``ulfm_step`` attribute
(``revoke``, ``agree``, ``shrink``, ``confirm``, ``stable``) so that a
handler can act at a named point.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mpi4py import MPI

from ..errors import ConfigError, RecoveryError, UlfmUnavailableError

log = logging.getLogger("hvd_partial.ulfm")

LAUNCH = "mpirun --with-ft ulfm --mca btl tcp,self"

# The error classes of a process failure. An mpi4py built for an MPI without
# ULFM defines these names as MPI.ERR_UNKNOWN (MPICH's build does): such an
# alias is no failure class, or every unknown error would count as one.
_FAILURE_CLASSES = frozenset(
    c for c in (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED) if c != MPI.ERR_UNKNOWN)

# Bits of alive-mask agreed per MPI_Comm_agree call (a C int, kept non-negative).
_MASK_BITS = 31


def is_process_failure(exc: BaseException) -> bool:
    """True for an ``MPI.Exception`` of class ``ERR_PROC_FAILED``,
    ``ERR_PROC_FAILED_PENDING`` or ``ERR_REVOKED``: a peer died, or another
    survivor revoked the communicator after seeing one die. Always false
    where mpi4py has no ULFM error classes (MPICH)."""
    return isinstance(exc, MPI.Exception) and exc.Get_error_class() in _FAILURE_CLASSES


# ----- detection ------------------------------------------------------------------------

def ulfm_support(comm) -> str | None:
    """``None`` when a dead rank of ``comm`` can be survived with this
    module, else one line saying why not and how to fix it. Local: it makes
    no call on ``comm`` (a revoke on a duplicate of it can reach a rank still
    creating that duplicate, which crashes Open MPI 5.0), so ranks may call
    it at different times.

    What was found by calling, not by looking for names (mpi4py has the
    method names everywhere):

    - MPICH's mpi4py build: ``Agree``, ``Shrink``, ``Get_failed`` and
      ``Ack_failed`` answer (mpi4py falls back on ordinary collectives that
      know nothing of failures) but ``Revoke`` raises ``NotImplementedError``;
      the failure error classes are aliases of ``ERR_UNKNOWN``. Probed by
      revoking a duplicate of ``MPI.COMM_SELF``.
    - Open MPI 5 launched without ``--with-ft ulfm``: every call, ``Revoke``
      included, behaves exactly as with it, but a dead rank makes the
      launcher end the job. Told apart by the MCA variable ``mpi_ft_enable``
      (read through MPI_T; ``--with-ft ulfm`` sets it to 1, and exports
      ``OMPI_MCA_mpi_ft_enable=1``, which is the fallback where MPI_T cannot
      be read).
    - Open MPI with ``--with-ft ulfm`` but the shared-memory transport
      (``btl`` unset, or naming ``sm``/``vader``): a killed rank leaves its
      peers on the same host hanging. Told apart by the MCA variable ``btl``;
      ``--mca btl tcp,self`` is the fix. (On a job with one rank per host
      this is over-cautious.)
    - ``comm`` without the ``MPI.ERRORS_RETURN`` error handler: a failure
      would abort the process instead of raising.

    Not told: Open MPI 5.0's launcher ends the whole job once half of its
    processes or more have died, ULFM or not.
    """
    library = _library()
    probe = MPI.COMM_SELF.Dup()
    try:
        probe.Set_errhandler(MPI.ERRORS_RETURN)
        try:
            probe.Revoke()
        except NotImplementedError:
            return f"{library} has no fault tolerance (MPI_Comm_revoke is not implemented): use Open MPI 5 " \
                   f"launched with `{LAUNCH}`"
    finally:
        _free(probe)
    if not _FAILURE_CLASSES:
        return f"mpi4py was built without the ULFM error classes for {library}: use Open MPI 5 with `{LAUNCH}`"
    if "Open MPI" in library:
        enabled = _mca_int("mpi_ft_enable")
        if enabled is None:
            enabled = _env_int("OMPI_MCA_mpi_ft_enable")
        if not enabled:
            return f"{library} was launched without `--with-ft ulfm` (MCA mpi_ft_enable is " \
                   f"{'unknown' if enabled is None else enabled}): a dead rank ends the job; launch with `{LAUNCH}`"
        btl = _mca_str("btl")
        if btl is None:
            btl = os.environ.get("OMPI_MCA_btl", "")
        if _uses_shared_memory(btl):
            return f"{library} uses the shared-memory transport (MCA btl {btl or 'unset: all'}), where a killed " \
                   f"rank leaves its peers hanging: add `--mca btl tcp,self` (launch with `{LAUNCH}`)"
    if comm.Get_errhandler() != MPI.ERRORS_RETURN:
        return "the communicator's error handler is not MPI.ERRORS_RETURN (a failure would abort the process): " \
               "call comm.Set_errhandler(MPI.ERRORS_RETURN)"
    return None


def _library() -> str:
    """The MPI library's name and version ("MPICH 5.0.2", "Open MPI v5.0.11")."""
    first = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    return " ".join(first.replace("Version:", "").split())


def _uses_shared_memory(btl: str) -> bool:
    names = [n.strip() for n in btl.lstrip("^").split(",") if n.strip()]
    if btl.startswith("^"):
        return not {"sm", "vader"} & set(names)
    return not names or bool({"sm", "vader"} & set(names))


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _libmpi():
    """The loaded MPI library, for MPI_T (which mpi4py does not wrap)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "/libmpi.so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _mca_bytes(name: str) -> bytes | None:
    """The raw value of the MPI_T control variable ``name``, or None where it cannot be read."""
    lib = _libmpi()
    if lib is None:
        return None
    try:
        provided = ctypes.c_int()
        # Ask for the level MPI already gave: Open MPI 5 sets its process-wide thread level (MPI_Query_thread
        # and its own locking) from this call, and 0 (MPI_THREAD_SINGLE) would take MULTIPLE away.
        if lib.MPI_T_init_thread(MPI.Query_thread(), ctypes.byref(provided)) != 0:
            return None
    except AttributeError:
        return None
    try:
        index = ctypes.c_int()
        if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) != 0:
            return None
        handle, count = ctypes.c_void_p(), ctypes.c_int()
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return None
        try:
            buf = ctypes.create_string_buffer(max(count.value, 1) * 8 + 8)
            if lib.MPI_T_cvar_read(handle, buf) != 0:
                return None
            return buf.raw
        finally:
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
    finally:
        lib.MPI_T_finalize()


def _mca_int(name: str) -> int | None:
    raw = _mca_bytes(name)
    return None if raw is None else int.from_bytes(raw[:4], sys.byteorder, signed=True)


def _mca_str(name: str) -> str | None:
    raw = _mca_bytes(name)
    return None if raw is None else raw.split(b"\0", 1)[0].decode(errors="replace")


# ----- agree and shrink -----------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Shrunk:
    """What :func:`agree_and_shrink` returns, the same on every survivor.

    ``comm``: the survivors' communicator (``ERRORS_RETURN`` set), ranks in
    their old order; ``failed``: the ranks of the old communicator that are
    not in it, sorted; ``ranks``: old rank -> new rank, survivors only;
    ``rounds``: revoke/agree/shrink rounds it took (more than 1 when another
    rank failed during the call)."""

    comm: MPI.Intracomm
    failed: tuple[int, ...]
    ranks: Mapping[int, int]
    rounds: int = 1

    def new_rank(self, old_rank: int) -> int | None:
        """The rank in ``comm`` of the old communicator's ``old_rank`` (None if it failed)."""
        return self.ranks.get(old_rank)


def _step(name: str, text: str, *args) -> None:
    log.debug("ulfm %s: " + text, name, *args, extra={"ulfm_step": name})


def _free(comm) -> None:
    try:
        comm.Free()
    except MPI.Exception as err:  # a revoked or broken communicator: nothing left to release
        log.debug("freeing a communicator failed: %s", err)


def _revoke(comm) -> None:
    try:
        if not comm.Is_revoked():
            comm.Revoke()
    except NotImplementedError as err:
        raise UlfmUnavailableError(f"{_library()} has no fault tolerance (MPI_Comm_revoke is not implemented): "
                                   f"use Open MPI 5 launched with `{LAUNCH}`") from err


def _ranks_in(group, ranks, other) -> list[int]:
    """``ranks`` of ``group`` as ranks of ``other`` (MPI.UNDEFINED where absent)."""
    return list(MPI.Group.Translate_ranks(group, list(ranks), other)) if ranks else []


def failed_ranks(comm) -> list[int]:
    """The ranks of ``comm`` (of its remote group, for an intercommunicator) this process
    knows have failed (local: no communication; acknowledges nothing), sorted."""
    failed = comm.Get_failed()
    group = comm.Get_remote_group() if comm.Is_inter() else comm.Get_group()
    try:
        return sorted(r for r in _ranks_in(failed, range(failed.Get_size()), group) if r != MPI.UNDEFINED)
    finally:
        failed.Free()
        group.Free()


def _acknowledged(comm) -> frozenset[int]:
    """Acknowledge every failure of ``comm`` this process knows of; the ranks acknowledged."""
    count = comm.Ack_failed()
    failed = comm.Get_failed()
    group = comm.Get_group()
    try:
        known = min(count, failed.Get_size())
        return frozenset(r for r in _ranks_in(failed, range(known), group) if r != MPI.UNDEFINED)
    finally:
        failed.Free()
        group.Free()


def _agreed_union(comm, known: frozenset[int]) -> frozenset[int]:
    """The union of every survivor's ``known``: Agree ANDs alive-masks, 31 ranks a call."""
    size = comm.Get_size()
    union = set()
    for start in range(0, size, _MASK_BITS):
        stop = min(start + _MASK_BITS, size)
        mask = sum(1 << (r - start) for r in range(start, stop) if r not in known)
        alive = comm.Agree(mask)
        union.update(r for r in range(start, stop) if not (alive >> (r - start)) & 1)
    return frozenset(union)


def _agree_on_failed(comm, round_no: int) -> frozenset[int]:
    """Survivors of ``comm`` agree on the ranks that failed.

    Each survivor acknowledges the failures it knows of and proposes them;
    the agreed set is the union of the proposals. Then each acknowledges again
    and they agree on a flag, "what I now acknowledge is exactly the agreed
    set"; where it does not hold for everyone (a failure seen by some only, or
    a new one) they repeat. An agreement that raises a process failure does
    so on every survivor (and makes each acknowledge every rank that did not
    take part), so all repeat it together."""
    agreed = frozenset()
    for attempt in range(1, 2 * comm.Get_size() + 8):
        known = _acknowledged(comm)
        _step("agree", "round %d attempt %d, proposing %s", round_no, attempt, sorted(known))
        try:
            agreed = _agreed_union(comm, known)
            settled = comm.Agree(int(_acknowledged(comm) == agreed))
        except MPI.Exception as err:
            if not is_process_failure(err):
                raise
            log.debug("ulfm agreement interrupted by a failure (%s); again", err.Get_error_string())
            continue
        if settled:
            return agreed
    log.warning("ulfm: survivors' views of the failed ranks did not settle; going on with %s", sorted(agreed))
    return agreed


def agree_and_shrink(comm) -> Shrunk:
    """Revoke ``comm``, agree with every other survivor on who failed, and
    shrink it to the survivors. Called by every survivor, after any of them
    saw a process failure (:func:`is_process_failure`) on ``comm``.

    Each round: revoke (so that survivors still blocked in a call on it get
    ``ERR_REVOKED`` and come here too), agree on the failed set
    (:func:`_agree_on_failed`), ``Shrink``, then agree on the new
    communicator that it lacks exactly the agreed ranks. That last agreement
    fails (on every survivor alike) when a member of the new communicator
    died since, and is false when a rank died between agreement and shrink:
    then another round runs on the new communicator. The result is the same
    on every survivor; ``comm`` itself is left revoked (free it when done).

    Raises :class:`UlfmUnavailableError` where MPI has no ULFM and
    :class:`RecoveryError` on an MPI error that is no process failure.
    """
    old_group = comm.Get_group()
    current = comm
    try:
        for round_no in itertools.count(1):
            if round_no > comm.Get_size() + 2:
                raise RecoveryError(f"agree_and_shrink: no stable communicator after {round_no - 1} rounds")
            shrunk, stable = _shrink_round(current, round_no)
            if current is not comm:
                _free(current)
            current = shrunk
            if stable:
                break
        new_group = current.Get_group()
        try:
            size = comm.Get_size()
            new = _ranks_in(old_group, range(size), new_group)
        finally:
            new_group.Free()
    except MPI.Exception as err:
        if current is not comm:
            _free(current)
        raise RecoveryError(f"agree_and_shrink: {err.Get_error_string()}") from err
    finally:
        old_group.Free()
    ranks = {old: n for old, n in enumerate(new) if n != MPI.UNDEFINED}
    failed = tuple(old for old, n in enumerate(new) if n == MPI.UNDEFINED)
    _step("stable", "%d rounds, failed %s, %d survivors", round_no, list(failed), len(ranks))
    return Shrunk(current, failed, MappingProxyType(ranks), round_no)


def _shrink_round(comm, round_no: int):
    """One revoke/agree/shrink/confirm round on ``comm``: (new communicator, stable?)."""
    _step("revoke", "round %d on %d ranks", round_no, comm.Get_size())
    _revoke(comm)
    agreed = _agree_on_failed(comm, round_no)
    _step("shrink", "round %d, agreed failed %s", round_no, sorted(agreed))
    shrunk = comm.Shrink()
    shrunk.Set_errhandler(MPI.ERRORS_RETURN)
    group, new_group = comm.Get_group(), shrunk.Get_group()
    try:
        gone = frozenset(r for r, n in enumerate(_ranks_in(group, range(comm.Get_size()), new_group))
                         if n == MPI.UNDEFINED)
    finally:
        group.Free()
        new_group.Free()
    _step("confirm", "round %d, shrink removed %s", round_no, sorted(gone))
    try:
        stable = bool(shrunk.Agree(int(gone == agreed)))
    except MPI.Exception as err:
        if not is_process_failure(err):
            raise
        log.debug("ulfm: a rank of the shrunk communicator failed (%s); another round", err.Get_error_string())
        stable = False
    return shrunk, stable


# ----- grow -----------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Grown:
    """What :func:`spawn_and_merge` and :func:`join_parent_link` return: ``comm``, the
    merged communicator (``ERRORS_RETURN`` set), and ``link``, the intercommunicator
    between the parents and the processes started. Keep ``link`` until the end and
    :func:`disconnect` it then: Open MPI 5.0 crashes in ``MPI_Finalize`` (and its launcher
    hangs) when a process spawned or was spawned and the link was freed, not disconnected."""

    comm: MPI.Intracomm
    link: MPI.Intercomm


def spawn_and_merge(comm, command: Sequence[str], count: int, *, info=None, root: int = 0) -> Grown:
    """Start ``count`` processes running ``command`` (program, then its
    arguments) and merge them into one communicator with ``comm``'s ranks,
    the new ranks after the old (``comm``'s rank r keeps rank r). Collective
    over ``comm``; each new process calls :func:`join_parent_link` (or
    :func:`join_parent`). ``comm`` is left as it was.

    Raises :class:`RecoveryError` when MPI cannot start them all."""
    command = [str(c) for c in command]
    if count < 1 or not command:
        raise ConfigError(f"grow: need a command and a count of at least 1, got {command!r} and {count}")
    try:
        errcodes: list = []
        inter = comm.Spawn(command[0], args=command[1:], maxprocs=count,
                           info=MPI.INFO_NULL if info is None else info, root=root, errcodes=errcodes)
    except MPI.Exception as err:
        raise RecoveryError(f"grow: could not start {count} process(es) of {command[0]}: "
                            f"{err.Get_error_string()}") from err
    return _merge_spawned(inter, errcodes, command[0], count, comm.Get_size())


def _merge_spawned(inter, errcodes: list, program: str, count: int, before: int) -> Grown:
    try:
        inter.Set_errhandler(MPI.ERRORS_RETURN)
        bad = [code for code in errcodes if code != MPI.SUCCESS]
        if bad:
            raise RecoveryError(f"grow: {len(bad)} of {count} process(es) of {program} did not start "
                                f"(error codes {bad})")
        merged = inter.Merge(high=False)
        merged.Set_errhandler(MPI.ERRORS_RETURN)
    except MPI.Exception as err:
        _free(inter)
        raise RecoveryError(f"grow: could not merge the new process(es): {err.Get_error_string()}") from err
    log.debug("ulfm grow: %d -> %d ranks", before, merged.Get_size())
    return Grown(merged, inter)


def spawn_and_merge_on(comm, command: Sequence[str], placements: Sequence[tuple[Any, int]], *,
                       root: int = 0) -> Grown:
    """:func:`spawn_and_merge` with ``placements``: (``MPI.Info`` of ``Spawn``, count) per
    group of new processes (one group: ``Spawn``; several: ``Spawn_multiple``, the groups'
    ranks in that order). Raises :class:`RecoveryError` when MPI cannot start them all."""
    if len(placements) == 1:
        info, count = placements[0]
        return spawn_and_merge(comm, command, count, info=info, root=root)
    command = [str(c) for c in command]
    counts = [count for _, count in placements]
    try:
        errcodes: list = []
        inter = comm.Spawn_multiple([command[0]] * len(counts), [command[1:]] * len(counts), counts,
                                    [info for info, _ in placements], root=root, errcodes=errcodes)
    except MPI.Exception as err:
        raise RecoveryError(f"grow: could not start {sum(counts)} process(es) of {command[0]} on "
                            f"{len(counts)} hosts: {err.Get_error_string()}") from err
    return _merge_spawned(inter, errcodes, command[0], sum(counts), comm.Get_size())


def split_off(comm, leaving: bool):
    """Collective over ``comm``: the communicator of the ranks that stay (``leaving``
    False), in their order, ``ERRORS_RETURN`` set; None on a rank that leaves."""
    try:
        sub = comm.Split(MPI.UNDEFINED if leaving else 0, comm.Get_rank())
    except MPI.Exception as err:
        raise RecoveryError(f"drain: could not split off the ranks that leave: {err.Get_error_string()}") from err
    if sub == MPI.COMM_NULL:
        return None
    sub.Set_errhandler(MPI.ERRORS_RETURN)
    return sub


def grow(comm, command: Sequence[str], count: int, *, info=None, root: int = 0) -> MPI.Intracomm:
    """:func:`spawn_and_merge`, keeping only the merged communicator (the link is
    freed: for processes that end with ``os._exit``)."""
    grown = spawn_and_merge(comm, command, count, info=info, root=root)
    _free(grown.link)
    return grown.comm


def join_parent_link() -> Grown:
    """In a process started by :func:`spawn_and_merge`: the merged communicator (this
    process's ranks after its parents') and the link to the parents."""
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise RecoveryError("join_parent: this process was not started by grow() (it has no parent communicator)")
    try:
        parent.Set_errhandler(MPI.ERRORS_RETURN)
        merged = parent.Merge(high=True)
        merged.Set_errhandler(MPI.ERRORS_RETURN)
    except MPI.Exception as err:
        raise RecoveryError(f"join_parent: could not merge with the parent job: {err.Get_error_string()}") from err
    return Grown(merged, parent)


def has_parent() -> bool:
    """Whether this process was started by another job's ``Spawn`` (a joining rank)."""
    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def disconnect(link) -> None:
    """Disconnect a :class:`Grown` link (collective over both sides); errors are logged."""
    try:
        link.Disconnect()
    except MPI.Exception as err:
        log.debug("disconnecting a grow link failed: %s", err.Get_error_string())


def join_parent() -> MPI.Intracomm:
    """In a process started by :func:`grow`: the merged communicator (this
    process's ranks after its parents'), ``ERRORS_RETURN`` set."""
    grown = join_parent_link()
    _free(grown.link)
    return grown.comm
