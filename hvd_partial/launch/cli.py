"""``hvd-partial-run``: launch a training script on N processes through the
MPI installation's own ``mpiexec``, with ``horovodrun``'s common flags and the
partial-collective settings. It launches; MPI manages the processes.

Examples::

    hvd-partial-run -np 4 python train.py
    hvd-partial-run -np 8 -H node1:4,node2:4 --mode majority --quorum 4 python train.py
    hvd-partial-run -np 16 --hostfile hosts.txt --timeline-filename /tmp/tl.json python train.py
    hvd-partial-run -np 4 --dry-run python train.py      # print the mpiexec command only

Every setting travels to the ranks as an ``HVD_PARTIAL_*`` environment
variable (``-genv`` for MPICH Hydra, ``-x`` for Open MPI), so the script needs
no arguments for them. Processes are never bound to cores (``-bind-to none``):
the engine thread must not share the training thread's core.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys

from ..config import ENV_PREFIX, load_config
from ..errors import ConfigError
from .hostfile import HostfileError, hosts_argument, parse_hostfile, parse_hosts, total_slots, write_hostfile
from .mpiexec import detect_flavor, find_mpiexec, mpiexec_command

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
    "log_level": ("log_level", lambda s: s.upper()),
    "report_seconds": ("report_seconds", str),
    "failure_timeout_seconds": ("failure_timeout_seconds", str),
    "heartbeat_seconds": ("heartbeat_seconds", str),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd-partial-run",
        description="Run a script on N processes through mpiexec, with hvd_partial's settings "
                    "(horovodrun's common flags plus the partial-collective ones).",
        epilog="Settings become HVD_PARTIAL_* environment variables of every rank; "
               "see docs/operations.md.")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of processes (default: the slots of -H/--hostfile)")
    p.add_argument("-H", "--hosts", help="host:slots,... (e.g. node1:4,node2:4)")
    p.add_argument("--hostfile", help="file with one host per line: 'host slots=N' or 'host:N'")
    p.add_argument("--mode", choices=["sync", "solo", "majority"], help="default mode of streams (HVD_PARTIAL_MODE)")
    p.add_argument("--max-staleness", type=int, help="staleness bound in rounds (HVD_PARTIAL_MAX_STALENESS)")
    p.add_argument("--quorum", type=int, help="majority quorum, 0 for none (HVD_PARTIAL_QUORUM)")
    p.add_argument("--seed", type=int, help="majority initiator seed (HVD_PARTIAL_SEED)")
    p.add_argument("--timeline-filename", help="write a Chrome-trace timeline (merged from the ranks' files at the end)")
    p.add_argument("--timeline-mark-cycles", action="store_true", help="accepted for horovodrun compatibility; no effect")
    p.add_argument("--stall-check-warning-time-seconds", type=float, help="warn about a stalled rank after this long")
    p.add_argument("--stall-check-shutdown-time-seconds", type=float, help="fail every rank after a stall this long (0: never)")
    p.add_argument("--no-stall-check", action="store_true", help="turn the stall inspector off")
    p.add_argument("--fusion-threshold-mb", type=float, help="largest fused buffer, MiB")
    p.add_argument("--cycle-time-ms", type=float, help="engine idle poll bound, ms (HVD_PARTIAL_IDLE_POLL_MS)")
    p.add_argument("--report-seconds", type=float, help="rank 0 logs the slow-rank report this often (at INFO)")
    p.add_argument("--failure-timeout-seconds", type=float, help="a silent rank is declared failed after this long")
    p.add_argument("--heartbeat-seconds", type=float, help="liveness message period")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error", "critical",
                                           "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    p.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, quoted as one string")
    p.add_argument("--mpiexec", help="the mpiexec to use (default: the one beside Python, then PATH)")
    p.add_argument("--mpi", action="store_true", help="accepted for horovodrun compatibility (always MPI)")
    p.add_argument("--gloo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--check-build", action="store_true", help="print what hvd_partial finds here, and exit")
    p.add_argument("--dry-run", action="store_true", help="print the mpiexec command and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="print the command; log level INFO unless --log-level")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


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
    return env


def build_command(args, environ: dict | None = None) -> tuple[list[str], dict[str, str], list[str]]:
    """(mpiexec command, environment for it, temporary files to remove)."""
    if args.gloo:
        raise ConfigError("--gloo: hvd_partial runs on MPI only")
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("no program given: hvd-partial-run -np 4 python train.py")
    if args.hosts and args.hostfile:
        raise ConfigError("give -H/--hosts or --hostfile, not both")
    env_settings = settings_env(args)
    environ = dict(os.environ if environ is None else environ)
    environ.update(env_settings)
    load_config(environ=environ)  # malformed settings fail here, before any process starts
    exe = args.mpiexec or find_mpiexec()
    flavor = detect_flavor(exe)
    hosts = parse_hosts(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else None
    nprocs = args.np if args.np is not None else (total_slots(hosts) if hosts else None)
    if nprocs is None:
        raise ConfigError("give -np N (or -H/--hostfile, whose slots then set N)")
    if nprocs < 1:
        raise ConfigError(f"-np must be >= 1, got {nprocs}")
    temporary = []
    hostfile = None
    if args.hostfile:
        hostfile = write_hostfile(hosts, flavor)
        temporary.append(hostfile)
    cmd = mpiexec_command(nprocs, command, hosts=hosts_argument(hosts) if args.hosts else None,
                          hostfile=hostfile, env=env_settings, mpiexec=exe)
    extra = shlex.split(args.mpi_args) if args.mpi_args else []
    if extra:
        at = cmd.index("-n")
        cmd = cmd[:at] + extra + cmd[at:]
    return cmd, environ, temporary


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
    args = parser.parse_args(argv)
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
        for path in temporary:
            os.unlink(path)
        return 0
    proc = subprocess.Popen(cmd, env=environ)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # mpiexec forwards it to the ranks
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    finally:
        for path in temporary:
            try:
                os.unlink(path)
            except OSError:
                pass
    if args.timeline_filename:
        _merge_timeline(os.path.abspath(args.timeline_filename))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
