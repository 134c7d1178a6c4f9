"""Configuration settings that existed once. A leftover one in the
environment or among ``init``'s arguments is an error that says it is gone,
not an unknown name and not silently ignored."""

from __future__ import annotations

from .errors import ConfigError

#: field name -> what became of it
RETIRED_FIELDS = {
    "control_plane": "the option is gone: the ranks always start rounds themselves "
                     "(the decentralized control plane); remove the setting",
}


def refuse_retired(name: str, source: str) -> None:
    """Raise :class:`ConfigError` if ``name`` (set by ``source``) is a retired field."""
    reason = RETIRED_FIELDS.get(name)
    if reason is not None:
        raise ConfigError(f"{source}: {reason}")
