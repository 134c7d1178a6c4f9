"""Following the hosts a discovery script lists (``hvd-partial-run
--host-discovery-script``; docs/elastic.md, "Hosts from a discovery script"):
the pure rules, shared by the launcher and every rank.

The launcher runs the script and writes what it printed, parsed, to a file
(:func:`hosts_document`); at a ``state.commit()`` rank 0 reads it and every
rank receives rank 0's copy in the same helper collective, so that every rank
plans from the same document and the same list of where the ranks run
(:func:`plan_world`) and decides alike.

Example::

    hosts = parse_discovery_output("node1:2\\nnode2\\n", default_slots=4)   # [("node1", 2), ("node2", 4)]
    plan = plan_world(hosts, ["node1", "node1", "node2", "node3"], launcher_host="node1",
                      min_np=1, max_np=0)
    plan.leave == (3,)          # node3 is no longer listed: rank 3 drains
    plan.spawn == (("node2", 3),)  # node2 has 4 slots, 1 used
"""

from __future__ import annotations

from dataclasses import dataclass

#: names that mean the host the launcher runs on
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class DiscoveryError(ValueError):
    """A discovery script's output that is not ``host`` or ``host:slots`` lines."""


def parse_discovery_output(text: str, default_slots: int) -> list[tuple[str, int]]:
    """``host`` or ``host:slots`` per line (blank lines skipped), as Horovod's
    discovery scripts print them; a host without slots gets ``default_slots``.
    A host listed twice keeps its first place and its slots add up."""
    hosts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        name, sep, slots = line.rpartition(":")
        if not sep:
            name, count = line, default_slots
        else:
            try:
                count = int(slots)
            except ValueError:
                raise DiscoveryError(f"line {number}: {line!r} is not 'host' or 'host:slots'") from None
        if not name or count < 0:
            raise DiscoveryError(f"line {number}: {line!r} is not 'host' or 'host:slots' with slots >= 0")
        hosts[name] = hosts.get(name, 0) + count
    return [(name, slots) for name, slots in hosts.items() if slots > 0]


def hosts_document(hosts: list[tuple[str, int]], serial: int, launcher_host: str) -> dict:
    """What the launcher writes for the ranks: the hosts and their slots, a serial number
    that counts the changes, and the launcher's host name (``localhost`` means it)."""
    return {"serial": serial, "hosts": [[name, slots] for name, slots in hosts], "launcher_host": launcher_host}


def same_host(listed: str, rank_host: str, launcher_host: str) -> bool:
    """Whether a listed host name names the host a rank runs on (``rank_host``, its
    ``socket.gethostname()``): equal names, equal short names (before the first dot),
    or a local name (:data:`LOCAL_NAMES`) and the launcher's host."""
    if listed in LOCAL_NAMES:
        listed = launcher_host
    return listed == rank_host or listed.split(".")[0] == rank_host.split(".")[0]


@dataclass(frozen=True)
class WorldPlan:
    """What to do at a commit: ``leave`` the current ranks that drain (their hosts are no
    longer listed, or list fewer slots than run there), ``spawn`` (host, count) of new
    ranks to start, in the listed order; ``target`` the size after it."""

    leave: tuple[int, ...]
    spawn: tuple[tuple[str, int], ...]
    target: int

    @property
    def changes(self) -> bool:
        return bool(self.leave or self.spawn)


def plan_world(hosts: list[tuple[str, int]], rank_hosts: list[str], launcher_host: str,
               min_np: int, max_np: int) -> WorldPlan:
    """The plan for the current ranks (``rank_hosts[r]``: where rank r runs) given the listed
    ``hosts``: keep each rank, in rank order, while its host has slots left; drain the rest,
    but never below ``min_np`` (the lowest-numbered of them stay); then fill the free slots
    of the listed hosts, in order, with new ranks up to ``max_np`` (0: no bound)."""
    free = [slots for _, slots in hosts]
    keep, leave = [], []
    for rank, where in enumerate(rank_hosts):
        slot = next((i for i, (name, _) in enumerate(hosts)
                     if free[i] > 0 and same_host(name, where, launcher_host)), None)
        if slot is None:
            leave.append(rank)
        else:
            free[slot] -= 1
            keep.append(rank)
    floor = max(min_np, 1)
    while len(keep) < floor and leave:
        keep.append(leave.pop(0))
    room = (max_np - len(keep)) if max_np else sum(free)
    spawn = []
    for (name, _), count in zip(hosts, free):
        count = min(count, room)
        if count > 0:
            spawn.append((name, count))
            room -= count
    return WorldPlan(tuple(leave), tuple(spawn), len(keep) + sum(c for _, c in spawn))
