"""How each rank of an elastic job ended, for ``hvd-partial-run --elastic``.

Open MPI's ``mpirun`` exits non-zero as soon as any rank died, even when the
survivors finished, and names one rank at most. So with ``--elastic`` the
launcher starts every rank through this file, run as a script::

    mpirun ... python -I .../hvd_partial/launch/rank_status.py python train.py

The wrapper runs the program as its child (which dies with it), ends with the
process that started it (Linux: a launcher killed by SIGKILL leaves no rank
behind), waits for the program, and writes
``rank.N.json`` into the directory named by ``HVDP_STATUS_DIR`` (a temporary
directory the launcher makes and removes): ``{"rank": N, "returncode": C,
"ended": E}`` where ``C`` is the child's exit status (``-S`` for signal
``S``) and ``E`` says whether the program *ended* (its Python interpreter
began a normal exit: it returned, raised or called ``sys.exit``) rather than
died mid-run (a signal, ``os._exit``, an abort). ``E`` comes from a marker
file the program writes at exit (:func:`note_exit_for_launcher`, which
``hvd_partial.init`` calls when ``HVDP_EXIT_MARK`` is set). The wrapper then
exits as its child did (the same code, or the same signal), except that a
program that died mid-run with a non-zero status (``os._exit(1)``, an abort
handler's exit) ends its wrapper with SIGKILL: Open MPI's launcher, ULFM on,
ends the whole job when a rank *exits* non-zero, and keeps the others running
when one is killed.

The launcher reads the files (:func:`collect`, :func:`verdict`). A rank is

- *finished*: exit status 0;
- a rank whose program ended (its marker is there) but stayed in MPI_Finalize
  (Open MPI after a failure, now and then, on every survivor at once): its
  wrapper kills it after ``FINALIZE_GRACE_SECONDS`` and records
  ``in_finalize``; such a rank, and one with no record but the marker (killed
  while MPI finalized), counts as finished, its exit status unknown;
- *failed*: it ended with a non-zero status (an exception, ``sys.exit(1)``):
  the job fails;
- *lost*: anything else (killed by a signal, ``os._exit`` with a non-zero
  status, no file at all because its wrapper was killed or it runs on a
  host that does not share the directory).

Ranks started during the run to grow the elastic world back
(:mod:`hvd_partial.engine.growth`) run through the same wrapper, started as
``rank_status.py --member F PROGRAM...`` (F: the number of the first rank of
that grow, after every earlier rank), and record ``joined.N.json``; the
summary names them as *started*. A rank whose host the discovery script
drained writes ``rank.N.drained`` (or ``joined.N.drained``) beside its exit
marker (:func:`note_drained`); the summary names it as *drained*. The wrapper gives its program the command
that starts it again (``HVDP_RESPAWN``) and the program (``HVDP_PROGRAM``).

Only the standard library is imported here: the wrapper must start fast and
must not import MPI.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time

#: launcher -> wrapper: the directory for the status files
STATUS_DIR_ENV = "HVDP_STATUS_DIR"
#: wrapper -> program: the marker file written when the program ends (not dies)
EXIT_MARK_ENV = "HVDP_EXIT_MARK"
#: where the wrapper reads its rank (Open MPI, PMIx, MPICH's PMI)
RANK_ENVS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
#: wrapper -> program: the command that starts one more rank through this wrapper, the
#: program with its arguments (JSON lists) and the directory it started in (a relative
#: program path is relative to it, whatever directory the program moves to); read by
#: hvd_partial.engine.growth, whose names these are
RESPAWN_ENV = "HVDP_RESPAWN"
PROGRAM_ENV = "HVDP_PROGRAM"
PROGRAM_DIR_ENV = "HVDP_PROGRAM_DIR"
#: how long a program that ended (its marker written) may stay in MPI_Finalize (seconds;
#: the variable sets another)
FINALIZE_GRACE_ENV = "HVDP_FINALIZE_GRACE_SECONDS"
FINALIZE_GRACE_SECONDS = 20.0

# Signals the wrapper passes on to the program (what mpirun sends its ranks).
_FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1",
                                                      "SIGUSR2", "SIGCONT", "SIGTSTP") if hasattr(signal, name))


def status_path(directory: str, rank: int, joined: bool = False) -> str:
    """Where rank ``rank`` records how it ended (``joined``: a rank started during
    the run to grow the world back, numbered after every earlier rank)."""
    return os.path.join(directory, f"{'joined' if joined else 'rank'}.{rank}.json")


def note_exit_for_launcher() -> None:
    """In a program started by ``hvd-partial-run --elastic``: at a normal
    interpreter exit, write the marker that tells the launcher this rank
    ended rather than died. Does nothing otherwise; idempotent."""
    path = os.environ.get(EXIT_MARK_ENV)
    if not path or getattr(note_exit_for_launcher, "_registered", False):
        return
    note_exit_for_launcher._registered = True

    atexit.register(mark_exit_now)  # registered after init's own hook, so it runs before it (atexit is LIFO)


def mark_exit_now() -> None:
    """Write the marker of :func:`note_exit_for_launcher` now (a drained rank, which ends
    before the atexit hooks that would write it). Does nothing outside the launcher."""
    path = os.environ.get(EXIT_MARK_ENV)
    if not path:
        return
    try:
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))
    except OSError:  # the launcher then counts this rank as lost, not failed
        pass


def ended_joiners(numbers) -> dict[int, dict | None]:
    """In a program started by ``hvd-partial-run --elastic``: of the ranks a grow is
    starting, numbered ``numbers``, those whose wrapper has recorded how they ended
    (number -> the record, None where it could not be read): a rank that ended before
    the grow let it in died there. Empty outside the launcher."""
    mark = os.environ.get(EXIT_MARK_ENV)
    if not mark:
        return {}
    directory = os.path.dirname(mark)
    out = {}
    for number in numbers:
        try:
            with open(status_path(directory, number, True)) as fh:
                out[number] = json.load(fh)
        except FileNotFoundError:
            continue  # still running, or not started yet
        except (OSError, ValueError):
            out[number] = None
    return out


def note_drained() -> None:
    """Tell the launcher that this rank left because its host was drained (``rank.N.drained``
    or ``joined.N.drained`` beside its exit marker; the summary names it)."""
    path = os.environ.get(EXIT_MARK_ENV)
    if not path or not path.endswith(".ended"):
        return
    try:
        with open(path[:-len(".ended")] + ".drained", "w") as fh:
            fh.write(str(os.getpid()))
    except OSError:  # the summary then counts it as finished without saying why
        pass


def _rank() -> int | None:
    for name in RANK_ENVS:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return None


def _die_with_parent():
    """Linux: a function for ``preexec_fn`` that makes the program die with
    its wrapper (which mpirun may SIGKILL); None elsewhere. Looked up before
    the fork: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def wrap(program: list[str], first_member: int | None = None) -> int:
    """Run ``program``, record how it ended, return its exit status (``-S`` for signal ``S``).
    ``first_member``: this wrapper was started by a grow of the elastic world, whose
    first new rank has that number (this one is that plus its rank among those started)."""
    directory = os.environ.get(STATUS_DIR_ENV)
    rank = _rank()
    joined = first_member is not None
    if joined and rank is not None:
        rank += first_member
    env = dict(os.environ)
    mark = None
    if directory and rank is not None:
        mark = os.path.join(directory, f"{'joined' if joined else 'rank'}.{rank}.ended")
        _touch(os.path.join(directory, f"{'joined' if joined else 'rank'}.{rank}.started"))
        env[EXIT_MARK_ENV] = mark
    env.pop(STATUS_DIR_ENV, None)
    env[RESPAWN_ENV] = json.dumps([sys.executable, "-I", os.path.abspath(__file__)])
    env[PROGRAM_ENV] = json.dumps(program)
    env[PROGRAM_DIR_ENV] = os.getcwd()
    # Signals are forwarded from before the program starts (one that comes first waits for it):
    # a signal between its start and the handlers would end this wrapper and not the program.
    started: list = []
    early: list = []
    for sig in _FORWARDED:
        signal.signal(sig, lambda number, _frame: started[0].send_signal(number) if started else early.append(number))
    try:
        child = subprocess.Popen(program, env=env, preexec_fn=_die_with_parent())
    except OSError as err:
        sys.stderr.write(f"hvd-partial-run: rank {rank}: cannot start {program[0]!r}: {err}\n")
        code = 127
    else:
        started.append(child)
        for number in early:
            child.send_signal(number)
        code, in_finalize = _wait_for(child, mark)
    ended = bool(mark and os.path.exists(mark))
    if directory and rank is not None:
        record = {"rank": rank, "returncode": code, "ended": ended}
        if in_finalize:
            record["in_finalize"] = True
        if joined:
            record["joined"] = True
        tmp = status_path(directory, rank, joined) + ".tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(record, fh)
            os.replace(tmp, status_path(directory, rank, joined))
        except OSError as err:
            if os.path.isdir(directory):  # else the launcher has read the records already
                sys.stderr.write(f"hvd-partial-run: rank {rank}: cannot record its exit in {directory}: {err}\n")
        if code > 0 and not ended:
            return -int(signal.SIGKILL)  # died mid-run: end as a killed rank, so the survivors run on
    return code


