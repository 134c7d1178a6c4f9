"""One of Horovod's elastic examples (examples/elastic/pytorch/*.py or
examples/elastic/tensorflow2/*.py of a Horovod checkout) run as it is, its
``import horovod...`` line swapped for hvd_partial's, under ``hvd-partial-run
--elastic`` (see tests/horovod_elastic_examples.py).

usage: horovod_elastic.py EXAMPLE_PATH [example arguments...]

What this harness adds around the example, and nothing else:

- stand-ins for what the machine lacks (no network, no torchvision, no tqdm):
  torchvision's ``datasets.MNIST`` (96 random 1x28x28 digits, 48 for the test
  set), the ImageNet example's stand-ins of tests/workers/horovod_imagenet.py
  (``ImageFolder``, no-op ``transforms``, tqdm, ``SummaryWriter``) and a
  ``models.resnet50`` that is a small conv net with 1,000 outputs; for the
  TensorFlow examples, tests/workers/tf_horovod_example.py's synthetic MNIST
  and its caps on steps and epochs, plus the edits Keras 3 demands of any
  script (tests/tensorflow/horovod_examples.py ``EDITS``; ``.lr`` is
  ``.learning_rate``, ``tf.keras.backend.set_value(v, x)`` is ``v.assign(x)``);
- the kill: ``HVD_TEST_KILL=RANK:POINT:COUNT`` makes the rank numbered RANK at
  ``init`` end by ``os._exit(1)`` the COUNT-th time it reaches POINT of
  :mod:`hvd_partial.faults` (a named point in hvd_partial's code: no timing);
- afterwards (the example returned) every rank flushes the example's optimizer
  and writes ``member.<n>.json`` into ``HVD_TEST_OUT`` (``n``: its number at
  init, or after every earlier rank for a rank started by a grow): its world,
  the optimizer's round counter and a digest of its model and optimizer state.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
import tempfile

import hvd_partial
from hvd_partial import faults

SWAPS = {"import horovod.torch as hvd": "import hvd_partial.torch as hvd",
         "import horovod.tensorflow.keras as hvd": "import hvd_partial.tensorflow.keras as hvd",
         "import horovod.tensorflow as hvd": "import hvd_partial.tensorflow as hvd",
         "import horovod": "import hvd_partial as horovod"}


def install_kill() -> None:
    spec = os.environ.get("HVD_TEST_KILL")
    if not spec:
        return
    victim, point, count = spec.split(":")

    def end(n: int) -> None:
        world = hvd_partial.world()
        if n >= int(count) and world.original_rank == int(victim) and world.original_rank not in world.joined:
            os._exit(1)

    faults.at(point, end)


def write_member(out: dict) -> None:
    world = hvd_partial.world()
    out.update({"member": world.original_rank, "rank": world.rank, "size": world.size, "version": world.version,
                "lost": list(world.lost), "joined": list(world.joined), "members": list(world.members)})
    path = os.path.join(os.environ["HVD_TEST_OUT"], f"member.{world.original_rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)


# ----- PyTorch ----------------------------------------------------------------------------

def torch_stand_ins() -> None:
    import torch
    from horovod_imagenet import install_stand_ins

    class FakeMnist(torch.utils.data.Dataset):
        def __init__(self, root, train=True, download=False, transform=None):
            n = 96 if train else 48
            g = torch.Generator().manual_seed(5 if train else 6)
            self.y = torch.randint(0, 10, (n,), generator=g)
            self.x = torch.rand(n, 1, 28, 28, generator=g) + self.y[:, None, None, None] * 0.05
            self.transform = transform

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.transform(self.x[i]), int(self.y[i])

    def small_resnet50():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 1000))

    install_stand_ins()
    vision = sys.modules["torchvision"]
    vision.datasets.MNIST = FakeMnist
    vision.models.resnet50 = small_resnet50


def torch_finish(ran: dict) -> dict:
    from torch_common import fingerprint

    import hvd_partial.torch as hvd

    optimizer, model = ran["optimizer"], ran["model"]
    optimizer.flush()
    counters = (optimizer.rounds, optimizer.updates)  # read before any other collective
    prints = hvd.allgather_object(fingerprint(model, optimizer))
    state = ran.get("state")
    plain = {k: v for k, v in vars(state).items() if k in ("epoch", "batch", "iter")} if state is not None else {}
    return {"identical": len(set(prints)) == 1, "fingerprint": prints[hvd.rank()], "rounds": counters[0],
            "updates": counters[1], "counters_everywhere": hvd.allgather_object(counters),
            "lr": optimizer.param_groups[0]["lr"], "mode": optimizer.mode.kind, "state": plain}


# ----- TensorFlow -------------------------------------------------------------------------

def tf_edit(source: str) -> str:
    from horovod_examples import EDITS

    for pattern, replacement, why in EDITS:
        if why != "import":  # the import lines are swapped by main()
            source = re.sub(pattern, replacement, source, flags=re.M)
    source = re.sub(r"\.lr\b", ".learning_rate", source)  # Keras 3: optimizers have no .lr
    # Keras 3: a learning rate is a Keras variable, which the legacy set_value cannot set
    return re.sub(r"tf\.keras\.backend\.set_value\(([\w.]+),\s*(.*)\)$", r"\1.assign(\2)", source, flags=re.M)


def tf_finish() -> dict:
    import tf_horovod_example as harness

    results = harness.replica_results()
    return {"identical": bool(results) and all(r["identical"] for r in results),
            "fingerprint": "+".join(r["digest"] for r in results), "optimizers": results}


def main() -> None:
    example, args = sys.argv[1], sys.argv[2:]
    with open(example) as f:
        source = f.read()
    swaps = [line for line in SWAPS if " as hvd" in line and re.search(rf"^{re.escape(line)}$", source, flags=re.M)]
    if len(swaps) != 1:
        raise SystemExit(f"{example}: expected one 'import horovod.<framework> as hvd' line, found {swaps}")
    framework = "torch" if "torch" in swaps[0] else "tensorflow"
    for line in [swaps[0], "import horovod"]:  # the second: used only by a branch not taken here
        source = re.sub(rf"^{re.escape(line)}$", SWAPS[line], source, flags=re.M)
    if framework == "torch":
        torch_stand_ins()
    else:
        import tf_horovod_example as harness

        harness.prepare()
        source = tf_edit(source)
    swapped = os.path.join(tempfile.mkdtemp(prefix="hvdp-elastic-example-"), os.path.basename(example))
    with open(swapped, "w") as f:
        f.write(source)
    install_kill()
    os.chdir(os.path.dirname(swapped))  # checkpoints and logs go there
    sys.argv = [swapped, *args]
    ran = runpy.run_path(swapped, run_name="__main__")
    out = torch_finish(ran) if framework == "torch" else tf_finish()
    write_member(out)
    hvd_partial.shutdown()


if __name__ == "__main__":
    main()
