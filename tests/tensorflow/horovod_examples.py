"""Prepare Horovod's TensorFlow 2 and Keras examples for hvd_partial: copy
them from a Horovod checkout and change only their imports (plus what Keras 3
itself demands of any script), then run each under mpiexec through
tests/workers/tf_horovod_example.py.

Run::

    python tests/tensorflow/horovod_examples.py /path/to/horovod [--np 2] [--modes solo,sync]

The changes, all listed in EDITS: ``horovod.tensorflow[.keras]`` and
``horovod.keras`` become ``hvd_partial.tensorflow[.keras]``; ``import horovod``
becomes ``import hvd_partial as horovod`` (used only by the ``horovod.run``
branch, which is not taken); Keras 3: ``opt.variables()`` is a property,
``compile`` no longer takes ``experimental_run_tf_function``,
``keras.optimizers`` no longer take ``lr=``, ``fit_generator`` is ``fit``;
TensorFlow 2: the Keras examples' TF1 session set-up (``tf.ConfigProto``,
``K.set_session``) goes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "workers" / "tf_horovod_example.py"
if str(ROOT / "tests") not in sys.path:  # run as a script: the shared job runner lives in tests/
    sys.path.insert(0, str(ROOT / "tests"))
from mpi_run import run_job  # noqa: E402

#: (pattern, replacement, why)
EDITS = [
    (r"^import horovod\.tensorflow\.keras as hvd$", "import hvd_partial.tensorflow.keras as hvd", "import"),
    (r"^import horovod\.tensorflow as hvd$", "import hvd_partial.tensorflow as hvd", "import"),
    (r"^import horovod\.keras as hvd$", "import hvd_partial.keras as hvd", "import"),
    (r"^import horovod$", "import hvd_partial as horovod", "import"),
    (r"\.variables\(\)", ".variables", "Keras 3: Optimizer.variables is a property"),
    (r",\s*experimental_run_tf_function=False", "", "Keras 3: compile() has no experimental_run_tf_function"),
    (r"\blr=", "learning_rate=", "Keras 3: optimizers take learning_rate="),
    (r"\.fit_generator\(", ".fit(", "Keras 3: fit_generator is fit"),
    (r"\.evaluate_generator\(", ".evaluate(", "Keras 3: evaluate_generator is evaluate"),
    (r"^config = tf\.ConfigProto\(\)\n(config\.gpu_options\..*\n)*K\.set_session\(.*\)$", "",
     "TensorFlow 2: no tf.ConfigProto / Session (GPU pinning of TF1)"),
]

#: example -> arguments that keep it small on a CPU
EXAMPLES = {
    "examples/tensorflow2/tensorflow2_mnist.py": [],
    "examples/tensorflow2/tensorflow2_keras_mnist.py": [],
    "examples/tensorflow2/tensorflow2_synthetic_benchmark.py": [
        "--model", "MobileNetV2", "--batch-size", "2", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
        "--num-iters", "2", "--no-cuda"],
    "examples/tensorflow2/tensorflow2_keras_synthetic_benchmark.py": [
        "--model", "MobileNetV2", "--batch-size", "2", "--num-batches-per-iter", "1", "--num-iters", "2",
        "--no-cuda"],
    "examples/keras/keras_mnist.py": [],
}
# Not run: examples/keras/keras_mnist_advanced.py imports keras.preprocessing.image.ImageDataGenerator,
# which Keras 3 removed (its data augmentation needs rewriting, beyond an import), and
# examples/keras/keras_imagenet_resnet50.py (ImageNet from disk, the same ImageDataGenerator).


def prepare(source: Path, dest: Path) -> list[str]:
    """Write the edited copy of ``source`` to ``dest``; returns the edits made."""
    text = source.read_text()
    made = []
    for pattern, replacement, why in EDITS:
        text, count = re.subn(pattern, replacement, text, flags=re.M)
        if count:
            made.append(f"{why}: {pattern} x{count}")
    dest.write_text(text)
    return made


def run(example: Path, args: list[str], nprocs: int, mode: str, timeout: float) -> dict:
    from hvd_partial.launch import mpiexec_command

    out = tempfile.mkdtemp(prefix="hvdp-example-")
    env = dict(os.environ, HVD_PARTIAL_MODE=mode, HVD_TEST_OUT=out, TF_CPP_MIN_LOG_LEVEL="3",
               TF_ENABLE_ONEDNN_OPTS="0", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}:{ROOT / 'tests' / 'workers'}")
    cmd = mpiexec_command(nprocs, [sys.executable, str(HARNESS), str(example), *args])
    returncode, stdout, stderr, timed_out = run_job(cmd, env, timeout, cwd=example.parent)
    reports = {}
    for rank in range(nprocs):
        path = Path(out, f"rank{rank}.json")
        if path.exists():
            reports[rank] = json.loads(path.read_text())
    shutil.rmtree(out, ignore_errors=True)
    tail = (stdout + stderr)[-3000:]
    if timed_out:
        hung = [rank for rank in range(nprocs) if rank not in reports]
        tail = f"timed out after {timeout:.0f} s and was killed; ranks that never reported: {hung}\n" + tail
    return {"returncode": returncode, "reports": reports, "tail": tail}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("horovod", help="a Horovod checkout (its examples/ folder is read)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--modes", default="solo,sync")
    p.add_argument("--only", help="run only examples whose path contains this")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hvdp-examples-"))
    failed = 0
    for rel, extra in EXAMPLES.items():
        if args.only and args.only not in rel:
            continue
        dest = work / Path(rel).name
        edits = prepare(Path(args.horovod) / rel, dest)
        for mode in args.modes.split(","):
            result = run(dest, extra, args.np, mode, args.timeout)
            ok = result["returncode"] == 0 and len(result["reports"]) == args.np and all(
                r["identical"] for rep in result["reports"].values() for r in rep)
            failed += not ok
            lines = [f"  {r['what']}: {r['iterations']} updates, identical={r['identical']}"
                     for r in result["reports"].get(0, [])]
            print(f"{'OK  ' if ok else 'FAIL'} {rel} mode={mode} np={args.np} edits={edits}", flush=True)
            print("\n".join(lines) if lines else result["tail"], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