def _wait_for(child: subprocess.Popen, mark: str | None) -> tuple[int, bool]:
    """The program's exit status, and whether this wrapper ended it in MPI_Finalize:
    once its marker says that it ended, it has :data:`FINALIZE_GRACE_SECONDS` to exit
    (``HVDP_FINALIZE_GRACE_SECONDS``);
    after a failure Open MPI's MPI_Finalize now and then waits forever (for every
    survivor at once: nothing else would end the job). Such a rank counts as having
    ended with status 0 (its real status is unknown)."""
    if mark is None:
        return child.wait(), False
    grace = float(os.environ.get(FINALIZE_GRACE_ENV) or FINALIZE_GRACE_SECONDS)
    ended_at = None
    while True:
        try:
            return child.wait(timeout=min(1.0, grace)), False
        except subprocess.TimeoutExpired:
            pass
        if ended_at is None:
            if os.path.exists(mark):
                ended_at = time.monotonic()
        elif time.monotonic() - ended_at > grace:
            sys.stderr.write(f"hvd-partial-run: pid {child.pid} ended its program {grace:.0f} s "
                             "ago but MPI_Finalize has not returned: killing it\n")
            child.kill()
            child.wait()
            return 0, True


def _exit_like(code: int) -> None:
    """Exit with ``code``, or die of the same signal when it is negative."""
    if code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
            pass
        os.kill(os.getpid(), -code)
        os._exit(128 - code)  # a signal that does not kill by default
    os._exit(code if 0 <= code < 256 else 1)


