"""Horovod's environment variables with the same meaning, and the checks of
the configuration fields added for launching and observing.

:func:`hvd_partial.config.load_config` reads, lowest precedence first: the
defaults, the Horovod variables below, ``HVD_PARTIAL_<FIELD>``, then the
arguments of ``init``. So a job script written for ``horovodrun`` keeps its
settings, and an ``HVD_PARTIAL_*`` variable always wins.

Example::

    HOROVOD_TIMELINE=/tmp/t.json HOROVOD_STALL_CHECK_TIME_SECONDS=30 mpiexec -n 4 python train.py

Other ``HOROVOD_*`` variables (those ``horovodrun`` sets for its own use, such
as ``HOROVOD_RANK`` or ``HOROVOD_GLOO_*``, and tuning knobs that have no
meaning here, such as ``HOROVOD_HIERARCHICAL_ALLREDUCE``) are ignored and
logged at DEBUG.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from .errors import ConfigError

log = logging.getLogger("hvd_partial.config")

HOROVOD_PREFIX = "HOROVOD_"

_LOG_LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warning": "WARNING", "warn": "WARNING",
               "error": "ERROR", "fatal": "CRITICAL"}


def _log_level(text: str, variable: str) -> str:
    level = _LOG_LEVELS.get(text.strip().lower())
    if level is None:
        raise ConfigError(f"{variable}={text!r} is not a Horovod log level "
                          f"(expected one of {', '.join(sorted(_LOG_LEVELS))})")
    return level


#: Horovod variable -> (Config field, converter or None to parse as the field's type, what it means here)
HOROVOD_VARIABLES: dict[str, tuple[str, Callable[[str, str], Any] | None, str]] = {
    "HOROVOD_TIMELINE": ("timeline_filename", None, "timeline file"),
    "HOROVOD_FUSION_THRESHOLD": ("fusion_threshold_bytes", None, "largest fused buffer, bytes"),
    "HOROVOD_CYCLE_TIME": ("idle_poll_ms", None, "engine idle poll bound, ms"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("stall_warning_seconds", None, "stall warning after, s"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("stall_shutdown_seconds", None, "stall shutdown after, s"),
    "HOROVOD_STALL_CHECK_DISABLE": ("stall_warning_seconds", None, "1 turns the stall inspector off"),
    "HOROVOD_LOG_LEVEL": ("log_level", _log_level, "log level"),
}


def horovod_values(environ: Mapping[str, str], known: Mapping[str, Any],
                   parse: Callable[[Any, str, str], Any]) -> dict[str, Any]:
    """Config values from the Horovod variables in ``environ``.

    ``known`` maps field names to dataclass fields and ``parse(type, text,
    variable)`` converts text (both from :mod:`hvd_partial.config`, which
    imports this module; this module imports nothing of it). A malformed
    value raises :class:`ConfigError` naming the variable.
    """
    values: dict[str, Any] = {}
    ignored = []
    for variable in sorted(k for k in environ if k.startswith(HOROVOD_PREFIX)):
        text = environ[variable]
        entry = HOROVOD_VARIABLES.get(variable)
        if entry is None:
            ignored.append(variable)
            continue
        field_name, convert, _ = entry
        if variable == "HOROVOD_STALL_CHECK_DISABLE":
            if parse("bool", text, variable):
                values["stall_warning_seconds"] = 0.0
                values["stall_shutdown_seconds"] = 0.0
            continue
        if variable == "HOROVOD_STALL_CHECK_TIME_SECONDS" and environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip() \
                .lower() in ("1", "true", "yes", "on"):
            continue  # disabled wins
        value = convert(text, variable) if convert else parse(known[field_name].type, text, variable)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{variable}={text!r} must be >= 0")
        values[field_name] = value
    if ignored:
        log.debug("ignoring Horovod variables with no meaning in hvd_partial: %s", ", ".join(ignored))
    return values


def check_extra_fields(cfg) -> None:
    """Validate the launch and observation fields of a Config (called by
    ``Config.__post_init__``); raises :class:`ConfigError` naming the field and
    its ``HVD_PARTIAL_*`` variable."""
    def bad(field_name: str, why: str):
        raise ConfigError(f"{field_name} {why}, got {getattr(cfg, field_name)!r} "
                          f"(HVD_PARTIAL_{field_name.upper()})")

    if not isinstance(cfg.mode, str) or cfg.mode.strip().lower() not in ("sync", "solo", "majority"):
        bad("mode", "must be 'sync', 'solo' or 'majority'")
    for name in ("seed", "quorum"):
        if not isinstance(getattr(cfg, name), int) or isinstance(getattr(cfg, name), bool):
            bad(name, "must be an int")
    if cfg.quorum < 0:
        bad("quorum", "must be >= 0 (0: no quorum)")
    if cfg.quorum and cfg.mode.strip().lower() != "majority":
        bad("quorum", f"applies to mode='majority' only (mode is {cfg.mode!r})")
    if not isinstance(cfg.timeline_filename, str):
        bad("timeline_filename", "must be a path or ''")
    for name in ("stall_warning_seconds", "stall_shutdown_seconds", "report_seconds"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            bad(name, "must be a number >= 0 (0: off)")
    if cfg.stall_shutdown_seconds and cfg.stall_warning_seconds \
            and cfg.stall_shutdown_seconds < cfg.stall_warning_seconds:
        bad("stall_shutdown_seconds", f"must be 0 or >= stall_warning_seconds ({cfg.stall_warning_seconds:g})")
