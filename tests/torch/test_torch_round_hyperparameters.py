"""The torch wrapper as a ``torch.optim.Optimizer`` and the hyperparameters it
carries with every round (no MPI: the carried array's sums are made here as
the engine would make them, divided by the world size for ``Average``)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hvd_partial.torch as hvd  # noqa: E402
from hvd_partial.torch.round_hyperparameters import RoundHyperparameters  # noqa: E402

# The schedulers are stepped here without an optimizer step, which torch warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")

SCHEDULER_ARGS = {  # every torch.optim.lr_scheduler class, with arguments it needs
    "LambdaLR": lambda o: {"lr_lambda": lambda n: 0.9 ** n},
    "MultiplicativeLR": lambda o: {"lr_lambda": lambda n: 0.9},
    "StepLR": lambda o: {"step_size": 2},
    "MultiStepLR": lambda o: {"milestones": [2, 4]},
    "ConstantLR": lambda o: {},
    "LinearLR": lambda o: {},
    "ExponentialLR": lambda o: {"gamma": 0.9},
    "PolynomialLR": lambda o: {},
    "CosineAnnealingLR": lambda o: {"T_max": 5},
    "CosineAnnealingWarmRestarts": lambda o: {"T_0": 5},
    "CyclicLR": lambda o: {"base_lr": 0.01, "max_lr": 0.1, "cycle_momentum": True},
    "OneCycleLR": lambda o: {"max_lr": 0.1, "total_steps": 10},
    "ReduceLROnPlateau": lambda o: {"patience": 0},
    "SequentialLR": lambda o: {"schedulers": [torch.optim.lr_scheduler.ConstantLR(o, total_iters=2),
                                              torch.optim.lr_scheduler.ExponentialLR(o, 0.9)], "milestones": [2]},
    "ChainedScheduler": lambda o: {"schedulers": [torch.optim.lr_scheduler.ConstantLR(o, total_iters=2),
                                                  torch.optim.lr_scheduler.ExponentialLR(o, 0.9)], "optimizer": o},
}


def wrapped(mode=None, **kwargs):
    model = torch.nn.Linear(3, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, **kwargs)
    return hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(), mode=mode or hvd.Solo())


def scheduler_classes():
    lr_scheduler = torch.optim.lr_scheduler
    return sorted(name for name, cls in vars(lr_scheduler).items()
                  if inspect.isclass(cls) and cls.__module__ == lr_scheduler.__name__ and not name.startswith("_")
                  and issubclass(cls, lr_scheduler.LRScheduler) and cls is not lr_scheduler.LRScheduler)


def test_the_wrapper_is_an_optimizer_sharing_the_wrapped_ones_groups_and_state():
    opt = wrapped()
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is opt.optimizer.param_groups and opt.state is opt.optimizer.state
    assert not hasattr(opt, "attach_lr_scheduler")


@pytest.mark.parametrize("name", scheduler_classes())
def test_every_lr_scheduler_is_built_and_stepped_on_the_wrapper(name):
    assert name in SCHEDULER_ARGS, f"torch has a scheduler this test does not know: {name}"
    opt = wrapped()
    kwargs = SCHEDULER_ARGS[name](opt)
    cls = getattr(torch.optim.lr_scheduler, name)
    sched = cls(**kwargs) if "optimizer" in kwargs else cls(opt, **kwargs)
    for _ in range(3):
        sched.step(1.0) if name == "ReduceLROnPlateau" else sched.step()
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0] and opt.param_groups[0]["lr"] != 0.1


def test_swalr_is_built_on_the_wrapper():
    opt = wrapped()
    sched = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=2)
    sched.step()
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0]


def summed(posts, world_size):
    """What the engine hands out for Average: the sum of the posts' arrays divided by P."""
    return np.sum(posts, axis=0) / world_size


def test_posts_that_agree_give_their_values_bit_for_bit():
    opt = wrapped(weight_decay=1e-4)
    carried = RoundHyperparameters(opt.optimizer)
    opt.param_groups[0]["lr"] = 0.1 / 3  # no short binary form: a sum then a division would not give it back
    posts = [carried.encode() for _ in range(7)]  # 7 posts, as 3 ranks with pending posts summed might send
    for world_size in (1, 3, 7, 1000):
        values = carried.decode(summed(posts, world_size), world_size)
        assert values == carried.read()
        assert np.array(values).view(np.uint64).tolist() == np.array(carried.read()).view(np.uint64).tolist()


def test_posts_that_differ_give_their_mean_and_every_value_is_chosen_alone():
    opt = wrapped()
    carried = RoundHyperparameters(opt.optimizer)
    posts = []
    for lr in (0.1, 0.2, 0.3):
        opt.param_groups[0]["lr"] = lr
        posts.append(carried.encode())
    values = carried.decode(summed(posts, 4), 4)
    lr_at = [e.key for e in carried.entries].index("lr")
    assert values[lr_at] == pytest.approx(0.2, rel=1e-15)
    assert values[lr_at + 1] == 0.9  # momentum agreed: exact


def test_a_round_without_posts_has_no_values_and_types_are_kept():
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), betas=(0.8, 0.99))
    carried = RoundHyperparameters(inner)
    post = carried.encode()
    assert carried.decode(np.zeros_like(post), 2) is None
    inner.param_groups[0]["betas"] = (0.5, 0.5)
    carried.write(carried.decode(summed([post], 2), 2))
    group = inner.param_groups[0]
    assert isinstance(group["betas"], tuple) and group["betas"] == (0.8, 0.99)
    assert isinstance(group["lr"], torch.Tensor) and group["lr"].item() == pytest.approx(0.01)


def test_a_carried_value_that_stops_being_a_number_is_refused():
    opt = wrapped()
    carried = RoundHyperparameters(opt.optimizer)
    carried.encode()
    opt.param_groups[0]["momentum"] = None
    with pytest.raises(hvd.UnsupportedInputError, match="momentum"):
        carried.encode()


def test_grad_scaler_hands_its_scale_to_step_only_outside_sync_mode():
    assert wrapped(hvd.Solo())._step_supports_amp_scaling is True
    assert wrapped(hvd.Majority(seed=0))._step_supports_amp_scaling is True
    assert wrapped(hvd.Sync())._step_supports_amp_scaling is False
