"""docs/horovod-tensorflow.md lists every public name of Horovod 0.28.1's
``horovod.tensorflow`` and ``horovod.tensorflow.keras`` (and its callbacks);
names marked supported or differs must exist in hvd_partial's modules, names
marked not supported must not."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
pytest.importorskip("tensorflow")
pytest.importorskip("keras")

import hvd_partial.tensorflow as hvd_tf  # noqa: E402
import hvd_partial.tensorflow.keras as hvd_tfk  # noqa: E402
import hvd_partial.tensorflow.keras.callbacks as hvd_callbacks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The public names of Horovod 0.28.1's modules (its __init__.py, without the
# modules and helpers it imports for itself: os, tf, version, warnings, ...).
HOROVOD_TF = """Adasum Average BroadcastGlobalVariablesHook Compression DistributedGradientTape DistributedOptimizer
LocalGradientAggregationHelper Max Min PartialDistributedGradientTape ProcessSet Product Sum SyncBatchNormalization
add_process_set allgather allgather_object allreduce alltoall broadcast broadcast_ broadcast_global_variables
broadcast_object broadcast_object_fn broadcast_variables ccl_built check_num_rank_power_of_2 cross_rank cross_size
cuda_built ddl_built elastic global_process_set gloo_built gloo_enabled grouped_allgather grouped_allreduce
grouped_reducescatter handle_average_backwards_compatibility init is_homogeneous is_initialized join local_rank
local_rank_op local_size local_size_op mpi_built mpi_enabled mpi_threads_supported nccl_built
process_set_included_op rank rank_op reducescatter refs_to_vars remove_process_set rocm_built shutdown size size_op
start_timeline stop_timeline vars_to_refs""".split()
HOROVOD_KERAS = """Average Compression DistributedOptimizer ProcessSet Sum add_process_set allgather allreduce broadcast
broadcast_global_variables callbacks ccl_built cross_rank cross_size cuda_built ddl_built elastic global_process_set
gloo_built gloo_enabled init is_initialized load_model local_rank local_size mpi_built mpi_enabled
mpi_threads_supported nccl_built rank reducescatter remove_process_set rocm_built shutdown size start_timeline
stop_timeline""".split()
HOROVOD_CALLBACKS = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback",
                     "LearningRateWarmupCallback", "MetricAverageCallback"]


def _tables() -> dict:
    text = open(os.path.join(ROOT, "docs", "horovod-tensorflow.md")).read()
    sections = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title = part.splitlines()[0]
        rows = re.findall(r"^\| `([^`]+)` \| (supported|differs|not supported) \|", part, flags=re.M)
        sections[title] = dict(rows)
    return sections


@pytest.mark.parametrize("section, module, names", [
    ("`horovod.tensorflow` →", hvd_tf, HOROVOD_TF),
    ("`horovod.tensorflow.keras` →", hvd_tfk, HOROVOD_KERAS),
    ("`horovod.tensorflow.keras.callbacks` →", hvd_callbacks, HOROVOD_CALLBACKS),
])
def test_compatibility_page_matches_the_modules(section, module, names):
    tables = _tables()
    table = next(rows for title, rows in tables.items() if title.startswith(section))
    assert sorted(table) == sorted(names)
    for name, status in table.items():
        if status == "not supported":
            assert not hasattr(module, name), f"{name} exists but the page says not supported"
        else:
            assert hasattr(module, name), f"{name} is marked {status} but {module.__name__} lacks it"


def test_the_counts_in_the_issue_hold():
    assert len(HOROVOD_TF) == 64 and len(HOROVOD_KERAS) == 37


def test_every_test_of_horovods_tensorflow_files_that_does_not_pass_is_on_the_page():
    import importlib.util

    spec = importlib.util.spec_from_file_location("horovod_tests", os.path.join(ROOT, "benchmarks", "horovod_tests.py"))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    with open(os.path.join(ROOT, "docs", "horovod-tensorflow.md")) as fh:
        page = fh.read()
    assert runner.NOT_PASSING_TENSORFLOW and runner.NOT_PASSING_KERAS
    for table in (runner.NOT_PASSING_TENSORFLOW, runner.NOT_PASSING_KERAS, runner.NOT_PASSING_TENSORFLOW_SETS,
                  runner.NOT_PASSING_KERAS_SETS):
        assert all(reason for reason in table.values())
        missing = [name for name in table if f"\n| {name} |" not in page]
        assert not missing, f"docs/horovod-tensorflow.md does not list {missing}"
