"""The one typed configuration object.

Precedence: explicit arguments to ``init(**config)`` win, then
``HVD_PARTIAL_<FIELD>`` environment variables, then the defaults below.

Example::

    HVD_PARTIAL_MAX_STALENESS=4 mpiexec -n 4 python train.py
    # or, in code (wins over the environment):
    hvd.init(max_staleness=4)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from .config_env import HOROVOD_VARIABLES, check_extra_fields, horovod_values
from .config_retired import refuse_retired
from .errors import ConfigError

ENV_PREFIX = "HVD_PARTIAL_"
#: Config fields compared across ranks at ``init`` (others either may differ, or a
#: difference already fails a stream's registration).
AGREED_FIELDS = ("cap_round_step",)


@dataclass(frozen=True)
class Config:
    """Settings of one hvd_partial process. Every field can be set as
    ``HVD_PARTIAL_<FIELD>`` (upper case) or as a keyword of ``init``."""

    #: Default bound on staleness (rounds) for solo and majority streams;
    #: a stream may pass its own ``max_staleness``. 0 makes them synchronous.
    max_staleness: int = 8
    #: Seconds between the heartbeats that every engine sends to its ring successor.
    heartbeat_seconds: float = 1.0
    #: A rank from which its ring successor hears nothing for this long is
    #: declared failed and every waiting call raises ``RankFailedError`` naming it.
    failure_timeout_seconds: float = 30.0
    #: How long a rank that raised waits for its failure notice to reach the
    #: others before it exits; a process whose engine failed also waits out
    #: this long from the failure before it exits.
    abort_grace_seconds: float = 2.0
    #: Upper bound of the engine's idle back-off, in milliseconds, where some
    #: peer cannot ring its doorbell (or doorbells are off).
    idle_poll_ms: float = 1.0
    #: Where every peer can ring its doorbell, an idle engine sleeps this
    #: long at a time (milliseconds): rings and new posts wake it at once, so
    #: this only bounds the delay of a lost ring. Short sleeps cost training:
    #: each wake-up takes the CPU from a computing thread.
    doorbell_poll_ms: float = 10.0
    #: After any work, the engine stays awake this long (microseconds),
    #: yielding the CPU, before it sleeps: a training loop's next post then
    #: needs no wake-up. 0 sleeps at once.
    spin_us: float = 200.0
    #: 0: the engine tests a reduction in flight continuously, yielding the
    #: CPU between tests. Above 0: once a reduction has been in flight 1 ms,
    #: it is tested this often (microseconds), the engine sleeping in
    #: between, so that ranks still computing keep the CPU. -1 (the
    #: default): 200 where this host runs more ranks than this process may
    #: use cores, else 0 (there the ranks' engines starve each other's
    #: tests; with a core per rank a spaced test could slow a long network
    #: reduction, which needs a test to advance each of its steps).
    reduce_poll_us: float = -1.0
    #: Wake idle engines with a UDP datagram after each urgent control
    #: message, instead of waiting for their next poll (a hint; MPI carries
    #: the message). Turn off where UDP between the hosts is unwanted.
    doorbell: bool = True
    #: Largest fused buffer the framework adapters build, in bytes.
    fusion_threshold_bytes: int = 64 * 1024 * 1024
    #: Sync mode: post the gradients in buckets of at most
    #: ``fusion_threshold_bytes`` as each bucket's gradients are complete, so
    #: that reductions overlap the rest of the backward pass (PyTorch's
    #: ``DistributedOptimizer`` during ``backward()``, TensorFlow and Keras
    #: inside a compiled step; solo and majority post the whole gradient at once).
    overlap_backward: bool = True
    #: Solo and majority optimizers (PyTorch and Keras), ``Average``: a round
    #: that summed more posts than the world has ranks (a rank's posts piled up
    #: while the round waited for its initiator) is divided by its number of
    #: posts instead of the world size, so that no applied round steps further
    #: than a synchronous one. Off: the sum divided by the world size (the
    #: eager-SGD paper's rule). Every rank must use the same setting.
    cap_round_step: bool = True
    #: Level of the ``hvd_partial`` logger (DEBUG, INFO, WARNING, ERROR).
    log_level: str = "WARNING"
    #: Install a ``sys.excepthook`` that tells the other ranks when this rank
    #: dies of an uncaught exception, then exits without a collective flush.
    abort_on_exception: bool = True
    #: Mode of streams posted without ``mode=``: ``sync``, ``solo`` or ``majority``.
    mode: str = "solo"
    #: Seed of majority mode's initiator draw (streams posted without ``mode=``).
    seed: int = 0
    #: Majority quorum for streams posted without ``mode=``; 0 means none.
    quorum: int = 0
    #: Chrome-trace timeline written by every rank ('' = off). ``{rank}`` in the
    #: name is replaced by the rank, else ``.rank<N>`` goes before the suffix.
    timeline_filename: str = ""
    #: Warn (on every rank) about a rank that has called nothing for this long
    #: while others wait or post; 0 turns the stall inspector off.
    stall_warning_seconds: float = 60.0
    #: Past this long, every rank raises ``StalledRankError``; 0 = never (default).
    stall_shutdown_seconds: float = 0.0
    #: Rank 0 logs the slow-rank report at INFO this often; 0 = never.
    report_seconds: float = 60.0
    #: A solo or majority round that this
    #: rank's post starts in balanced training
    #: (every rank contributed to the last round, or it was a flush round)
    #: waits this long, in microseconds, before this rank sends its
    #: activations: if every rank joins the round itself meanwhile (at its
    #: post, or at once when it flushes), none are sent. A late rank is
    #: activated this much later. 0: at once, no early joins, and flushes
    #: gather as in any round.
    activation_delay_us: float = 2000.0
    #: Elastic training: survive ranks that die (Open MPI with ULFM, launched with
    #: ``hvd-partial-run --elastic`` or ``mpirun --with-ft ulfm --mca btl tcp,self``).
    #: Off: a dead rank ends the job (``RankFailedError`` on every survivor).
    elastic: bool = False
    #: Elastic training: grow the world back to this many ranks (``hvd-partial-run --max-np``).
    #: While the world is smaller, each ``state.commit()`` of the elastic API at which every
    #: stream is at rest starts the missing processes (MPI ``Spawn``) and they join. 0: never.
    max_np: int = 0
    #: Elastic training: the longest a grow's new ranks may take to join (seconds) before the
    #: ranks that started them end the job, naming them. A new process that ends before
    #: ``MPI_Init`` would leave MPI's ``Spawn`` waiting forever; under ``hvd-partial-run
    #: --elastic`` its rank wrapper's record ends the grow at once, this bound is for the rest.
    grow_timeout_seconds: float = 300.0
    #: Elastic training: the fewest ranks to go on with (``hvd-partial-run --min-np``). A failure
    #: that leaves fewer stops every survivor with ``RankFailedError`` naming the ranks lost. 0: any.
    min_np: int = 0
    #: Elastic training: the file ``hvd-partial-run --host-discovery-script`` writes the
    #: discovered hosts to (JSON, :func:`hvd_partial.core.hosts.hosts_document`). When set,
    #: each ``state.commit()`` of the elastic API reads it (rank 0, shared with every rank)
    #: and drains the ranks of hosts no longer listed and starts ranks on free slots
    #: (docs/elastic.md, "Hosts from a discovery script"). Empty: not followed.
    hosts_file: str = ""

    def __post_init__(self):
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        for name in ("heartbeat_seconds", "failure_timeout_seconds", "idle_poll_ms", "doorbell_poll_ms",
                     "grow_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("spin_us", "activation_delay_us"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.reduce_poll_us < 0 and self.reduce_poll_us != -1:
            raise ConfigError(f"reduce_poll_us must be >= 0, or -1 for the default, got {self.reduce_poll_us}")
        for name in ("max_np", "min_np"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.abort_grace_seconds < 0:
            raise ConfigError(f"abort_grace_seconds must be >= 0, got {self.abort_grace_seconds}")
        if self.fusion_threshold_bytes <= 0:
            raise ConfigError(f"fusion_threshold_bytes must be > 0, got {self.fusion_threshold_bytes}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}")
        check_extra_fields(self)

    def agreed(self) -> dict[str, Any]:
        """The fields every rank must set alike where nothing else would notice a
        difference (the replicas would drift apart); ``init`` compares them."""
        return {name: getattr(self, name) for name in AGREED_FIELDS}

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def default_mode(self):
        """The mode of streams posted without ``mode=`` (fields mode, seed, quorum)."""
        from .modes import mode_from_name

        return mode_from_name(self.mode, seed=self.seed, quorum=self.quorum or None)


def _parse(field_type: Any, text: str, source: str) -> Any:
    kind = field_type if isinstance(field_type, str) else getattr(field_type, "__name__", str(field_type))
    try:
        if kind == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise ConfigError(f"{source}={text!r} is not a valid {kind}") from None


def disagreement(per_rank: list[dict[str, Any]]) -> str | None:
    """What differs between the ranks' :meth:`Config.agreed` fields (index = rank), or None."""
    out = []
    for name in AGREED_FIELDS:
        values: dict = {}
        for rank, agreed in enumerate(per_rank):
            values.setdefault(agreed[name], []).append(rank)
        if len(values) > 1:
            out.append(f"{name} (HVD_PARTIAL_{name.upper()}) is " + ", ".join(
                f"{value!r} on rank(s) {ranks}" for value, ranks in values.items()))
    return "; ".join(out) or None


