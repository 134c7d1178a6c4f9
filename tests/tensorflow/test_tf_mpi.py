"""The TensorFlow / Keras adapter in real multi-process runs (mpiexec).

Each worker runs several scenarios in one job (TensorFlow takes seconds to
import on every rank); the tests below assert on what every rank reported.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import ROOT, run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi

PARTIAL_MODES = ("solo", "majority")
TAU = 2  # max_staleness of the conservation scenario (tests/workers/tf_partial.py)


def same_on_all_ranks(results, get):
    values = [get(results[r]) for r in sorted(results)]
    assert all(v == values[0] for v in values), values
    return values[0]


# -- sync mode -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def sync_run():
    # 256 bytes cut the model into two buckets, posted during the backward pass (overlap_backward).
    return run_mpi("tf_sync.py", 3, timeout=180, env={"HVD_PARTIAL_FUSION_THRESHOLD_BYTES": "256"}).results


@pytest.mark.parametrize("case", ["sgd", "adam", "bpps", "tape"])
def test_sync_equals_one_process_on_the_concatenated_batches(sync_run, case):
    for rank, res in sync_run.items():
        part = res[case]
        assert part["diff"] < 2e-5, (rank, case, part["diff"])
        assert part["iters"] == part["ref_iters"], (rank, case)
    same_on_all_ranks(sync_run, lambda r: r[case]["digest"])
    if case == "sgd":
        assert sync_run[0]["sgd"]["moved"] > 0.1  # training changed the weights: the comparison means something
        assert sync_run[0]["sgd"]["buckets"] == 2
    if case == "tape":
        assert sync_run[0]["tape"]["flush_updates"] == 0  # sync leaves nothing behind


# -- solo and majority with injected delays ----------------------------------------------

@pytest.fixture(scope="module")
def partial_run():
    return run_mpi("tf_partial.py", 4, ",".join(PARTIAL_MODES), timeout=240).results


@pytest.mark.parametrize("mode", PARTIAL_MODES)
@pytest.mark.parametrize("scenario", ["conservation", "accumulated"])  # accumulated: backward_passes_per_step=3
def test_fit_conserves_every_gradient_and_bounds_staleness(partial_run, mode, scenario):
    for rank, res in partial_run.items():
        part = res[mode][scenario]
        # Weights = -(sum of every one-hot posted by every rank), exactly: nothing lost, nothing twice.
        assert part["weights"] == [float(v) for v in part["expected"]], rank
        assert part["stats"]["max_staleness_seen"] <= TAU, part["stats"]
        assert part["iterations"] <= part["rounds"]
    same_on_all_ranks(partial_run, lambda r: r[mode][scenario]["iterations"])
    same_on_all_ranks(partial_run, lambda r: r[mode][scenario]["stats"]["fresh"])
    same_on_all_ranks(partial_run, lambda r: r[mode][scenario]["stats"]["stale"])


@pytest.mark.parametrize("mode", PARTIAL_MODES)
def test_fit_keeps_weights_and_optimizer_state_identical(partial_run, mode):
    same_on_all_ranks(partial_run, lambda r: r[mode]["fit"]["digest"])
    epochs = same_on_all_ranks(partial_run, lambda r: r[mode]["fit"]["epoch_digests"])
    assert len(epochs) == len(set(epochs)) == 2  # checked after every epoch's flush, and training moved on
    same_on_all_ranks(partial_run, lambda r: r[mode]["fit"]["iterations"])
    history = same_on_all_ranks(partial_run, lambda r: r[mode]["fit"]["history"])  # MetricAverageCallback
    assert history["val_accuracy"][-1] > 0.5  # 3 classes: it learned (the trajectory depends on timing)


@pytest.mark.parametrize("mode", PARTIAL_MODES)
@pytest.mark.parametrize("loop", ["optimizer", "tape"])
def test_custom_loops_keep_replicas_identical(partial_run, mode, loop):
    same_on_all_ranks(partial_run, lambda r: r[mode]["loops"][loop]["digest"])
    same_on_all_ranks(partial_run, lambda r: r[mode]["loops"][loop]["iterations"])


# -- callbacks, saving, eager loops, sparse gradients -------------------------------------

@pytest.fixture(scope="module")
def features_run(tmp_path_factory):
    return run_mpi("tf_features.py", 2, tmp_path_factory.mktemp("tf_features"), timeout=180).results


def test_metric_average_and_identical_weights_after_fit(features_run):
    # The warm-up's "lr" is each rank's own rate (as in Horovod); the metrics are averaged.
    same_on_all_ranks(features_run, lambda r: {k: v for k, v in r["fit"]["history"].items() if k != "lr"})
    same_on_all_ranks(features_run, lambda r: r["fit"]["digest"])


def test_learning_rate_warmup_follows_the_round_count(features_run):
    lr, warmup, size = 0.05, 8, len(features_run)
    start = 1.0 / size
    for rank, res in features_run.items():
        rates = res["fit"]["rates"]
        assert rates, rank
        done = False
        for updates, rate in rates:  # the rank's own rate, set from the updates applied before the batch
            expected = lr if done else lr * (start + (1 - start) * min(updates, warmup) / warmup)
            assert rate == pytest.approx(expected, rel=1e-6), (rank, updates)
            done = done or updates >= warmup
        assert done and rates[-1][1] == pytest.approx(lr)


def test_participation_report_per_epoch(features_run):
    for res in features_run.values():
        history = res["fit"]["participation"]
        assert [h["epoch"] for h in history] == [0, 1]
        for h in history:
            assert h["rounds"] > 0 and h["rounds_per_s"] > 0
            assert len(h["fresh"]) == len(h["stale"]) == len(features_run)
            assert sum(h["fresh"]) > 0


def test_save_and_load_round_trip(features_run):
    for res in features_run.values():
        loaded = res["fit"]["loaded"]
        assert loaded["type"] == "DistributedOptimizer" and loaded["inner"] == "Adam"
        assert loaded["mode"] == "Solo()"
        assert loaded["digest"] == res["fit"]["digest"]  # weights and optimizer state as saved
        assert loaded["iterations"] == res["fit"]["iterations"]
        assert loaded["after_fit_iterations"] > loaded["iterations"]
    same_on_all_ranks(features_run, lambda r: r["fit"]["loaded"]["after_fit"])


def test_h5_and_tf_checkpoint_keep_the_wrapped_optimizers_state(features_run):
    for res in features_run.values():
        assert res["fit"]["h5"]["type"] == "DistributedOptimizer"
        assert res["fit"]["h5"]["iterations"] == res["fit"]["iterations"] > 0
        assert res["fit"]["h5"]["digest"] == res["fit"]["digest"]  # weights, iterations, Adam moments
        assert res["fit"]["h5"]["after_fit_iterations"] > res["fit"]["iterations"]
        assert res["fit"]["checkpoint"] == {"digest": res["fit"]["digest"], "iterations": res["fit"]["iterations"]}
    same_on_all_ranks(features_run, lambda r: r["fit"]["h5"]["after_fit"])


def test_load_model_helper_wraps_and_overrides(features_run):
    for res in features_run.values():
        helper = res["fit"]["helper"]
        assert helper["type"] == "DistributedOptimizer"
        assert helper["mode"] == "Majority(seed=3, quorum=1)"
        assert helper["same_state"]  # the plain optimizer's saved state survived the wrapping
        assert helper["retuned_mode"] == "Majority(seed=4, quorum=None)"
        assert helper["retuned_stream"] == "keras.reloaded_adam"
    same_on_all_ranks(features_run, lambda r: r["fit"]["helper"]["after_fit"])


def test_eager_custom_loop_with_uneven_steps(features_run):
    same_on_all_ranks(features_run, lambda r: r["eager"]["digest"])
    same_on_all_ranks(features_run, lambda r: r["eager"]["iterations"])


def test_sparse_gradients_rejected_or_densified(features_run):
    for rank, res in features_run.items():
        assert res["sparse"]["rejected"] and "sparse_as_dense=True" in res["sparse"]["rejected"]
        assert f"rank {rank}" in res["sparse"]["rejected"]
        assert "already reduced" in res["tape_gradient_solo"]
    same_on_all_ranks(features_run, lambda r: r["sparse"]["dense_digest"])


def test_fit_runs_a_model_compiled_with_jit_compile(features_run):
    for res in features_run.values():
        assert res["jit"]["requested"]  # XLA was on; the post cannot be compiled by it
        assert res["jit"]["iterations"] > 0
    same_on_all_ranks(features_run, lambda r: r["jit"]["digest"])


def test_fit_with_several_steps_per_execution(features_run):
    for res in features_run.values():
        assert res["jit"]["multi_step"]["posts"] == 8  # 32 rows per rank, batch 4: one post per step
    same_on_all_ranks(features_run, lambda r: r["jit"]["multi_step"]["digest"])
    same_on_all_ranks(features_run, lambda r: r["jit"]["multi_step"]["iterations"])


# -- a mismatched model -------------------------------------------------------------------

def test_mismatched_model_fails_clearly_on_every_rank():
    res = run_mpi("tf_mismatch.py", 2, timeout=150)  # a hang fails here, naming the rank
    for rank, out in res.results.items():
        for case in ("broadcast", "fit", "eager"):
            failure = out[case]
            assert failure is not None, (rank, case)
            assert failure["type"] == "MismatchError" and failure["is_hvd"], (rank, case, failure)
            assert f"rank {rank}" in failure["message"]
        assert "(16, 13)" in out["fit"]["message"] and "(16, 12)" in out["fit"]["message"]
        # Inside a user's tf.function TensorFlow wraps the error; its text keeps ours.
        assert out["graph"] is not None and "MismatchError" in out["graph"]["message"]
        assert "ranks disagree on stream 'keras.graph_loop'" in out["graph"]["message"]


def test_a_rank_dying_in_fit_fails_the_others_naming_it():
    res = run_mpi("tf_rank_failure.py", 3, timeout=150, expect_success=False, keep_survivors=True)
    assert res.returncode != 0  # rank 2 died
    assert sorted(res.results) == [0, 1], res.tail()  # the survivors reported instead of hanging
    for rank, out in res.results.items():
        # Raised inside the compiled train step, out of fit as hvd_partial's own exception.
        assert out["error"] == "RankFailedError" and out["is_hvd"], (rank, out)
        assert "rank 2 failed" in out["message"] and "injected failure" in out["message"]


# -- the example ------------------------------------------------------------------------------

def test_keras_straggler_example_runs_and_checks_itself():
    res = run_mpi(str(ROOT / "examples" / "keras_straggler.py"), 4, "--mode", "solo", "--epochs", "2",
                  "--straggler", "persistent", "--delay", "0.02", timeout=180, require_reports=False)
    assert "identical on all ranks" in res.stdout
    summary = [line for line in res.stdout.splitlines() if line.startswith("solo ")]
    assert summary and summary[-1].rstrip().endswith("yes"), res.stdout
