"""Process sets in hvd_partial.tensorflow and hvd_partial.keras on 4 ranks
(evens [0, 2] and odds [1, 3], added by hvd.init(process_sets=...)):
collectives and their gradients among a set (eagerly, in tf.function and in a
TF1-style graph), the process-set ops, the errors of a rank outside a set,
DistributedGradientTape and DistributedOptimizer on a set (sync by default;
solo and majority on the set's own engine), and the Keras PartialDistributedOptimizer
(tests/workers/tf_process_sets.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from mpi_run import run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
SIZE = 4


def _members(r):
    return [m for m in range(SIZE) if m % 2 == r % 2]


@pytest.fixture(scope="module")
def run():
    return run_mpi("tf_process_sets.py", SIZE, timeout=300).results


def test_collectives_run_among_the_set(run):
    for r, res in run.items():
        ms = _members(r)
        c = res["collectives"]
        assert res["ids"] == [1, 2]
        assert c["allreduce"] == [float(sum(ms)), 2.0] and c["average"] == [sum(ms) / 2, 1.0]
        assert c["grouped"] == [[float(sum(ms)), 2.0], [[float(sum(ms))]]]
        assert c["allgather"] == [m for m in ms for _ in range(m + 1)]
        assert c["grouped_allgather"] == [ms, [[m, m] for m in ms]]
        assert c["broadcast"] == [10 * ms[-1]] and c["broadcast_"] == [float(ms[-1])]
        me = ms.index(r)
        assert c["alltoall"] == [[me + 100 * m for m in ms], [1, 1]]
        assert c["reducescatter"] == [[float(sum(ms))]] * 2
        assert c["grouped_reducescatter"] == [[float(sum(ms))], [[2.0, 2.0]]]
        assert c["broadcast_variables"] == [float(ms[0])] * 2
        assert c["object"] == {"from": ms[-1]} and c["object_fn"] == ms[0] and c["objects"] == ms
        assert c["size_op"] == [2, 2, SIZE] and c["included_op"] == [1, 0]
        assert c["size_op_unknown"][0] == "ProcessSetError" and "17" in c["size_op_unknown"][1]
        assert c["function"] == [[float(ms[-1]), 1.0], [v for m in ms for v in (float(m), 1.0)]]
        assert c["graph"] == [float(sum(ms))]


def test_gradients_are_reduced_within_the_set(run):
    for r, res in run.items():
        ms = _members(r)
        g = res["gradients"]
        assert g["allreduce"] == [2.0] * 4 and g["graph_allreduce"] == [2.0] * 2  # Sum over 2 members
        assert g["allgather"] == [1.0] * 4  # the set's average of ones, this rank's rows
        assert g["broadcast"] == [1.0 if r == ms[0] else 0.0] * 4
        assert g["reducescatter"] == [2.0] * 4
        # rows 2i, 2i+1 went to member i, whose upstream gradient there is [2*me, 2*me+1] + 10 * i's rank
        me = ms.index(r)
        assert g["alltoall"] == [v + 10 * m for m in ms for v in (2.0 * me, 2.0 * me + 1)]


def test_a_rank_outside_the_set_gets_horovods_errors(run):
    for r, res in run.items():
        o = res["outside"]
        for where in ("eager", "function", "graph"):
            assert o[where][0] == "InvalidArgumentError", (r, where, o[where])
            assert "is not in ProcessSet" in o[where][1] and f"rank {r}" in o[where][1]
        assert o["fake"][0] == "ProcessSetError" and "never added" in o["fake"][1]  # a ValueError


def _posted(ranks) -> float:
    """Minus every post of ``ranks`` (rank + 1 times step + 1, 5 steps) summed."""
    return -sum((m + 1.0) * (s + 1) for m in ranks for s in range(5))


def test_solo_and_majority_run_on_the_set_engine(run):
    for label in ("solo", "majority"):
        for r, res in run.items():
            ms = _members(r)
            set_id = 1 if r % 2 == 0 else 2
            got = res["set_modes"][label]
            peer = run[[m for m in ms if m != r][0]]["set_modes"][label]
            k, t = got["keras"], got["tape"]
            assert k["mode"].startswith("Solo" if label == "solo" else "Majority")
            # every member's every post in exactly one round (op=Sum, SGD(1.0) from zero), once
            assert k["weight"] == [_posted(ms)] * 3, (label, r, k["weight"])
            assert t["weight"] == [_posted(ms)] * 2, (label, r, t["weight"])
            assert k["bits"] == peer["keras"]["bits"] and t["bits"] == peer["tape"]["bits"]  # the set's replicas
            assert k["rounds"] == peer["keras"]["rounds"]
            # Keras numbers optimizer names (distributed_sgd_3); the set engine numbers its unnamed streams
            assert k["name"].startswith("keras.distributed_sgd") and k["name"] == peer["keras"]["name"]
            assert k["name"].endswith(f".set{set_id}.{0 if label == 'solo' else 1}")
            base = f"tensorflow.DistributedGradientTape.set{set_id}"
            assert t["name"] == (base if label == "solo" else base + ".2")
            assert k["stats_ranks"] == 2 and k["contributions"] > 0  # the set's engine: a world of two ranks
            # an optimizer on evens: its members reduce among them, odd ranks step alone
            e = got["evens"]
            assert e["name"] == f"keras.on_evens_{label}"
            assert e["weight"] == [_posted([0, 2] if r % 2 == 0 else [r])], (label, r, e["weight"])
        assert len({res["set_modes"][label]["keras"]["bits"] for res in run.values()}) == 2  # the sets differ
    for r, res in run.items():  # model.fit's epoch flush among the set's members
        peer = run[[m for m in _members(r) if m != r][0]]["set_modes"]["fit"]
        assert res["set_modes"]["fit"]["bits"] == peer["bits"] and res["set_modes"]["fit"]["updates"] > 0
    assert len({res["set_modes"]["fit"]["bits"] for res in run.values()}) == 2


def test_tape_and_keras_optimizer_on_a_set_are_synchronous(run):
    for r, res in run.items():
        ms = _members(r)
        s = res["sets"]
        assert s["tape_mode"] == s["optimizer_mode"] == "Sync()"
        assert s["tape"] == pytest.approx(2.0 * sum(ms) / 2)  # d(x*x)/dx = 2x averaged over the set
        assert s["tape_function"] == [sum(m + 1.0 for m in ms) / 2] * 3
        # two SGD steps of rate 1 from zero with the set's average gradient (rank + 1)
        assert s["optimizer_weight"] == [-2 * sum(m + 1.0 for m in ms) / 2] * 3
        assert s["optimizer_flush"] == 0


def test_partial_distributed_optimizer_keeps_local_layers_local(run):
    for r, res in run.items():
        p = res["partial"]
        assert p["mode"] == "Sync()"
        assert p["max_diff"] < 1e-6  # local: own gradient / size; shared: the average over every rank
        assert p["local_kernel_differs"]
        assert p["fit_shared_equal"] and p["fit_local_differ"]  # model.fit's compiled step
        assert p["verify_local_shapes"] == [None, ""]  # local weights may differ in shape
        assert p["verify_plain"][0] == "MismatchError"
        assert p["solo"][0] == "NotSupportedError" and "Solo()" in p["solo"][1]
