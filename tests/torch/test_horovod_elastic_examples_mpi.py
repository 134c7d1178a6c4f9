"""Horovod's PyTorch elastic examples (examples/elastic/pytorch/ of a Horovod
checkout in ``HOROVOD_SOURCE``; skipped without one, and without Open MPI's
ULFM) with only their import line changed, under ``hvd-partial-run --elastic
-np 3``, rank 1 ending by ``os._exit`` at its 4th launched round (a named
fault point of hvd_partial, no timing): the job exits 0, the launcher names
rank 1 lost, and the two survivors end with bitwise identical models and
optimizer states and the same round counter (tests/horovod_elastic_examples.py,
tests/workers/horovod_elastic.py for the stand-ins of torchvision and the data).

With ``--max-np 3`` (the mnist example, solo and sync) the survivors start a
new rank at a later commit: it joins, receives the model and the optimizer
(with its round counter) at ``state.sync()``, and ends alike too.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from horovod_elastic_examples import SOURCE, check_finished_alike, example_path, run_example  # noqa: E402

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not (SOURCE / "examples" / "elastic").is_dir(),
                                 reason="HOROVOD_SOURCE does not point to a Horovod checkout")]

KILL = "1:round_launched:4"  # rank 1 (as numbered at init) at its 4th launched round

EXAMPLES = {
    "pytorch/pytorch_mnist_elastic.py": ["--batch-size", "8", "--epochs", "2", "--log-interval", "100"],
    "pytorch/pytorch_synthetic_benchmark_elastic.py": [
        "--batch-size", "2", "--num-warmup-batches", "2", "--num-batches-per-iter", "2", "--num-iters", "4",
        "--no-cuda"],
    "pytorch/pytorch_imagenet_resnet50_elastic.py": [
        "--epochs", "2", "--batch-size", "4", "--val-batch-size", "8", "--warmup-epochs", "1.5",
        "--batches-per-commit", "2", "--batches-per-host-check", "1", "--no-cuda"],
}


def check_counters(reports: dict) -> None:
    """Every rank's optimizer counted the same rounds and applied the same updates."""
    for rep in reports.values():
        assert len({tuple(c) for c in rep["counters_everywhere"]}) == 1, rep["counters_everywhere"]
    assert len({(rep["rounds"], rep["updates"]) for rep in reports.values()}) == 1, reports


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_horovod_elastic_example_finishes_on_the_survivors(ulfm, example):
    assert example_path(example).is_file()
    code, output, reports = run_example(example, EXAMPLES[example], nprocs=3, kill=KILL, timeout=400)
    check_finished_alike(code, output, reports, nprocs=3, victim=1)
    check_counters(reports)
    for rep in reports.values():
        assert rep["size"] == 2 and rep["version"] == 1, rep


@pytest.mark.parametrize("mode", ["solo", "sync"])
def test_a_grown_rank_takes_the_optimizer_and_its_round_counter(ulfm, mode):
    example = "pytorch/pytorch_mnist_elastic.py"
    code, output, reports = run_example(example, EXAMPLES[example], nprocs=3, kill=KILL, max_np=3, mode=mode,
                                        timeout=400)
    check_finished_alike(code, output, reports, nprocs=3, victim=1, started=(3,))
    check_counters(reports)
    for rep in reports.values():
        assert rep["mode"] == mode and rep["size"] == 3 and rep["version"] == 2, rep
        assert rep["lr"] == pytest.approx(0.01 * 3), rep  # the example's reset callback ran for the grown world
