"""Cost of the observer per call: stall inspector and report off, on (the
default), and with the timeline too. Each setting runs as its own job; the
settings are interleaved over several repetitions and medians compared,
since this machine is noisy.

Run::

    python benchmarks/observe_overhead.py            # launches the jobs itself
    # prints microseconds per call for 1 rank (sync) and 2 ranks (solo)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "observer off": {"HVD_PARTIAL_STALL_WARNING_SECONDS": "0", "HVD_PARTIAL_REPORT_SECONDS": "0"},
    "default (stall + report)": {},
    "default + timeline": {"HVD_PARTIAL_TIMELINE_FILENAME": "{tmp}/tl.json"},
}


def worker(calls: int) -> None:
    import numpy as np

    import hvd_partial as hvd

    hvd.init()
    mode = hvd.Sync() if hvd.size() == 1 else hvd.Solo()
    x = np.ones(1024, np.float32)
    for _ in range(200):
        hvd.partial_allreduce(x, "bench", mode=mode)
    started = time.perf_counter()
    for _ in range(calls):
        hvd.partial_allreduce(x, "bench", mode=mode)
    per_call = (time.perf_counter() - started) / calls
    if hvd.rank() == 0:
        print(json.dumps({"us_per_call": per_call * 1e6}))
    hvd.shutdown()


def main() -> None:
    from hvd_partial.launch import mpiexec_command

    calls, repeats = 3000, 5
    results = {(n, name): [] for n in (1, 2) for name in SETTINGS}
    for _ in range(repeats):
        for nprocs in (1, 2):
            for name, env in SETTINGS.items():
                with tempfile.TemporaryDirectory() as tmp:
                    full = dict(os.environ, **{k: v.format(tmp=tmp) for k, v in env.items()})
                    cmd = mpiexec_command(nprocs, [sys.executable, __file__, "--worker", str(calls)])
                    out = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, check=True)
                    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
                    results[(nprocs, name)].append(json.loads(line)["us_per_call"])
    for (nprocs, name), samples in results.items():
        print(f"{nprocs} rank(s), {name:<26} median {statistics.median(samples):7.1f} us/call "
              f"(samples {', '.join(f'{s:.0f}' for s in samples)})")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]))
    else:
        main()
