"""Run one of Horovod's PyTorch example scripts unchanged (its import already
switched to ``hvd_partial.torch``) and check the replicas afterwards.

Usage (under mpiexec): horovod_example.py SCRIPT [script arguments...]

Every ``DistributedOptimizer`` the script builds is recorded; when the script
returns, each is flushed (collective) and the ranks compare a digest of the
parameters and optimizer state. Prints one line per optimizer on rank 0 and
exits 1 if any replica differs. Reports to the test harness when
``HVD_TEST_OUT`` is set.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import sys

import hvd_partial.torch as hvd

_built = []
_Original = hvd.DistributedOptimizer


class _Recorded(_Original):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _built.append(self)


def _digest(optimizer) -> str:
    h = hashlib.sha256()
    for group in optimizer.param_groups:
        for p in group["params"]:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
            for value in optimizer.state.get(p, {}).values():
                if hasattr(value, "detach"):
                    h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    script, args = sys.argv[1], sys.argv[2:]
    hvd.DistributedOptimizer = _Recorded
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
    results = []
    for opt in _built:
        opt.flush()
        digests = hvd.allgather_object(_digest(opt))
        results.append({"stream": opt.name, "mode": opt.mode.kind, "rounds": opt.rounds,
                        "identical": len(set(digests)) == 1})
    if hvd.rank() == 0:
        for r in results:
            print(f"optimizer {r['stream']} ({r['mode']}): {r['rounds']} rounds, replicas "
                  f"{'identical' if r['identical'] else 'DIFFER'}", flush=True)
    if os.environ.get("HVD_TEST_OUT"):
        from workers.support import report

        report(results)
    return 0 if results and all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
