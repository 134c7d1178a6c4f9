"""Horovod's TensorFlow 2 and Keras examples with only the import changed
(tests/tensorflow/horovod_examples.py), in solo (the default mode) and sync,
on 2 ranks, replicas compared afterwards. Horovod's code is not part of this
project: set HOROVOD_SOURCE to a Horovod checkout (its examples/ folder) to
run them; otherwise they are skipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, str(Path(__file__).parent))
import horovod_examples as ex  # noqa: E402

pytestmark = pytest.mark.mpi
SOURCE = os.environ.get("HOROVOD_SOURCE")


@pytest.mark.skipif(not SOURCE, reason="set HOROVOD_SOURCE to a Horovod checkout to run its examples")
@pytest.mark.parametrize("mode", ["solo", "sync"])
@pytest.mark.parametrize("example", sorted(ex.EXAMPLES))
def test_example_runs_with_identical_replicas(example, mode, tmp_path):
    script = tmp_path / Path(example).name
    ex.prepare(Path(SOURCE) / example, script)
    result = ex.run(script, ex.EXAMPLES[example], 2, mode, timeout=600)
    assert result["returncode"] == 0, result["tail"]
    assert len(result["reports"]) == 2, result["tail"]
    for rank, reports in result["reports"].items():
        assert reports and all(r["identical"] for r in reports), (rank, reports)
