"""``hvd-partial-run --host-discovery-script``: the launcher's side of following
the hosts a script lists (docs/elastic.md, "Hosts from a discovery script").

The launcher runs the script at start (until it lists at least ``--min-np``
slots, for at most ``--elastic-timeout`` seconds) and starts the job on those
hosts; then a thread runs it every :data:`INTERVAL_SECONDS` and, each time
the list changes, rewrites the hosts file (atomically, its ``serial`` one
more) that the ranks read at ``state.commit()``
(:func:`hvd_partial.engine.growth.follow_hosts`). A script that fails or
prints something else is logged on stderr and the last list stays.

Example::

    hosts = discover("./discover.sh", default_slots=1)        # [("node1", 4), ...]
    watcher = HostsWatcher("./discover.sh", 1, "/tmp/job/hosts.json", hosts)
    watcher.start()
    ...
    watcher.stop()
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from ..core.hosts import DiscoveryError, hosts_document, parse_discovery_output
from ..errors import ConfigError

#: how often the launcher runs the script during the run (Horovod's driver: every second)
INTERVAL_SECONDS = 1.0
#: the longest one run of the script may take
SCRIPT_TIMEOUT_SECONDS = 60.0
#: the hosts file's name in the launcher's status folder
HOSTS_FILE = "hosts.json"


def discover(script: str, default_slots: int) -> list[tuple[str, int]]:
    """Run ``script`` once; its hosts and slots (``host`` or ``host:slots`` lines).
    Raises :class:`DiscoveryError` when it fails or prints something else."""
    try:
        done = subprocess.run([script], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_SECONDS)
    except (OSError, subprocess.SubprocessError) as err:
        raise DiscoveryError(f"host discovery script {script}: {err}") from err
    if done.returncode != 0:
        raise DiscoveryError(f"host discovery script {script} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        return parse_discovery_output(done.stdout, default_slots)
    except DiscoveryError as err:
        raise DiscoveryError(f"host discovery script {script}: {err}") from err


def wait_for_hosts(script: str, default_slots: int, min_np: int, timeout: float) -> list[tuple[str, int]]:
    """Run ``script`` until it lists at least ``min_np`` slots; raises :class:`ConfigError`
    after ``timeout`` seconds (``--elastic-timeout``) or when the script fails."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            hosts = discover(script, default_slots)
        except DiscoveryError as err:
            raise ConfigError(str(err)) from err
        slots = sum(n for _, n in hosts)
        if slots >= min_np:
            return hosts
        if time.monotonic() >= deadline:
            raise ConfigError(f"host discovery script {script} lists {slots} slots, fewer than --min-np {min_np}, "
                              f"after --elastic-timeout {timeout:g} s")
        time.sleep(INTERVAL_SECONDS)


def write_hosts(path: str, hosts: list[tuple[str, int]], serial: int) -> None:
    """Write the hosts document for the ranks, atomically (they may read it at any time)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(hosts_document(hosts, serial, socket.gethostname()), fh)
    os.replace(tmp, path)


class HostsWatcher:
    """Runs the script every :data:`INTERVAL_SECONDS` on a thread of its own and rewrites
    ``path`` when the hosts change (the first document, serial 0, is written at once)."""

    def __init__(self, script: str, default_slots: int, path: str, hosts: list[tuple[str, int]]):
        self._script, self._slots, self.path = script, default_slots, path
        self.hosts, self.serial = list(hosts), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hvdp-host-discovery", daemon=True)
        write_hosts(path, self.hosts, self.serial)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=SCRIPT_TIMEOUT_SECONDS + 5)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_SECONDS):
            try:
                hosts = discover(self._script, self._slots)
            except DiscoveryError as err:
                print(f"hvd-partial-run: {err}; keeping the hosts found before", file=sys.stderr)
                continue
            if hosts != self.hosts and not self._stop.is_set():
                self.hosts, self.serial = hosts, self.serial + 1
                write_hosts(self.path, hosts, self.serial)
                print(f"hvd-partial-run: discovered hosts changed (serial {self.serial}): "
                      f"{','.join(f'{h}:{n}' for h, n in hosts) or 'none'}", file=sys.stderr)