def load_config(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from the environment and explicit ``overrides``.

    Unknown ``HVD_PARTIAL_*`` variables and unknown keywords raise
    :class:`ConfigError` naming them.
    """
    environ = os.environ if environ is None else environ
    overrides = dict(overrides or {})
    known = {f.name: f for f in fields(Config)}
    values: dict[str, Any] = horovod_values(environ, known, _parse)  # HVD_PARTIAL_* wins over them
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):].lower()
        refuse_retired(name, key)
        if name not in known:
            raise ConfigError(f"unknown environment variable {key}: known fields are "
                              + ", ".join(ENV_PREFIX + n.upper() for n in known))
        values[name] = _parse(known[name].type, text, key)
    for name, value in overrides.items():
        refuse_retired(name, f"{name}=")
        if name not in known:
            raise ConfigError(f"unknown configuration field {name!r}: known fields are {', '.join(known)}")
        values[name] = value
    return Config(**values)


def config_sources(environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Where each field's value comes from: ``default``, a variable name or ``argument``."""
    out = {f.name: "default" for f in fields(Config)}
    for variable, (field_name, _, _) in HOROVOD_VARIABLES.items():
        if variable in environ:
            out[field_name] = variable
            if variable == "HOROVOD_STALL_CHECK_DISABLE":
                out["stall_shutdown_seconds"] = variable
    for name in out:
        if ENV_PREFIX + name.upper() in environ:
            out[name] = ENV_PREFIX + name.upper()
    for name in overrides or {}:
        out[name] = "argument"
    return out