# ----- the launcher's side ----------------------------------------------------------------

def _touch(path: str) -> None:
    try:
        with open(path, "w"):
            pass
    except OSError:
        pass  # the launcher has closed the folder: nothing to tell it


def any_started(directory: str) -> bool:
    """Whether a rank of the job has started (its wrapper writes a mark first thing)."""
    try:
        return any(entry.endswith(".started") for entry in os.listdir(directory))
    except OSError:
        return False


def collect(directory: str, nprocs: int) -> dict[int, dict | None]:
    """rank -> its record, or None where it left none; removes ``directory``.

    Open MPI's mpirun can exit before every wrapper has (when it ends the job
    because half of the ranks died): the folder is renamed first, so that a
    record written later fails in the wrapper instead of landing in a folder
    being removed; such a rank counts as having left no record."""
    closed = f"{directory}.closed"
    try:
        os.rename(directory, closed)
    except OSError:
        return {rank: None for rank in range(nprocs)}
    out = {rank: _read_record(closed, rank, False) for rank in range(nprocs)}
    # Ranks started during the run (growing the elastic world back), by their number.
    started = set()
    for entry in os.listdir(closed):
        parts = entry.split(".")
        # (a wrapper killed before its program ended leaves only its start mark: a lost rank)
        if parts[0] == "joined" and len(parts) == 3 and parts[1].isdigit() and parts[2] in ("json", "ended",
                                                                                              "started"):
            started.add(int(parts[1]))
    for rank in sorted(started):
        record = _read_record(closed, rank, True)
        out[rank] = record if record is not None else {"rank": rank, "returncode": -9, "joined": True,
                                                       "ended": False, "unrecorded": True}
    for rank, record in out.items():  # ranks that left because their hosts were drained
        kind = "joined" if rank in started else "rank"
        if record is not None and os.path.exists(os.path.join(closed, f"{kind}.{rank}.drained")):
            record["drained"] = True
    shutil.rmtree(closed, ignore_errors=True)
    return out


