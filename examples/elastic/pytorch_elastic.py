"""Elastic training with PyTorch: the survivors of a dead rank train on.

The shape of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py
(``@hvd.elastic.run``, a ``TorchState``, a reset callback that rescales the
learning rate), on MNIST-shaped synthetic data so that it runs offline, with
an ``ElasticSampler`` so that after a rank dies the rest of the epoch is dealt
again over the survivors (no sample skipped). Launch it with Open MPI 5::

    hvd-partial-run --elastic -np 4 python examples/elastic/pytorch_elastic.py

and kill one rank (``kill -9 PID``) while it trains, or let the example kill
one: ``--kill-rank 2 --kill-at-batch 5`` (that rank SIGKILLs itself after its
5th batch). The other three print the reset, finish every epoch and end with
bitwise identical models; the launcher exits 0 and says which rank was lost.
Open MPI 5.0's launcher ends the whole job once half of its processes died:
with 4 ranks, kill at most 1.

Without ``--elastic`` (plain ``mpiexec -n 4``) it trains the same way and a
dead rank ends the job.
"""

import argparse
import hashlib
import json
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import hvd_partial
import hvd_partial.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch elastic example (synthetic MNIST-shaped data)")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=2048, help="synthetic training samples")
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--batches-per-commit", type=int, default=5,
                    help="commit every N batches (each commit is a synchronous round)")
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--kill-rank", type=int, help="this rank kills itself (SIGKILL) ...")
parser.add_argument("--kill-at-batch", type=int, default=5, help="... after this many batches of the first epoch")
parser.add_argument("--report", metavar="DIR", help="write each rank's summary to DIR/rankN.json")
args = parser.parse_args()

hvd.init()  # hvd-partial-run --elastic sets HVD_PARTIAL_ELASTIC=1: init(elastic=True)
torch.manual_seed(args.seed)
torch.set_num_threads(1)


def synthetic_mnist(n, seed):
    """MNIST-shaped (1x28x28 images, 10 classes), learnable: each class is a noisy template."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 0.5 * torch.randn(n, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


train_dataset = synthetic_mnist(args.samples, seed=1)
test_dataset = synthetic_mnist(512, seed=2)
train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
resets = []


def on_state_reset():
    """After a rank died: rescale the learning rate to the survivors."""
    resets.append(hvd.size())
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()
    print(f"rank {hvd.rank()}: reset, now {hvd.size()} ranks, lr {args.lr * hvd.size():g}", flush=True)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


state = hvd.elastic.TorchState(model, optimizer, sampler=train_sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
my_batches = 0  # this process's batches, for --kill-at-batch


@hvd.elastic.run
def train(state):
    global my_batches
    while state.epoch < args.epochs:
        state.model.train()
        loss = torch.tensor(0.0)  # a rank may get no batch of what is left of the epoch
        # The sampler deals what is left of the epoch; after a reset, over the survivors.
        for batch_idx, (data, target) in enumerate(train_loader):
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            train_sampler.record_batch(batch_idx, args.batch_size)
            state.batch += 1
            my_batches += 1
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {state.epoch} [{batch_idx * len(data)}/{len(train_sampler)}]\t"
                      f"Loss: {loss.item():.6f}", flush=True)
            if state.batch % args.batches_per_commit == 0:
                state.commit()
            if args.kill_rank == hvd_partial.world().original_rank and my_batches == args.kill_at_batch:
                print(f"rank {hvd.rank()}: killing myself after batch {my_batches}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        loss = metric_average(loss.item(), f"train_loss.{state.epoch}")
        if hvd.rank() == 0:
            print(f"Epoch {state.epoch} done on {hvd.size()} ranks, average last loss {loss:.4f}", flush=True)
        state.epoch += 1
        state.batch = 0
        train_sampler.set_epoch(state.epoch)
        state.commit()


def test():
    model.eval()
    loader = torch.utils.data.DataLoader(test_dataset, batch_size=256)
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            correct += (model(data).argmax(1) == target).sum().item()
    return correct / len(test_dataset)  # every rank holds the same model: no averaging needed


started = time.monotonic()
train(state)
optimizer.flush()  # every rank's model bitwise alike
accuracy = test()
seconds = time.monotonic() - started
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
if hvd.rank() == 0:
    print(f"Test accuracy {100 * accuracy:.1f}% on {hvd.size()} ranks (lost {list(hvd_partial.world().lost)}), "
          f"{seconds:.1f} s, model {digest[:12]}", flush=True)
if args.report:
    world = hvd_partial.world()
    with open(os.path.join(args.report, f"rank{world.original_rank}.json"), "w") as fh:
        json.dump({"fingerprint": digest, "size": hvd.size(), "resets": resets, "epoch": state.epoch,
                   "accuracy": accuracy, "seconds": seconds,
                   "world": {"version": world.version, "size": world.size, "lost": list(world.lost),
                             "original_rank": world.original_rank}}, fh)
hvd.shutdown()
