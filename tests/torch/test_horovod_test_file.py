"""Horovod's own PyTorch test file against hvd_partial (benchmarks/horovod_tests.py).

The whole file runs only where ``HOROVOD_SOURCE`` names a Horovod checkout
(Horovod's code is not part of this project). Without one, the runner itself
is checked on a small stand-in checkout: the imports it rewrites, and a test
that passes, fails on one rank, skips, and hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mpi_run import ROOT  # noqa: E402

pytestmark = pytest.mark.mpi
RUNNER = ROOT / "benchmarks" / "horovod_tests.py"
SOURCE = os.environ.get("HOROVOD_SOURCE")

STAND_IN_TEST = '''
import os
import sys
import time
import unittest

import horovod.torch as hvd
import torch

sys.path.append(os.path.join(os.path.dirname(__file__), os.pardir, 'utils'))

from common import mpi_env_rank_and_size


class TorchTests(unittest.TestCase):
    def test_sums(self):
        hvd.init()
        self.assertEqual(hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist(), [2.0, 2.0])
        self.assertEqual(mpi_env_rank_and_size(), (hvd.rank(), hvd.size()))

    def test_fails_on_rank_one(self):
        hvd.init()
        self.assertEqual(hvd.rank(), 0, "only rank 0 passes")

    def test_skips(self):
        self.skipTest("no GPUs here")

    def test_hangs_on_rank_one(self):
        hvd.init()
        if hvd.rank() == 1:
            time.sleep(600)
'''

STAND_IN_HELPER = '''
import os

import cloudpickle
import mock

from horovod.runner.util.threads import in_thread


def mpi_env_rank_and_size():
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1
'''


def _stand_in(root: Path) -> Path:
    (root / "test" / "parallel").mkdir(parents=True)
    (root / "test" / "utils").mkdir()
    (root / "test" / "parallel" / "test_torch.py").write_text(textwrap.dedent(STAND_IN_TEST))
    (root / "test" / "utils" / "common.py").write_text(textwrap.dedent(STAND_IN_HELPER))
    return root


def _run(args, timeout):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_runner_reports_pass_fail_skip_and_hang_per_test(tmp_path):
    source = _stand_in(tmp_path / "horovod")
    listed = tmp_path / "pass.txt"
    listed.write_text("test_sums\ntest_fails_on_rank_one\n")
    out, hung = tmp_path / "results.json", tmp_path / "hung.json"
    finishing = ["-k", "test_sums", "-k", "test_fails_on_rank_one", "-k", "test_skips"]
    proc = _run(["--source", str(source), "--pass-list", str(listed), "--timeout", "90", "--json", str(out),
                 *finishing], 600)
    # The hanging test alone, under a short timeout: it is a hang whenever the runner kills it.
    hang = _run(["--source", str(source), "--timeout", "8", "--json", str(hung), "-k", "test_hangs_on_rank_one"], 120)
    results = {**json.loads(out.read_text()), **json.loads(hung.read_text())}
    assert {name: status for name, (status, _) in results.items()} == {
        "test_sums": "PASS", "test_fails_on_rank_one": "FAIL", "test_skips": "SKIP", "test_hangs_on_rank_one": "HANG",
    }, proc.stdout + proc.stderr + hang.stdout + hang.stderr
    assert "rank 1" in results["test_fails_on_rank_one"][1] and "only rank 0 passes" in results[
        "test_fails_on_rank_one"][1]
    assert "no GPUs here" in results["test_skips"][1]
    assert "pass list: 1 of the 2 listed tests that ran passed" in proc.stdout
    assert proc.returncode == 1  # a listed test failed


def test_the_runner_refuses_a_folder_that_is_not_a_horovod_checkout(tmp_path):
    proc = _run(["--source", str(tmp_path)], 60)
    assert proc.returncode != 0 and "Horovod checkout" in proc.stderr


@pytest.mark.skipif(not SOURCE, reason="set HOROVOD_SOURCE to a Horovod checkout to run its test_torch.py")
def test_horovods_torch_test_file_passes_where_horovod_does(tmp_path):
    out = tmp_path / "results.json"
    proc = _run(["--source", SOURCE, "--json", str(out)], 3600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_every_test_of_horovods_file_that_does_not_pass_is_on_the_compatibility_page():
    import importlib.util

    spec = importlib.util.spec_from_file_location("horovod_tests", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    page = (ROOT / "docs" / "horovod-torch.md").read_text()
    assert runner.NOT_PASSING and all(reason for reason in runner.NOT_PASSING.values())
    missing = [name for name in runner.NOT_PASSING if f"\n| {name} |" not in page]
    assert not missing, f"docs/horovod-torch.md does not list {missing}"
