"""Shared by the torch worker scripts: deterministic data, models and fingerprints."""

from __future__ import annotations

import hashlib

import torch

torch.set_num_threads(1)  # 4 ranks share 2 cores


def make_data(seed: int, n: int, features: int = 12, classes: int = 5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def make_model(seed: int, features: int = 12, hidden: int = 16, classes: int = 5, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, classes)).to(dtype)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def state_tensors(optimizer):
    """The optimizer's state tensors in a fixed order (works for wrapped ones too)."""
    sd = optimizer.state_dict()
    out = []
    for key in sorted(sd["state"]):
        for name in sorted(sd["state"][key]):
            value = sd["state"][key][name]
            out.append(value if isinstance(value, torch.Tensor) else torch.tensor(float(value)))
    return out


def state_fingerprint(optimizer) -> str:
    """Fingerprint of the optimizer's state tensors and hyperparameters."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.state_dict()["param_groups"]]
    return fingerprint(None, optimizer) + hashlib.sha256(repr(groups).encode()).hexdigest()[:16]


def fingerprint(model, optimizer=None) -> str:
    """Bitwise fingerprint of the model's parameters and the optimizer's state."""
    h = hashlib.sha256()
    tensors = [p.detach() for p in model.parameters()] if model is not None else []
    if optimizer is not None:
        tensors += state_tensors(optimizer)
    for t in tensors:
        h.update(str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def max_diff(model_a, model_b) -> float:
    return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(model_a.parameters(),
                                                                             model_b.parameters()))
