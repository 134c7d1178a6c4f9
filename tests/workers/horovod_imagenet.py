"""Horovod's ImageNet example (examples/pytorch/pytorch_imagenet_resnet50.py
of a Horovod checkout, ``HOROVOD_SOURCE``) run as it is, with only its import
of ``horovod.torch`` swapped for ``hvd_partial.torch``, on a tiny stand-in
for what it needs and this machine lacks: torchvision's ``ImageFolder`` (64
random 3x8x8 images in 4 classes), ``transforms`` (no-ops), ``models.resnet50``
(a small conv net), tqdm and TensorBoard's ``SummaryWriter``. The mode comes
from ``HVD_PARTIAL_MODE``. Afterwards every rank flushes the example's
optimizer and reports its replica's fingerprint.

usage: horovod_imagenet.py EXAMPLE_PATH [example arguments...]
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
import tempfile
import types

import torch
from support import phase, report
from torch_common import fingerprint

import hvd_partial.torch as hvd


class FakeImageFolder(torch.utils.data.Dataset):
    def __init__(self, root, transform=None):
        g = torch.Generator().manual_seed(len(root))
        self.x = torch.randn(64, 3, 8, 8, generator=g)
        self.y = torch.randint(0, 4, (64,), generator=g)
        self.transform = transform

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.transform(self.x[i]), int(self.y[i])


def fake_resnet50():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(6, 4))


class Bar:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_postfix(self, *args, **kwargs):
        pass

    def update(self, n=1):
        pass


class Writer:
    def __init__(self, *args, **kwargs):
        pass

    def add_scalar(self, *args, **kwargs):
        pass


def stand_in(name: str, **attributes) -> types.ModuleType:
    """A module ``name`` with ``attributes`` (and a spec: torch's import checks look for one)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def install_stand_ins() -> None:
    identity = lambda *args, **kwargs: (lambda x: x)  # noqa: E731 - every transform is a no-op here
    transforms = types.SimpleNamespace(Compose=lambda steps: (lambda x: x), RandomResizedCrop=identity,
                                       RandomHorizontalFlip=identity, ToTensor=identity, Normalize=identity,
                                       Resize=identity, CenterCrop=identity)
    stand_in("torchvision", datasets=types.SimpleNamespace(ImageFolder=FakeImageFolder), transforms=transforms,
             models=types.SimpleNamespace(resnet50=fake_resnet50))
    stand_in("tqdm", tqdm=Bar)
    stand_in("torch.utils.tensorboard", SummaryWriter=Writer)


def main():
    example, args = sys.argv[1], sys.argv[2:]
    with open(example) as f:
        source = f.read()
    if "import horovod.torch as hvd" not in source:
        raise SystemExit(f"{example}: no 'import horovod.torch as hvd' line to swap")
    swapped = os.path.join(tempfile.mkdtemp(prefix="hvdp-imagenet-"), os.path.basename(example))
    with open(swapped, "w") as f:
        f.write(source.replace("import horovod.torch as hvd", "import hvd_partial.torch as hvd"))
    install_stand_ins()
    os.chdir(os.path.dirname(swapped))  # its checkpoints and logs go there
    sys.argv = [swapped, *args]
    phase("example")
    ran = runpy.run_path(swapped, run_name="__main__")
    phase("flush")
    optimizer, model = ran["optimizer"], ran["model"]
    optimizer.flush()
    prints = hvd.allgather_object(fingerprint(model, optimizer))
    report({"identical": len(set(prints)) == 1, "rounds": optimizer.rounds, "updates": optimizer.updates,
            "lr": optimizer.param_groups[0]["lr"], "mode": optimizer.mode.kind,
            "checkpoints": sorted(n for n in os.listdir(".") if n.startswith("checkpoint-"))})
    hvd.shutdown()


if __name__ == "__main__":
    main()
