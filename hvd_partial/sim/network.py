"""A latency-bandwidth cost model of hvd_partial's communication, for the
cluster simulator (:mod:`hvd_partial.sim.cluster`).

Three costs matter to the protocol, and each is a small formula whose
constants are fitted to measurements (``benchmarks/paper_scale.py
--calibrate`` measures them on the machine at hand):

- **reduction** of a round's buffers over ``P`` ranks, once the last rank has
  joined it: ``reduce_base_s + reduce_alpha_s * ceil(log2 P) +
  reduce_beta_s_per_byte * nbytes * 2 (P - 1) / P`` (the shape of a
  recursive-doubling / ring allreduce: latency terms grow with log P, the
  bandwidth term is almost independent of P);
- **a control message** (a post to the coordinator, or a round start to a
  rank): ``message_latency_s + message_per_rank_s * n`` one way (``n``: the
  per-rank entries it carries, ``P`` for the coordinator's), which
  includes the receiving engine's polling delay and unpickling (a round start
  carries a few integers per rank);
- **a rank's engine**, which serves the control messages it receives one at
  a time: handling one takes ``coordinator_s`` (the name is historical: it
  was fitted on the coordinator, the only rank that handled control messages
  before the decentralized control plane), plus ``coordinator_per_rank_s *
  P`` where the code walks every rank (the coordinator's decisions; see
  :meth:`NetworkModel.handling_seconds`); with the decentralized control
  plane every rank also derives the next round's view from the round's facts
  (vector work on a ``(4, P)`` array: ``view_per_rank_s * P`` per round,
  :meth:`NetworkModel.view_seconds`). What an engine sends leaves one message
  after the other, ``send_overhead_s + send_per_rank_s * n`` each (pickling
  and ``isend``; ``n`` the per-rank entries the message carries: a round
  start of the coordinator carries ``P``);
- **the host**: every step of a rank takes ``step_overhead_s`` longer than
  its compute (timer slack of the sleeping benchmark ranks, Python overhead
  around each post).

Every constant is non-negative, so each cost is monotone in ``P`` and in
``nbytes``. ``NetworkModel.free()`` makes every cost zero: the simulator then
reproduces :func:`hvd_partial.sim.replay` exactly.

Example::

    net = NetworkModel(reduce_base_s=2e-4, reduce_alpha_s=5e-5, reduce_beta_s_per_byte=1e-9,
                       message_latency_s=3e-4)
    net.reduce_seconds(64, 4 << 20)   # one 4 MiB round over 64 ranks
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass(frozen=True)
class NetworkModel:
    """Costs of communication, in seconds (see the module docstring)."""

    reduce_base_s: float = 0.0
    reduce_alpha_s: float = 0.0
    reduce_beta_s_per_byte: float = 0.0
    message_latency_s: float = 0.0
    message_per_rank_s: float = 0.0
    send_overhead_s: float = 0.0
    send_per_rank_s: float = 0.0
    coordinator_s: float = 0.0
    coordinator_per_rank_s: float = 0.0
    step_overhead_s: float = 0.0
    view_per_rank_s: float = 0.0
    #: where the constants came from (free text, carried into result files)
    source: str = ""

    def __post_init__(self):
        for f in fields(self):
            if f.name != "source" and not getattr(self, f.name) >= 0:
                raise ValueError(f"NetworkModel.{f.name} must be >= 0, got {getattr(self, f.name)!r}")

    @classmethod
    def free(cls) -> "NetworkModel":
        """Zero-cost communication (the assumption of :func:`replay`)."""
        return cls(source="free")

    @property
    def is_free(self) -> bool:
        return all(getattr(self, f.name) == 0 for f in fields(self) if f.name != "source")

    # -- costs --------------------------------------------------------------------

    @staticmethod
    def reduce_features(world_size: int, nbytes: int) -> tuple[float, float, float]:
        """The regressors of the reduction cost: (1, ceil(log2 P), nbytes 2 (P-1)/P)."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if world_size == 1:
            return (1.0, 0.0, 0.0)
        return (1.0, float(math.ceil(math.log2(world_size))), nbytes * 2.0 * (world_size - 1) / world_size)

    def reduce_seconds(self, world_size: int, nbytes: int) -> float:
        """Time from the last rank joining a round to its result on every rank."""
        one, steps, volume = self.reduce_features(world_size, nbytes)
        return self.reduce_base_s * one + self.reduce_alpha_s * steps + self.reduce_beta_s_per_byte * volume

    def message_seconds(self, world_size: int = 1) -> float:
        """One control message, one way, that carries ``world_size`` per-rank
        entries (a coordinator's round start carries one per rank of the world;
        the decentralized plane's messages none)."""
        return self.message_latency_s + self.message_per_rank_s * world_size

    def send_seconds(self, world_size: int = 1) -> float:
        """The sending engine's own time to send one message (carrying
        ``world_size`` per-rank entries) to one rank."""
        return self.send_overhead_s + self.send_per_rank_s * world_size

    def coordinator_seconds(self, world_size: int) -> float:
        """Time the coordinator spends deciding on one incoming message."""
        return self.handling_seconds(world_size, walks_ranks=True)

    def handling_seconds(self, world_size: int, walks_ranks: bool) -> float:
        """A rank's engine's time to handle one control message (or one event
        fed to its control policy); ``walks_ranks``: the code looks at every
        one of the ``world_size`` ranks (the coordinator's decisions)."""
        if walks_ranks:
            return self.coordinator_s + self.coordinator_per_rank_s * world_size
        return self.coordinator_s

    def view_seconds(self, world_size: int) -> float:
        """A rank's per-round work that is vector work over every rank (the
        decentralized control plane's view of the next round, from the facts)."""
        return self.view_per_rank_s * world_size

    # -- (de)serialisation -----------------------------------------------------------

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "NetworkModel":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes) -> "NetworkModel":
        data = self.to_dict()
        data.update(changes)
        return NetworkModel.from_dict(data)


