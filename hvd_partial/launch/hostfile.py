"""Host lists: parse Horovod's ``-H host:slots,...`` and hostfiles, and write
them in the MPI launcher's own format.

Accepted hostfile lines (``#`` starts a comment)::

    node1 slots=4        # horovodrun / Open MPI
    node2:4              # MPICH Hydra
    node3                # one slot

Example::

    hosts = parse_hosts("node1:4,node2:4")
    write_hostfile(hosts, MpiFlavor.MPICH)   # a temporary file with node1:4 / node2:4
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass

from .mpiexec import MpiFlavor


class HostfileError(ValueError):
    """A host list or hostfile line cannot be parsed; the message names it."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


_HOST_RE = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")


def _slots(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise HostfileError(f"{where}: slots must be an integer, got {text!r}") from None
    if value < 1:
        raise HostfileError(f"{where}: slots must be >= 1, got {value}")
    return value


def _host(entry: str, where: str) -> Host:
    entry = entry.strip()
    if not entry:
        raise HostfileError(f"{where}: empty host entry")
    if entry.count(":") == 1 and not entry.startswith("["):
        name, slots = entry.split(":")
        host = Host(name, _slots(slots, where))
    else:
        host = Host(entry)
    if not _HOST_RE.match(host.name):
        raise HostfileError(f"{where}: {host.name!r} is not a host name")
    return host


def parse_hosts(text: str) -> list[Host]:
    """Parse ``-H``: ``host[:slots],host[:slots],...``."""
    return [_host(part, f"-H entry {i + 1} ({part.strip()!r})") for i, part in enumerate(text.split(","))]


def parse_hostfile(path: str) -> list[Host]:
    """Parse a hostfile in Horovod/Open MPI (``host slots=N``) or MPICH (``host:N``) format."""
    hosts = []
    with open(path) as fh:
        for number, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{path}:{number} ({line!r})"
            parts = line.split()
            host = _host(parts[0], where)
            for extra in parts[1:]:
                key, _, value = extra.partition("=")
                if key in ("slots", "max_slots", "max-slots") and value:
                    if key == "slots":
                        host = Host(host.name, _slots(value, where))
                else:
                    raise HostfileError(f"{where}: unknown field {extra!r} (expected slots=N)")
            hosts.append(host)
    if not hosts:
        raise HostfileError(f"{path}: no hosts")
    return hosts


def total_slots(hosts: list[Host]) -> int:
    return sum(h.slots for h in hosts)


def hosts_argument(hosts: list[Host]) -> str:
    """``host:slots,...``, understood by both Hydra's ``-hosts`` and Open MPI's ``-H``."""
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def format_hostfile(hosts: list[Host], flavor: MpiFlavor) -> str:
    if flavor is MpiFlavor.OPEN_MPI:
        return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)
    return "".join(f"{h.name}:{h.slots}\n" for h in hosts)


def write_hostfile(hosts: list[Host], flavor: MpiFlavor) -> str:
    """Write ``hosts`` in ``flavor``'s format to a temporary file; returns its path."""
    with tempfile.NamedTemporaryFile("w", prefix="hvdp-hosts-", suffix=".txt", delete=False) as fh:
        fh.write(format_hostfile(hosts, flavor))
        return fh.name
