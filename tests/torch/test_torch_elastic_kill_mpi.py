"""Horovod's elastic API with PyTorch through a real kill: ``hvd-partial-run
--elastic -np 4`` (Open MPI 5 with ULFM; elsewhere these tests skip, as
tests/engine/test_elastic_mpi.py does), one rank of 4 killed (Open MPI 5.0's
launcher ends the job once half its processes died).

The worker (tests/workers/elastic_torch.py ``train``) is Horovod's elastic
MNIST loop on synthetic data: ``TorchState`` (model, ``DistributedOptimizer``,
``ElasticSampler``, epoch, batch), ``@hvd.elastic.run``, a commit every 3
batches, a metric ``hvd.allreduce`` per epoch, a reset callback that rescales
the learning rate by ``hvd.size()``. The victim dies by SIGKILL right after its
C-th commit, or by ``os._exit`` at a named point of hvd_partial's code
(:mod:`hvd_partial.faults`): no timing orders anything.

What every survivor must show: the world shrank to 3 with the victim named,
one reset (the callback ran once, with size 3), bitwise identical model and
optimizer state at the end, and, per epoch, every sample trained and kept
(the samples a restore rolled back do not count) by the survivors: each
exactly once in every epoch begun after the reset; in the epoch of the kill
none is missing and at most ``size - 1`` are repeated (the padding of the
re-deal over 3 ranks). The samples the victim trained in that epoch are not
known to the survivors (they are gathered at ``sync()``, which runs at the
start of ``run`` and after each reset) and are trained again by them.

Also examples/elastic/pytorch_elastic.py, the shape of Horovod's
pytorch_mnist_elastic.py, through the same kind of kill.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from launch.procs import assert_no_leftovers, token  # noqa: E402
from mpi_run import ROOT, WORKERS, run_job  # noqa: E402

pytestmark = pytest.mark.mpi

SAMPLES, EPOCHS, NPROCS = 96, 2, 4



def launch_elastic(script: Path, *args, nprocs=NPROCS, timeout=180, env=None):
    """``hvd-partial-run --elastic -np N python script args``, ``{out}`` in
    ``args`` replaced by the folder the ranks report to (its name, on the
    command line, finds processes left behind); returns (exit status,
    output, rank -> report)."""
    word = token()
    out_dir = tempfile.mkdtemp(prefix=f"{word}-")
    cmd = [sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", str(nprocs),
           sys.executable, str(script), *(str(a).replace("{out}", out_dir) for a in args)]
    full_env = dict(os.environ, HVD_TEST_OUT=out_dir, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", PYTHONUNBUFFERED="1",
                    **(env or {}))
    try:
        code, stdout, stderr, timed_out = run_job(cmd, full_env, timeout)
        reports = {}
        for rank in range(nprocs):
            path = Path(out_dir, f"rank{rank}.json")
            if path.exists():
                reports[rank] = json.loads(path.read_text())
        phases = {p.name: p.read_text() for p in Path(out_dir).glob("*.phase")}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    output = stdout + stderr
    assert not timed_out, f"timed out after {timeout} s; phases {phases}\n{output[-6000:]}"
    assert_no_leftovers(word)
    return code, output, reports


def same(reports, key):
    values = {rank: rep[key] for rank, rep in reports.items()}
    assert len({repr(v) for v in values.values()}) == 1, values
    return next(iter(values.values()))


def check_survivors(code, output, reports, victim, size=NPROCS):
    survivors = sorted(set(range(size)) - {victim})
    assert sorted(reports) == survivors, output[-6000:]
    assert code == 0, output[-6000:]  # the launcher: no rank failed, enough finished
    assert f"{size - 1} of {size} ranks finished; lost rank {victim}" in output, output[-3000:]
    for rank, rep in reports.items():
        assert rep["world"] == {"version": 1, "size": size - 1, "lost": [victim], "original_rank": rank}, rep["world"]
    assert same(reports, "size") == size - 1
    same(reports, "fingerprint")  # bitwise identical replicas


def check_epochs(reports, kill_epoch: int, survivors=NPROCS - 1):
    """Each sample of each epoch trained (and kept) once across the survivors;
    in the epoch of the kill, none missing and at most survivors - 1 repeated."""
    for epoch in range(EPOCHS):
        counts = collections.Counter(i for rep in reports.values() for i in rep["trained"].get(str(epoch), []))
        assert set(counts) == set(range(SAMPLES)), f"epoch {epoch}: missing {sorted(set(range(SAMPLES)) - set(counts))}"
        repeated = sum(c - 1 for c in counts.values())
        if epoch > kill_epoch:
            assert repeated == 0, f"epoch {epoch}: repeated {[i for i, c in counts.items() if c > 1]}"
        else:
            assert repeated <= survivors - 1, f"epoch {epoch}: repeated {[i for i, c in counts.items() if c > 1]}"


CASES = {  # id: (mode, victim, kill arguments)
    "solo-sigkill-after-commit-1": ("solo", 1, ["--kill-at-commit", "1"]),
    "sync-sigkill-after-commit-1": ("sync", 2, ["--kill-at-commit", "1"]),
    "solo-exit-in-a-post": ("solo", 3, ["--kill-point", "post_submitted", "--kill-count", "4"]),
    "solo-rank0-exit-in-a-round": ("solo", 0, ["--kill-point", "round_launched", "--kill-count", "5"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_survivors_of_a_kill_finish_every_epoch_alike(ulfm, case):
    mode, victim, kill = CASES[case]
    code, output, reports = launch_elastic(WORKERS / "elastic_torch.py", "train", "--mode", mode,
                                           "--kill-rank", victim, *kill, "--token", "{out}")
    check_survivors(code, output, reports, victim)
    resets = same(reports, "resets")
    assert [r["size"] for r in resets] == [3] and [r["version"] for r in resets] == [1]  # the callback ran once
    assert same(reports, "lr") == pytest.approx(0.01 * 3)
    check_epochs(reports, kill_epoch=0)


def test_horovod_shaped_example_survives_a_kill(ulfm):
    example = ROOT / "examples" / "elastic" / "pytorch_elastic.py"
    code, output, reports = launch_elastic(example, "--epochs", "3", "--samples", "384", "--report", "{out}",
                                           "--kill-rank", "2", "--kill-at-batch", "5")
    check_survivors(code, output, reports, victim=2)
    assert same(reports, "resets") == [3]
    assert same(reports, "epoch") == 3