def nonnegative_least_squares(a, b) -> np.ndarray:
    """Minimise ``|a x - b|`` over ``x >= 0`` by trying every set of free
    columns (exact, and fast for the handful of columns used here).

    Example::

        nonnegative_least_squares([[1, 0], [1, 1]], [1.0, 0.5])  # -> [0.75, 0.0]
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"shapes do not fit: a {a.shape}, b {b.shape}")
    n = a.shape[1]
    if n > 12:
        raise ValueError("nonnegative_least_squares tries every subset: use at most 12 columns")
    best, best_cost = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = a[:, cols]
            x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(x < 0):
                continue
            cost = float(np.sum((sub @ x - b) ** 2))
            if cost < best_cost - 1e-18:
                best_cost = cost
                best = np.zeros(n)
                best[list(cols)] = x
    return best


def fit_reduce(samples) -> tuple[float, float, float]:
    """Fit (reduce_base_s, reduce_alpha_s, reduce_beta_s_per_byte) to
    ``samples`` of ``(world_size, nbytes, seconds)``, weighting each sample by
    1/seconds so that small and large buffers count alike (relative error)."""
    rows, rhs = [], []
    for world_size, nbytes, seconds in samples:
        w = 1.0 / max(seconds, 1e-9)
        rows.append([w * f for f in NetworkModel.reduce_features(world_size, nbytes)])
        rhs.append(w * seconds)
    if not rows:
        raise ValueError("fit_reduce needs at least one sample")
    base, alpha, beta = nonnegative_least_squares(rows, rhs)
    return float(base), float(alpha), float(beta)


def fit_linear(xs, ys) -> tuple[float, float]:
    """Non-negative intercept and slope of ``y = c0 + c1 x``."""
    c0, c1 = nonnegative_least_squares([[1.0, float(x)] for x in xs], [float(y) for y in ys])
    return float(c0), float(c1)
