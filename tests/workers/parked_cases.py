"""A rank parked in a call that needs every rank while another trains on.

usage: parked_cases.py CASE [MODE] [QUORUM]

Each case is a function registered with ``support.case``; it reports what
the test asserts. The order "rank 0 is in ``hvd.allreduce``, then rank 1
posts" is made by an event rank 0 announces just before the call, which
rank 1 awaits (an event, not a time).
"""

import sys

import numpy as np

from support import announce, await_announced, case, digest, phase, report, run_case

TAU = 2
ENTERED = "rank 0 enters hvd.allreduce"


def announce_entering() -> None:
    announce(ENTERED)


def await_entered() -> None:
    await_announced(ENTERED)


def quorum_of(quorum: str):
    return None if quorum == "none" else int(quorum)


@case
def numpy_posts(mode_name: str = "solo", quorum: str = "none"):
    """Rank 1 makes TAU + 5 posts while rank 0 waits in ``hvd.allreduce``;
    rank 0 then takes the rounds completed meanwhile with ``take``."""
    import hvd_partial as hvd

    hvd.init(max_staleness=TAU)
    rank, size = hvd.rank(), hvd.size()
    mode = hvd.mode_from_name(mode_name, seed=3, quorum=quorum_of(quorum))
    posts = {0: 1, 1: TAU + 6}[rank] if size == 2 else 1
    length = sum({0: 1, 1: TAU + 6}.get(j, 1) for j in range(size))
    offset = sum({0: 1, 1: TAU + 6}.get(j, 1) for j in range(rank))
    taken = []

    def post(i):
        grad = np.zeros(length)
        grad[offset + i] = 1.0
        taken.extend(hvd.partial_allreduce(grad, "g", mode=mode, op=hvd.Sum))

    phase("first post")
    post(0)
    if rank == 0:
        phase("in hvd.allreduce")
        announce_entering()
        hvd.allreduce(np.array([1.0]), name="metric")
        taken.extend(hvd.take("g"))
        took_at_unpark = len(taken)
    else:
        await_entered()
        phase("posting while rank 0 is parked")
        for i in range(1, posts):
            post(i)
        phase("in hvd.allreduce")
        hvd.allreduce(np.array([1.0]), name="metric")
        took_at_unpark = None
    phase("flush")
    taken.extend(hvd.flush("g"))
    summed = np.sum([r.array for r in taken if r.has_data], axis=0)
    report({"summed": summed, "rounds": [r.round for r in taken], "digest": digest([r.array for r in taken]),
            "took_at_unpark": took_at_unpark, "flush_last": taken[-1].flush})
    hvd.shutdown()


@case
def torch_steps(mode_name: str = "solo", quorum: str = "none"):
    """The same with ``DistributedOptimizer``: rank 0 applies the rounds
    completed while it waited before ``hvd.allreduce`` returns."""
    import torch

    import hvd_partial.torch as hvd
    from hvd_partial import mode_from_name

    hvd.init(max_staleness=TAU)
    rank = hvd.rank()
    mode = mode_from_name(mode_name, seed=3, quorum=quorum_of(quorum))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), mode=mode)
    gen = torch.Generator().manual_seed(rank)

    def step():
        opt.zero_grad()
        model(torch.randn(3, 4, generator=gen)).pow(2).sum().backward()
        opt.step()

    phase("first step")
    step()
    rounds_before = opt.rounds
    if rank == 0:
        phase("in hvd.allreduce")
        announce_entering()
        with torch.no_grad():  # an evaluation's metric: the rounds are applied before the call returns
            hvd.allreduce(torch.tensor([1.0]), name="metric")
    else:
        await_entered()
        phase("stepping while rank 0 is parked")
        for _ in range(TAU + 5):
            step()
        phase("in hvd.allreduce")
        with torch.no_grad():
            hvd.allreduce(torch.tensor([1.0]), name="metric")
    rounds_after_allreduce = opt.rounds
    phase("flush")
    opt.flush()
    report({"rounds_before": rounds_before, "rounds_after_allreduce": rounds_after_allreduce,
            "rounds": opt.rounds, "digest": digest([p.detach().numpy() for p in model.parameters()])})
    hvd.shutdown()


@case
def early_leaver(mode_name: str = "solo", quorum: str = "none"):
    """Rank 1 leaves with ``sys.exit(0)`` after 10 steps (its exit-time
    shutdown runs); rank 0 trains on, flushes, and exits."""
    import torch

    import hvd_partial.torch as hvd
    from hvd_partial import mode_from_name

    hvd.init()
    rank = hvd.rank()
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   mode=mode_from_name(mode_name, seed=3, quorum=quorum_of(quorum)))
    for step in range(30):
        if rank == 1 and step == 10:
            report({"left_at": step})
            phase("leaving")
            sys.exit(0)
        phase(f"step {step}")
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    phase("flush")
    opt.flush()
    report({"rounds": opt.rounds})
    phase("exiting")


if __name__ == "__main__":
    run_case()
