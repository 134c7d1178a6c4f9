"""Run one of Horovod's own test files against hvd_partial, with only the
imports changed, the way Horovod's CI runs it (``mpiexec -n 2 python -m
pytest``), and compare the outcome with what Horovod itself passes here.

``--file torch`` (the default) is ``test/parallel/test_torch.py``,
``--file tensorflow`` is ``test/parallel/test_tensorflow.py`` (with its
``base_test_tensorflow.py``; the file runs every test twice, in a TF1-style
graph and eagerly), ``--file keras`` is ``test/parallel/test_tensorflow2_keras.py``
(it needs the ``parameterized`` package; run it with ``--whole-file``, since
its parameterized tests have expanded names), ``--file tensorflow-sets`` and
``--file keras-sets`` are ``test/parallel/test_tensorflow_process_sets.py`` and
``test/parallel/test_tensorflow2_keras_process_sets.py`` (sets of the even
and the odd ranks added at ``init``: run them with ``--np 4 --whole-file``, as
they add their sets once per file).

Horovod's files are not part of this project: ``HOROVOD_SOURCE`` (or
``--source``) names a Horovod checkout, and the test file and
``test/utils/common.py`` are read from there. Into a temporary folder go
copies with their imports rewritten, and nothing else changed:
``horovod.torch`` becomes ``hvd_partial.torch`` (``horovod.tensorflow``,
``horovod.tensorflow.keras`` and ``horovod.keras`` likewise); in the helper
module, ``mock`` becomes the standard library's ``unittest.mock``,
``cloudpickle`` falls back to ``pickle`` when it is not installed, and
Horovod's launcher utility ``in_thread`` (and, for the Keras file, its
version helper) comes from a small module written beside it. Every rank runs
with ``HVD_PARTIAL_MODE=sync``.

By default each test runs as its own job (``mpiexec -n 2 python -m pytest
FILE::CLASS::NAME``), killed with its ranks after ``--timeout`` seconds;
``--whole-file`` runs the file as one job, as Horovod's CI does, under
``--file-timeout``. Each rank writes its outcome per test; a test passes when
it passed on every rank, fails when it failed on any (or its job was killed
or crashed before the rank reported), and is skipped when every rank skipped.

    git --git-dir=HOROVOD.git archive HEAD test | tar -x -C /tmp/horovod-src
    HOROVOD_SOURCE=/tmp/horovod-src python benchmarks/horovod_tests.py
    python benchmarks/horovod_tests.py --source /tmp/horovod-src -k allgather --json out.json
    python benchmarks/horovod_tests.py --source /tmp/horovod-src --file tensorflow --whole-file

Prints one line per test (PASS, FAIL, SKIP, HANG), then a summary against
the pass list (torch: ``horovod_torch_pass.txt`` beside the project, or
``--pass-list``); exits 0 when every test that ran passed, except those the
file's ``NOT_PASSING`` table lists (each with its reason;
docs/horovod-torch.md and docs/horovod-tensorflow.md list them).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
HELPER = "test/utils/common.py"


class Suite(NamedTuple):
    """One of Horovod's test files: where it is, its test class, and the
    import lines that change (pattern, replacement) in it and in the files
    beside it that it imports."""

    test_file: str
    test_class: str
    imports: tuple
    companions: tuple = ()          # (path in the checkout, import rules) copied beside the test file
    pass_list: str | None = None    # file beside the project listing the tests Horovod passes here


_TF_UTIL = (r"^from horovod\.tensorflow\.util import _executing_eagerly$",
               "from hvd_partial.tensorflow.util import _executing_eagerly")

_RANK_AND_SIZE = (r"^from horovod\.runner\.common\.util\.env import get_env_rank_and_size$",
                  "from hvd_partial_test_shims import get_env_rank_and_size")

SUITES = {
    "torch": Suite("test/parallel/test_torch.py", "TorchTests",
                   ((r"^import horovod\.torch as hvd$", "import hvd_partial.torch as hvd"),),
                   pass_list="horovod_torch_pass.txt"),
    "tensorflow": Suite("test/parallel/test_tensorflow.py", "TensorFlowTests",
                        ((r"^import horovod\.tensorflow as hvd$", "import hvd_partial.tensorflow as hvd"), _TF_UTIL),
                        companions=(("test/parallel/base_test_tensorflow.py", (_TF_UTIL,)),)),
    "keras": Suite("test/parallel/test_tensorflow2_keras.py", "Tf2KerasTests",
                   ((r"^import horovod\.keras as hvd_keras$", "import hvd_partial.keras as hvd_keras"),
                    (r"^import horovod\.tensorflow\.keras as hvd$", "import hvd_partial.tensorflow.keras as hvd"),
                    (r"^from horovod\.common\.util import is_version_greater_equal_than$",
                     "from hvd_partial_test_shims import is_version_greater_equal_than"))),
    "tensorflow-sets": Suite("test/parallel/test_tensorflow_process_sets.py", "TensorFlowProcessSetsTests",
                             ((r"^import horovod\.tensorflow as hvd$", "import hvd_partial.tensorflow as hvd"), _TF_UTIL,
                              _RANK_AND_SIZE),
                             companions=(("test/parallel/base_test_tensorflow.py", (_TF_UTIL,)),)),
    "keras-sets": Suite("test/parallel/test_tensorflow2_keras_process_sets.py", "Tf2KerasProcessSetsTests",
                        ((r"^import horovod\.tensorflow\.keras as hvd$", "import hvd_partial.tensorflow.keras as hvd"),
                         _RANK_AND_SIZE)),
}

HELPER_IMPORTS = [
    (r"^import mock$", "from unittest import mock"),
    (r"^import cloudpickle$", "try:\n    import cloudpickle\nexcept ImportError:\n    import pickle as cloudpickle"),
    (r"^from horovod\.runner\.util\.threads import in_thread$", "from hvd_partial_test_shims import in_thread"),
]

SHIMS = '''"""Stand-ins for the Horovod utilities its test files import (written by hvd_partial's runner)."""
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def is_version_greater_equal_than(ver, target):
    from packaging import version
    return version.parse(ver) >= version.parse(target)


def get_env_rank_and_size():
    import os
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None
'''

#: A pytest plugin every rank loads: it appends one JSON line per test phase
#: to ``$HVD_TESTS_REPORT/rank<R>.jsonl``.
PLUGIN = '''"""Per-rank outcome of every test phase (written by hvd_partial's runner)."""
import json
import os

_RANK = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "HVD_RANK") if v in os.environ), "0")