def _read_record(closed: str, rank: int, joined: bool) -> dict | None:
    try:
        with open(status_path(closed, rank, joined)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        # No record, but the program ended (its marker is there): it was killed while MPI
        # finalized, which Open MPI does after a failure now and then (its status is unknown).
        ended = os.path.exists(os.path.join(closed, f"{'joined' if joined else 'rank'}.{rank}.ended"))
        if not ended:
            return None
        return {"rank": rank, "returncode": 0, "ended": True, "in_finalize": True, **({"joined": True} if joined else {})}


def describe(record: dict | None) -> str:
    """How a rank ended, in words."""
    if record is None or record.get("unrecorded"):
        return "no exit recorded"
    code = record["returncode"]
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if record.get("in_finalize"):
        return "ended, then killed while MPI finalized"
    if code == 0:
        return "exit 0"
    return f"exit {code}" + ("" if record.get("ended") else " mid-run")


def verdict(records: dict[int, dict | None], min_np: int) -> tuple[bool, str]:
    """(success, one summary line) for an elastic job's records."""
    finished = [r for r, rec in records.items() if rec is not None and rec["returncode"] == 0]
    failed = [r for r, rec in records.items()
              if rec is not None and rec["returncode"] > 0 and rec.get("ended")]
    lost = [r for r in records if r not in finished and r not in failed]

    def named(ranks):
        return ", ".join(f"rank {r} ({describe(records[r])})" for r in ranks)

    started = [r for r, rec in records.items() if rec is not None and rec.get("joined")]
    drained = [r for r, rec in records.items() if rec is not None and rec.get("drained")]
    text = f"{len(finished)} of {len(records)} ranks finished"
    if lost:
        text += f"; lost {named(lost)}"
    if started:
        text += f"; started {named(started)}"
    if drained:
        text += f"; drained {named(drained)}"
    if failed:
        return False, f"{text}; failed {named(failed)}: a rank that ends with an error fails the job"
    if len(finished) < min_np:
        return False, f"{text}: fewer than --min-np {min_np}"
    return True, text


def _end_with_launcher() -> None:
    """Linux: end this wrapper (and so its program, which dies with it) when the process
    that started it ends: ``mpirun`` killed by SIGKILL cannot end its ranks, and a rank
    waiting in MPI (a grow's ``Spawn``) would otherwise run on as an orphan."""
    arm = _die_with_parent()
    if arm is None:
        return
    launcher = os.getppid()
    arm()
    if os.getppid() != launcher:  # it ended before the signal was armed
        os._exit(128 + int(signal.SIGKILL))


def main(argv: list[str] | None = None) -> None:
    _end_with_launcher()
    program = list(sys.argv[1:] if argv is None else argv)
    first_member = None
    if len(program) >= 2 and program[0] == "--member":  # started by a grow (hvd_partial.engine.growth)
        first_member, program = int(program[1]), program[2:]
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        sys.stderr.write("usage: rank_status.py PROGRAM [ARGS...]\n")
        os._exit(2)
    _exit_like(wrap(program, first_member))


if __name__ == "__main__":
    main()
