"""Growing the elastic world back: how long it takes and how many bytes the
new rank receives.

Run from the repository root (as root also export OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), with any Python (the driver imports neither
MPI nor hvd_partial); the jobs run under ``--python``, by default the Open MPI
5 environment ``bash ci/test-openmpi`` makes (/tmp/hvd-partial-openmpi)::

    python benchmarks/elastic_grow.py --np 4 --runs 5 --floats 1000000

Each run is ``hvd-partial-run --elastic -np NP --max-np NP python
benchmarks/elastic_grow.py worker ...``: a numpy training loop in
``hvd.elastic.run`` (an ``ObjectState`` holding ``--floats`` float64 weights,
one post of ``--floats`` float64 per step to a solo stream, a flush and a
commit every 3 steps). Rank 1 dies by ``os._exit(1)`` at its 5th launched round
(:mod:`hvd_partial.faults`); the survivors grow the world back at a later
commit. Rank 0 reports:

- ``grow``: from the decision (the grow's first step on rank 0) to the first
  round rank 0 completes with the new rank's contribution in it, and its
  parts: ``check`` (comparing streams), ``stop`` (the engine's shutdown),
  ``spawn`` (Spawn and Merge: starting a Python process that imports numpy,
  mpi4py and hvd_partial), ``start`` (handshake, new engine), then ``sync``
  (the reset and ``state.sync()``: the state broadcast) and the first round;
- bytes sent to the new rank: the handshake (pickled) and the state that
  ``sync()`` broadcasts (the pickled saved values).

Medians over ``--runs`` runs are printed, with every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(out_dir: str, floats: int, steps: int) -> None:
    import numpy as np

    import hvd_partial as hvd
    from hvd_partial import faults
    from hvd_partial.elastic import ObjectState, run
    from hvd_partial.engine.growth import history

    hvd.init()
    me = hvd.world()
    if me.original_rank == 1 and me.original_rank not in me.joined:
        faults.at("round_launched", lambda n: n >= 5 and os._exit(1))
    state = ObjectState(weights=np.zeros(floats), step=0)
    marks: dict = {}

    def apply(results):
        world = hvd.world()
        for result in results:
            state.weights += result.array
            if (world.joined and result.world_version == world.version and world.size - 1 in result.contributors
                    and "first_round" not in marks):
                marks["first_round"] = time.perf_counter()

    def synced():
        if hvd.world().joined and "synced" not in marks:
            marks["synced"] = time.perf_counter()

    @run
    def train(state):
        synced()
        while state.step < steps:
            apply(hvd.partial_allreduce(np.ones(floats), "grads", mode=hvd.Solo(), op=hvd.Sum))
            state.step += 1
            if state.step % 3 == 0:
                apply(hvd.flush("grads"))
                state.commit()
        apply(hvd.flush("grads"))

    train(state)
    if hvd.rank() == 0 and history():
        grow = history()[0]
        report = {"parts": grow.seconds, "handshake_bytes": grow.handshake_bytes,
                  "state_bytes": len(pickle.dumps({"weights": state.weights, "step": state.step},
                                                  protocol=pickle.HIGHEST_PROTOCOL)),
                  "grow": marks["first_round"] - grow.began, "to_sync_done": marks["synced"] - grow.began}
        with open(os.path.join(out_dir, "grow.json"), "w") as fh:
            json.dump(report, fh)
    hvd.shutdown()
    sys.stdout.flush()
    os._exit(0)


def one_run(args, index: int) -> dict | None:
    out_dir = tempfile.mkdtemp(prefix="hvdp-grow-")
    cmd = [args.python, "-m", "hvd_partial.launch.cli", "--elastic", "-np", str(args.np), "--max-np", str(args.np),
           args.python, str(Path(__file__).resolve()), "worker", out_dir, str(args.floats), str(args.steps)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout,
                              start_new_session=True)
        path = Path(out_dir, "grow.json")
        if proc.returncode != 0 or not path.exists():
            print(f"run {index}: exit {proc.returncode}, no report\n{proc.stderr[-2000:]}")
            return None
        return json.loads(path.read_text())
    except subprocess.TimeoutExpired:
        print(f"run {index}: timed out after {args.timeout} s")
        return None
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--floats", type=int, default=1_000_000, help="float64 weights in the state")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--python", default="/tmp/hvd-partial-openmpi/bin/python")
    args = parser.parse_args()
    runs = []
    for index in range(args.runs):
        report = one_run(args, index)
        if report is not None:
            runs.append(report)
            parts = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in report["parts"].items())
            print(f"run {index}: grow {report['grow'] * 1e3:.0f} ms (to sync done {report['to_sync_done'] * 1e3:.0f}; "
                  f"{parts} ms); handshake {report['handshake_bytes']} B, state {report['state_bytes']} B", flush=True)
    if not runs:
        sys.exit("no run reported")

    def median(key, part=None):
        return statistics.median(r["parts"][part] if part else r[key] for r in runs) * 1e3

    print(f"np {args.np}, {args.floats} float64 weights, {len(runs)} of {args.runs} runs: median grow "
          f"{median('grow'):.0f} ms (check {median(None, 'check'):.0f}, stop {median(None, 'stop'):.0f}, spawn "
          f"{median(None, 'spawn'):.0f}, start {median(None, 'start'):.0f}, to sync done "
          f"{median('to_sync_done'):.0f}); bytes to the new rank: handshake {runs[0]['handshake_bytes']}, state "
          f"{runs[0]['state_bytes']}")


if __name__ == "__main__":
    main()
