"""Used by worker scripts running under mpiexec: report results to the test,
order events between ranks, and run registered cases.

A case script registers each scenario with ``@case`` and ends with
``run_case()``, which calls the case named by ``argv[1]`` with the rest of the
arguments. A case asserts what it can on every rank itself: a failed
assertion is reported (``{"assertion_failed": ...}``) before the rank exits,
so the test, run through :func:`run_case_job`, names the rank and the
assertion even where the job was expected to fail.

Events between ranks are files in the job's output directory (``HVD_TEST_OUT``,
a temporary directory the test makes and removes): ``announce(name)`` on one
rank, ``await_announced(name)`` on the others. They order, never time.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import numpy as np


def _path(rank: int, suffix: str) -> str:
    return os.path.join(os.environ["HVD_TEST_OUT"], f"rank{rank}.{suffix}")


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def phase(text: str) -> None:
    """Record what this rank is doing now (shown if the job hangs)."""
    with open(_path(_rank(), "phase"), "w") as fh:
        fh.write(text)


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def report(value) -> None:
    """Hand ``value`` (JSON-able, numpy allowed) to the test."""
    rank = _rank()
    tmp = _path(rank, "json.tmp")
    with open(tmp, "w") as fh:
        json.dump(_plain(value), fh)
    os.replace(tmp, _path(rank, "json"))
    phase("reported")


def digest(arrays) -> str:
    """A bitwise fingerprint of arrays (compare replicas across ranks)."""
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ----- events between ranks ------------------------------------------------------------

def _event_path(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return os.path.join(os.environ["HVD_TEST_OUT"], f"event.{safe}")


def announce(name: str) -> None:
    """Make the event ``name`` known to every rank (atomically: a file appears).
    Callable from any thread (a logging handler's, say): it makes no MPI call."""
    path = _event_path(name)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(name)
    os.replace(tmp, path)


def announced(name: str) -> bool:
    return os.path.exists(_event_path(name))


def await_announced(*names: str) -> None:
    """Wait until every event in ``names`` was announced. No time limit of its
    own: the test's timeout kills a job stuck here, naming this phase."""
    phase("awaiting " + ", ".join(names))
    for name in names:
        while not announced(name):
            time.sleep(0.001)  # a poll of the file system, not an ordering


def wait_until(condition, what: str) -> None:
    """Wait for ``condition()`` (a fact of this rank's public state) to hold.
    No time limit of its own: the test's timeout names a rank stuck here."""
    phase(f"waiting for {what}")
    while not condition():
        time.sleep(0.001)  # a poll of the condition, not an ordering


# ----- registered cases ------------------------------------------------------------------

CASES: dict = {}


def case(function=None, *, names=()):
    """Register ``function`` as the case of its name (and of each of ``names``).
    With ``names``, the case is called with the name it was chosen by first."""
    def register(fn):
        if names:
            for name in names:
                CASES[name] = lambda *args, _fn=fn, _name=name: _fn(_name, *args)
        else:
            CASES[fn.__name__] = fn
        return fn

    return register(function) if function is not None else register


def expect(exc_type, fn, *args, **kwargs) -> str:
    """Call ``fn``, which must raise ``exc_type``; its ``"Type: message"``."""
    try:
        fn(*args, **kwargs)
    except exc_type as err:
        return f"{type(err).__name__}: {err}"
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def run_case(argv=None) -> None:
    """Run the case named by ``argv[1]`` with ``argv[2:]`` as its arguments.
    A failed assertion is reported, with the rank and where it failed, then
    raised (the rank exits with an error)."""
    argv = sys.argv if argv is None else argv
    if len(argv) < 2 or argv[1] not in CASES:
        raise SystemExit(f"unknown case {argv[1:2]}; cases: {', '.join(sorted(CASES))}")
    name = argv[1]
    try:
        CASES[name](*argv[2:])
    except AssertionError as err:
        where = traceback.extract_tb(err.__traceback__)[-1]
        text = f"rank {_rank()}, case {name}, line {where.lineno}: {where.line}: {err}"
        sys.stderr.write(f"assertion failed: {text}\n")
        report({"assertion_failed": text})
        phase(f"assertion failed: {text}")
        raise


# ----- the test's side ------------------------------------------------------------------

def run_case_job(script: str, nprocs: int, *args, expect_success: bool = True, require_reports: bool = True,
                 **kwargs):
    """Run ``script`` (a case script) like ``mpi_run.run_mpi``; fail the test
    first with every rank's failed assertion, then (with ``expect_success``)
    on a non-zero exit or a rank that did not report."""
    import pytest

    from mpi_run import require_success, run_mpi

    res = run_mpi(script, nprocs, *args, expect_success=False, **kwargs)
    failed = {rank: rep["assertion_failed"] for rank, rep in res.results.items()
              if isinstance(rep, dict) and "assertion_failed" in rep}
    if failed:
        pytest.fail(f"{script} {' '.join(map(str, args))}: assertions failed:\n"
                    + "\n".join(failed[r] for r in sorted(failed)) + "\n" + res.tail())
    if expect_success:
        require_success(res, script, require_reports)
    return res
