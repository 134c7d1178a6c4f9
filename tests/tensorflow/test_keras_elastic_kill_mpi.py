"""Horovod's elastic API with Keras 3 ``model.fit`` through a real kill:
examples/elastic/keras_elastic.py (``KerasState``, ``@hvd.elastic.run``
around ``model.fit`` with ``UpdateEpochStateCallback``,
``UpdateBatchStateCallback``, ``CommitStateCallback``) under
``hvd-partial-run --elastic -np 4`` (Open MPI 5 with ULFM; elsewhere it
skips), one rank SIGKILLed after its 7th batch (two batches after a commit).

The survivors must end with the world shrunk to 3 and the victim named, one
reset each (the callback saw size 3), every epoch done and bitwise identical
weights. What it does not check: which batches were trained. Keras 3's
``fit`` ignores the ``steps`` that ``UpdateBatchStateCallback`` sets, so the
epoch of the kill is run again in full after the reset (up to
``steps_per_epoch`` extra batches), and the data set is not re-sharded (each
rank draws from the whole repeated data set, as in Horovod's example).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from launch.procs import assert_no_leftovers, token  # noqa: E402
from mpi_run import ROOT, run_job  # noqa: E402
from mpi_run import no_ulfm_launcher  # noqa: E402

pytestmark = pytest.mark.mpi


def test_keras_fit_survives_a_kill():
    reason = no_ulfm_launcher()
    if reason:
        pytest.skip(reason)
    word = token()
    out_dir = tempfile.mkdtemp(prefix=f"{word}-")
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "4", sys.executable,
           str(ROOT / "examples" / "elastic" / "keras_elastic.py"), "--epochs", "3", "--steps-per-epoch", "12",
           "--kill-rank", "1", "--kill-at-batch", "7", "--report", out_dir]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        code, stdout, stderr, timed_out = run_job(cmd, env, 400)
        reports = {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(out_dir).glob("rank*.json")}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    output = (stdout + stderr)[-6000:]
    assert not timed_out, output
    assert_no_leftovers(word)
    assert sorted(reports) == [0, 2, 3], output
    assert code == 0, output
    assert "3 of 4 ranks finished; lost rank 1" in output, output
    for rank, rep in reports.items():
        assert rep["world"] == {"version": 1, "size": 3, "lost": [1], "original_rank": rank}
        assert rep["resets"] == [3] and rep["epoch"] == 3 and rep["size"] == 3
    assert len({rep["fingerprint"] for rep in reports.values()}) == 1, reports