def pytest_runtest_logreport(report):
    message = ""
    if report.failed or report.skipped:
        text = str(report.longrepr) if report.longrepr is not None else ""
        if report.skipped and isinstance(report.longrepr, tuple):
            text = str(report.longrepr[2])
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")] or text.splitlines()[-1:]
        message = " | ".join(ln[1:].strip() if ln.startswith("E ") else ln.strip() for ln in lines[:3])
    record = {"test": report.nodeid.rsplit("::", 1)[-1], "when": report.when, "outcome": report.outcome,
              "message": message[:300]}
    path = os.path.join(os.environ["HVD_TESTS_REPORT"], "rank" + _RANK + ".jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\\n")
'''


_GPU = "skipped: needs a GPU (Horovod skips it here too)"
_MUON = ("fails on torch 2.13's Muon optimizer (only 2-D parameters), which the test builds with every "
         "torch.optim class; Horovod 0.28.1 fails it the same way")

#: Every test of Horovod's file that does not pass here, with the reason
#: (docs/horovod-torch.md lists the same); every other test must pass.
NOT_PASSING = {
    **{name: _GPU for name in (
        "test_gpu_required", "test_horovod_allreduce_multi_gpu", "test_horovod_allreduce_cpu_gpu_error",
        "test_horovod_grouped_allreduce_cpu_gpu_error", "test_horovod_alltoall_splits_on_gpu",
        "test_model_parallelism", "test_delta_optimizer", "test_horovod_sync_batch_norm")},
    "test_horovod_reinit": "skipped: runs only under Horovod's Gloo launcher (HOROVOD_RANK set), as in Horovod",
    "test_horovod_is_initialized": "skipped: runs only under Horovod's Gloo launcher (HOROVOD_RANK set), as in Horovod",
    "test_broadcast_state_gpu": "skipped: marked unittest.skip in Horovod's file",
    "test_timeline_api": "skipped: marked pytest.mark.skip in Horovod's file",
    "test_broadcast_state": _MUON,
    "test_broadcast_state_options": _MUON,
    "test_force_allreduce": _MUON,
}


_GRAPH_ERROR = ("passes eagerly; fails in the file's TF1-style graph run, where TensorFlow reports the exception "
                "of a Python op as UnknownError (its message names FailedPreconditionError and MismatchError): a "
                "graph maps only ValueError and TypeError (to InvalidArgumentError), NotImplementedError, "
                "StopIteration and MemoryError to other classes, none to FailedPreconditionError, and the ranks' "
                "disagreement is known only when the op runs")
_KERAS3 = "uses a Keras 2 API that Keras 3 (TensorFlow 2.21) removed: "
_TF_GPU = "skipped: needs a GPU (Horovod skips it here too)"

#: Tests of test_tensorflow.py that do not pass here, with the reason (docs/horovod-tensorflow.md).
NOT_PASSING_TENSORFLOW = {
    **{name: _GRAPH_ERROR for name in (
        "test_horovod_allreduce_error", "test_horovod_allreduce_type_error", "test_horovod_allgather_error",
        "test_horovod_allgather_type_error", "test_horovod_broadcast_error", "test_horovod_broadcast_type_error",
        "test_horovod_broadcast_rank_error", "test_horovod_alltoall_type_error", "test_horovod_alltoall_rank_error",
        "test_horovod_reducescatter_error", "test_horovod_reducescatter_type_error")},
    "test_horovod_syncbn_cpu": _KERAS3 + "BatchNormalization(fused=...)",
    "test_partial_distributed_gradient_tape": _KERAS3 + "Variable.ref() (register_local_source itself works)",
    **{name: _TF_GPU for name in (
        "test_gpu_required", "test_horovod_allreduce_indexed_slices_gpu", "test_horovod_allreduce_indexed_slices_average_gpu",
        "test_horovod_allreduce_gpu", "test_horovod_allreduce_average_gpu", "test_horovod_allreduce_min_gpu",
        "test_horovod_allreduce_max_gpu", "test_horovod_allreduce_product_gpu", "test_horovod_allreduce_gpu_fused",
        "test_horovod_allreduce_multi_gpu", "test_horovod_allreduce_cpu_gpu_error", "test_horovod_allreduce_grad_gpu",
        "test_horovod_allreduce_average_grad_gpu", "test_horovod_grouped_allreduce_gpu", "test_horovod_grouped_allreduce_indexed_slices_gpu",
        "test_horovod_grouped_allreduce_mixed_indexed_slices_gpu", "test_horovod_grouped_allreduce_average_gpu", "test_horovod_grouped_allreduce_min_gpu",
        "test_horovod_grouped_allreduce_max_gpu", "test_horovod_grouped_allreduce_product_gpu", "test_horovod_grouped_allreduce_indexed_slices_average_gpu",
        "test_horovod_grouped_allreduce_mixed_indexed_slices_average_gpu", "test_horovod_grouped_allreduce_grad_gpu", "test_horovod_allgather_gpu",
        "test_horovod_allgather_fused_gpu", "test_horovod_allgather_variable_size_fused_gpu", "test_horovod_allgather_variable_size_gpu",
        "test_horovod_allgather_grad_gpu", "test_horovod_broadcast_gpu", "test_horovod_broadcast_inplace_gpu",
        "test_horovod_broadcast_grad_gpu", "test_horovod_alltoall_gpu", "test_horovod_alltoall_equal_split_gpu",
        "test_horovod_alltoall_empty_gpu", "test_horovod_alltoall_one_rank_sends_nothing_gpu", "test_horovod_alltoall_one_rank_receives_nothing_gpu",
        "test_horovod_alltoall_zero_splits_gpu", "test_horovod_alltoall_grad_gpu", "test_horovod_alltoall_equal_split_grad_gpu",
        "test_horovod_join_allreduce", "test_horovod_syncbn_gpu", "test_horovod_reducescatter_gpu",
        "test_horovod_reducescatter_gpu_prescale", "test_horovod_reducescatter_gpu_postscale", "test_horovod_reducescatter_gpu_fused",
        "test_horovod_reducescatter_gpu_uneven", "test_horovod_reducescatter_gpu_uneven_fused", "test_horovod_reducescatter_grad_gpu",
        "test_horovod_grouped_reducescatter_gpu", "test_horovod_grouped_reducescatter_gpu_prescale", "test_horovod_grouped_reducescatter_gpu_postscale",
        "test_horovod_grouped_allgather_gpu",
    )},
    "test_horovod_broadcast_eager_mode_error": "passes eagerly; skipped by the file itself in its graph run",
    "test_horovod_broadcast_graph_mode": "passes in its graph run; skipped by the file itself in its eager run",
    "test_local_gradient_aggregation": "skipped by the file itself: a Keras 2 legacy optimizer in graph mode only",
    "test_local_gradient_aggregation_sparse": "skipped by the file itself: a Keras 2 legacy optimizer in graph mode only",
}

#: Tests of test_tensorflow2_keras.py that do not pass here, with the reason (docs/horovod-tensorflow.md).
NOT_PASSING_KERAS = {
    "test_train_model_lr_schedule": _KERAS3 + "keras.losses.mean_squared_error",
    "test_sparse_as_dense": _KERAS3 + "the optimizer argument lr=",
    "test_sparse_as_dense_with_grad_aggregation": _KERAS3 + "the optimizer argument lr=",
    "test_legacy_optimizer": _KERAS3 + "keras.optimizers.legacy",
    **{name: _KERAS3 + "an Optimizer subclass built without learning_rate (Keras 2's OptimizerV2 API)"
       for name in ("test_gradient_aggregation_0", "test_gradient_aggregation_1",
                    "test_gradient_aggregation_with_local_vars_0", "test_gradient_aggregation_with_local_vars_1")},
    "test_partial_distributed_optimizer": (_KERAS3 + "Variable.ref() (hvd_partial.keras.PartialDistributedOptimizer "
                                           "exists; the test also expects _compute_gradients to return reduced "
                                           "gradients, which here apply_gradients reduces)"),
    "test_broadcast_global_variables_callback_with_local_vars": _KERAS3 + "Variable.ref()",
}

#: Tests of test_tensorflow_process_sets.py that do not pass here, with the reason (docs/horovod-tensorflow.md).
NOT_PASSING_TENSORFLOW_SETS = {
    **{name: _TF_GPU for name in (
        "test_horovod_allreduce_gpu_process_sets", "test_horovod_grouped_allreduce_gpu_process_sets",
        "test_horovod_allgather_gpu_process_sets", "test_horovod_broadcast_gpu_process_sets",
        "test_horovod_alltoall_gpu_process_sets", "test_horovod_reducescatter_gpu_process_sets")},
    "test_legacy_DistributedOptimizer_process_sets": ("a TF1 optimizer (tf.compat.v1.train) in a graph: "
                                                      "hvd_partial's DistributedOptimizer wraps Keras 3 optimizers"),
    "test_horovod_reducescatter_grad_cpu_process_sets": (
        "fails in its eager run on the float16 case although the gradient is exact (error 0.0): the test checks "
        "a float16 error < 1e-8, and numpy 2's promotion rules (NEP 50) round 1e-8 to float16 0.0"),
}

#: Tests of test_tensorflow2_keras_process_sets.py that do not pass here, with the reason (docs/horovod-tensorflow.md).
NOT_PASSING_KERAS_SETS = {
    "test_process_set_optimizer": _KERAS3 + "an Optimizer subclass built without learning_rate (Keras 2's OptimizerV2 "
                                            "API); tests/tensorflow/test_tf_process_sets_mpi.py checks the same "
                                            "optimizer on a set",
}

NOT_PASSING_BY_FILE = {"torch": NOT_PASSING, "tensorflow": NOT_PASSING_TENSORFLOW, "keras": NOT_PASSING_KERAS,
                       "tensorflow-sets": NOT_PASSING_TENSORFLOW_SETS, "keras-sets": NOT_PASSING_KERAS_SETS}


class SourceError(Exception):
    """The Horovod checkout lacks a file, or a file lacks the import to rewrite."""


def rewrite(text: str, rules, what: str) -> str:
    for pattern, replacement in rules:
        text, n = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        if n == 0 and "cloudpickle" not in pattern:
            raise SourceError(f"{what}: no line matches {pattern!r}; is this Horovod's file?")
    return text


def prepare(source: Path, work: Path, suite: Suite) -> Path:
    """Write the rewritten test file, its companions, helper, shims and plugin
    under ``work``; returns the test file's path (``work/parallel/NAME.py``, so
    that the file's own ``sys.path`` line finds ``work/utils``)."""
    for rel in (suite.test_file, HELPER, *(c for c, _ in suite.companions)):
        if not (source / rel).is_file():
            raise SourceError(f"{source / rel} not found: HOROVOD_SOURCE must be a Horovod checkout")
    (work / "parallel").mkdir(parents=True)
    (work / "utils").mkdir()
    test = work / "parallel" / Path(suite.test_file).name
    test.write_text(rewrite((source / suite.test_file).read_text(), suite.imports, suite.test_file))
    for rel, rules in suite.companions:
        (work / "parallel" / Path(rel).name).write_text(rewrite((source / rel).read_text(), rules, rel))
    (work / "utils" / "common.py").write_text(rewrite((source / HELPER).read_text(), HELPER_IMPORTS, HELPER))
    (work / "utils" / "hvd_partial_test_shims.py").write_text(SHIMS)
    (work / "hvd_partial_test_report.py").write_text(PLUGIN)
    (work / "pytest.ini").write_text("[pytest]\n")
    return test


def test_names(path: Path, test_class: str) -> list[str]:
    """The test methods of the file's test class, in file order."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == test_class:
            return [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    raise SourceError(f"{path}: no class {test_class}")


def run_job(cmd, env, timeout, cwd) -> tuple[int, str, bool]:
    """Run ``cmd`` in a session of its own; on timeout kill the whole job."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return proc.returncode, out, True


WORSE = {"passed": 0, "skipped": 1, "failed": 2}


def read_reports(report_dir: Path, nprocs: int) -> dict:
    """rank -> test -> (outcome, message), the worst phase winning; a test
    whose teardown a rank did not report is missing there (it never ended)."""
    rank_of = {}
    for rank in range(nprocs):
        path = report_dir / f"rank{rank}.jsonl"
        tests: dict = {}
        ended: set = set()
        if path.exists():
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                old = tests.get(rec["test"])
                if old is None or WORSE[rec["outcome"]] > WORSE[old[0]]:
                    tests[rec["test"]] = (rec["outcome"], rec["message"])
                if rec["when"] == "teardown":
                    ended.add(rec["test"])
        tests = {name: value for name, value in tests.items() if name in ended}
        rank_of[rank] = tests
    return rank_of


def combine(name: str, ranks: dict, nprocs: int, killed: bool, tail: str) -> tuple[str, str]:
    outcomes = [ranks[r].get(name) for r in range(nprocs)]
    failed = [(r, o[1]) for r, o in enumerate(outcomes) if o and o[0] == "failed"]
    if failed:
        return "FAIL", f"rank {failed[0][0]}: {failed[0][1]}"
    missing = [r for r, o in enumerate(outcomes) if o is None]
    if missing:
        why = "killed after the timeout" if killed else "the job ended before it reported"
        last = " | ".join(ln.strip() for ln in tail.strip().splitlines()[-2:])
        return ("HANG" if killed else "FAIL"), f"ranks {missing}: {why}" + ("" if killed else f": {last[:300]}")
    if killed:
        return "HANG", "every rank reported, but the job did not exit: killed after the timeout"
    if all(o[0] == "skipped" for o in outcomes):
        return "SKIP", outcomes[0][1]
    return "PASS", ""


def expand_parameterized(names: list[str], ranks: dict) -> list[str]:
    """``names`` with each test that a decorator expanded into several
    (``test_x`` run as ``test_x_0_True``, ...) replaced by what the ranks reported."""
    reported = sorted(set().union(*(tests.keys() for tests in ranks.values())))
    out = []
    for name in names:
        expanded = [r for r in reported if re.fullmatch(re.escape(name) + r"_\d+(_.*)?", r) and r not in names]
        out.extend(expanded or [name])
    return out


def run_tests(test: Path, names: list[str], args) -> dict:
    """name -> (status, reason)."""
    from hvd_partial.launch import mpiexec_command

    work = test.parent.parent
    env = dict(os.environ)
    env.update({"HVD_PARTIAL_MODE": args.mode, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), str(work), str(work / "utils"),
                                               env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-p", "hvd_partial_test_report", "-p", "no:cacheprovider",
                   "-c", str(work / "pytest.ini"), "--rootdir", str(work)]
    results = {}
    batches = [names] if args.whole_file else [[n] for n in names]
    for batch in batches:
        report_dir = Path(tempfile.mkdtemp(prefix="reports-", dir=work))
        env["HVD_TESTS_REPORT"] = str(report_dir)
        everything = len(batch) == len(names) and not args.only
        targets = [str(test)] if args.whole_file and everything else [f"{test}::{args.suite.test_class}::{n}" for n in batch]
        cmd = mpiexec_command(args.np, pytest_args + targets)
        started = time.monotonic()
        code, out, killed = run_job(cmd, env, args.file_timeout if args.whole_file else args.timeout, work)
        ranks = read_reports(report_dir, args.np)
        for name in expand_parameterized(batch, ranks):
            status, reason = combine(name, ranks, args.np, killed, out)
            results[name] = (status, reason)
            listed = "" if args.listed is None else ("  [listed]" if name in args.listed else "  [not listed]")
            seconds = f" {time.monotonic() - started:5.1f}s" if not args.whole_file else ""
            print(f"{status:4} {name}{seconds}{listed}" + (f"  -- {reason}" if reason else ""), flush=True)
        if args.verbose and code != 0:
            print(out[-4000:], flush=True)
    return results


def summary(results: dict, listed: set | None, known: dict) -> bool:
    """Print the counts; True when every test outside ``known`` (the suite's
    :data:`NOT_PASSING`) passed."""
    counts = {s: sum(1 for v in results.values() if v[0] == s) for s in ("PASS", "FAIL", "HANG", "SKIP")}
    print(f"\n{len(results)} tests: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
    if listed is not None:
        ran = [n for n in results if n in listed]
        bad = [n for n in ran if results[n][0] != "PASS"]
        print(f"pass list: {len(ran) - len(bad)} of the {len(ran)} listed tests that ran passed")
        for name in bad:
            why = " (known: see NOT_PASSING)" if name in known else ""
            print(f"  listed, not passing{why}: {name} ({results[name][0]}: {results[name][1]})")
        extra = [n for n in results if n not in listed and results[n][0] == "PASS"]
        if extra:
            print(f"passing though not listed: {', '.join(extra)}")
    unexpected = [n for n in results if n not in known and results[n][0] != "PASS"]
    for name in unexpected:
        print(f"UNEXPECTED {results[name][0]}: {name} ({results[name][1]})")
    for name in (n for n in results if n in known and results[n][0] == "PASS"):
        print(f"passes now, though listed in NOT_PASSING: {name}")
    return not unexpected


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=os.environ.get("HOROVOD_SOURCE"),
                        help="Horovod checkout (default: $HOROVOD_SOURCE)")
    parser.add_argument("--file", choices=sorted(SUITES), default="torch",
                        help="which of Horovod's test files: test_torch.py (default), test_tensorflow.py, "
                             "test_tensorflow2_keras.py, test_tensorflow_process_sets.py (tensorflow-sets) or "
                             "test_tensorflow2_keras_process_sets.py (keras-sets)")
    parser.add_argument("--pass-list", help="tests Horovod itself passes, one a line (default for torch: "
                        "horovod_torch_pass.txt beside the project; ignored when the file does not exist)")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--mode", default="sync", help="HVD_PARTIAL_MODE for every rank")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per test job")
    parser.add_argument("--whole-file", action="store_true", help="one job for the whole file, as Horovod's CI")
    parser.add_argument("--file-timeout", type=float, default=1800.0, help="seconds for --whole-file")
    parser.add_argument("-k", dest="only", action="append", default=[],
                        help="run only tests whose name contains this (repeatable)")
    parser.add_argument("--start-at", help="skip the tests before this one (file order), to resume a run")
    parser.add_argument("--json", help="write {test: [status, reason]} here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print a failed job's output")
    args = parser.parse_args(argv)
    if not args.source:
        parser.error("set HOROVOD_SOURCE or --source to a Horovod checkout")
    args.suite = SUITES[args.file]
    known = NOT_PASSING_BY_FILE[args.file]
    if args.pass_list is None and args.suite.pass_list:
        args.pass_list = str(ROOT.parent / "shared" / args.suite.pass_list)
    args.listed = None
    if args.pass_list and Path(args.pass_list).is_file():
        args.listed = {ln.strip() for ln in Path(args.pass_list).read_text().splitlines() if ln.strip()}
    work = Path(tempfile.mkdtemp(prefix="horovod-tests-"))
    try:
        try:
            test = prepare(Path(args.source), work, args.suite)
            names = test_names(test, args.suite.test_class)
        except SourceError as err:
            print(f"horovod_tests: {err}", file=sys.stderr)
            return 2
        if args.start_at:
            if args.start_at not in names:
                print(f"horovod_tests: no test {args.start_at!r} in {args.suite.test_file}", file=sys.stderr)
                return 2
            names = names[names.index(args.start_at):]
        if args.only:
            names = [n for n in names if any(k in n for k in args.only)]
        results = run_tests(test, names, args)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    ok = summary(results, args.listed, known)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
