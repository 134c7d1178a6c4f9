#!/usr/bin/env bash
# GPU check of the torch adapter, for a machine with one CUDA GPU (about 5 minutes).
#
#   bash benchmarks/gpu_check.sh --prepare   # here, with the network: wheels into .gpu_wheels/
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#
# 1. CUDA tensors through DistributedOptimizer (sync, sync in buckets staged on a
#    side stream during backward, solo) and through every negotiated tensor
#    collective at 2 ranks sharing the GPU: results must equal the same runs on
#    CPU tensors (tests/workers/torch_cuda.py, tests/workers/torch_cuda_collectives.py).
# 2. Host-staging cost per step (benchmarks/gpu_staging.py): hvd_partial sync and
#    solo at 1 and 2 ranks against DDP over NCCL at world size 1 (NCCL refuses two
#    ranks on one GPU) and DDP over gloo with CUDA tensors at 2 ranks; sync in
#    16 MiB buckets with overlap on and off, with each bucket's copy time.
# Writes everything under ${OUT:-/tmp/gpu_check} and prints a summary; exit 1 on a
# failed check, 2 when the machine has no usable CUDA torch.
set -u
cd "$(dirname "$0")/.."
WHEELS=.gpu_wheels
if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$WHEELS"
    python -m pip download --only-binary :all: --no-deps -d "$WHEELS" "mpi4py>=4.1" mpich
    ls -la "$WHEELS"
    exit 0
fi
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python - <<'PY' || { echo "gpu_check: no CUDA-enabled torch here; install one, then rerun"; exit 2; }
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY
if ! python -c "import mpi4py, numpy" 2>/dev/null || ! command -v mpiexec >/dev/null; then
    python -m pip install --no-index --find-links "$WHEELS" mpi4py mpich || \
        { echo "gpu_check: mpi4py/mpich missing and not installable from $WHEELS (run --prepare first)"; exit 2; }
fi
export PYTHONPATH="$PWD:$PWD/tests:$PWD/tests/workers" PYTHONUNBUFFERED=1
FAILED=0

run_worker() {  # name script: 2 ranks, results in $OUT/name/rank*.json
    local dir="$OUT/$1"
    rm -rf "$dir"; mkdir -p "$dir"
    if ! HVD_TEST_OUT="$dir" timeout 150 mpiexec -n 2 python "$2" >"$dir/log.txt" 2>&1; then
        echo "FAIL $1 (exit $?):"; tail -20 "$dir/log.txt"; FAILED=1; return
    fi
    python - "$dir" "$1" <<'PY' || FAILED=1
import json, sys, glob
d, name = sys.argv[1], sys.argv[2]
reps = [json.load(open(f)) for f in sorted(glob.glob(d + "/rank*.json"))]
ok = len(reps) == 2
if name == "optimizer":
    for r in reps:
        ok &= r["sync_diff"] < 1e-5 and all(dev.startswith("cuda") for dev in r["grad_devices"])
        ok &= r["buckets_diff"] < 1e-5 and r["buckets"] > 1  # side-stream staging during backward
        ok &= r["allreduce"][0].startswith("cuda")
    ok &= reps[0]["solo_fp"] == reps[1]["solo_fp"]
else:
    for r in reps:
        for case, v in r.items():
            if not (v["equal"] and v["device"].startswith("cuda")):
                print("  mismatch:", case, v); ok = False
print(("PASS " if ok else "FAIL ") + name + ": " + json.dumps(reps[0])[:400])
sys.exit(0 if ok else 1)
PY
}

run_worker optimizer tests/workers/torch_cuda.py
run_worker collectives tests/workers/torch_cuda_collectives.py

echo "host staging, median step time (MLP 6 x 2048, batch 64):"
: >"$OUT/staging.jsonl"
for spec in "1 plain" "1 hvd_sync" "1 ddp_nccl" "2 hvd_sync" "2 hvd_sync --bucket-mb 16" \
            "2 hvd_sync --bucket-mb 16 --no-overlap" "2 hvd_solo" "2 ddp_gloo"; do
    set -- $spec
    n=$1 method=$2; shift 2
    if timeout 90 mpiexec -n "$n" python benchmarks/gpu_staging.py --method "$method" "$@" >>"$OUT/staging.jsonl" \
            2>"$OUT/staging-$n-$method$(echo "$@" | tr -d ' -').err"; then
        tail -1 "$OUT/staging.jsonl"
    else
        echo "  $method $* at $n rank(s) failed:"; tail -5 "$OUT/staging-$n-$method$(echo "$@" | tr -d ' -').err"
    fi
done
[ "$FAILED" = 0 ] && echo "gpu_check: all checks passed" || echo "gpu_check: some checks FAILED"
exit "$FAILED"
