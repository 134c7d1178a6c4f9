"""Command line: ``python -m hvd_partial info`` and ``python -m hvd_partial timeline-merge``.

``info`` prints the version, the MPI library and its vendor, the thread level
MPI grants, which frameworks import, and the effective configuration with
where each value comes from (default, ``HVD_PARTIAL_*``, ``HOROVOD_*``). A
malformed setting makes it exit with status 2 and a message naming the
variable.

Examples::

    python -m hvd_partial info
    python -m hvd_partial info --json
    HVD_PARTIAL_MODE=majority python -m hvd_partial info --quick
    python -m hvd_partial timeline-merge /tmp/tl.json      # /tmp/tl.rank*.json -> /tmp/tl.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from dataclasses import asdict

FRAMEWORKS = (("torch", "torch", "hvd_partial.torch"), ("tensorflow", "tensorflow", "hvd_partial.tensorflow"),
              ("keras", "keras", "hvd_partial.keras"), ("horovod", "horovod", None))


def _version(distribution_names) -> str | None:
    for name in distribution_names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def framework_info(quick: bool = False) -> dict:
    """For each framework: installed version, whether it (and our adapter) imports."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = {}
    for label, module, adapter in FRAMEWORKS:
        dists = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow_cpu")}.get(label, (label,))
        entry = {"installed": _version(dists), "importable": False, "adapter": adapter}
        if importlib.util.find_spec(module) is None:
            entry["error"] = "not installed"
        elif quick:
            entry["importable"] = None  # not tried
        else:
            try:
                imported = importlib.import_module(module)
                entry["importable"] = True
                entry["version"] = getattr(imported, "__version__", entry["installed"])
                if adapter:
                    importlib.import_module(adapter)
                    entry["adapter_importable"] = True
            except Exception as err:  # noqa: BLE001 - report whatever breaks the import
                entry["error"] = f"{type(err).__name__}: {err}"
                if entry["importable"] and adapter:
                    entry["adapter_importable"] = False
        out[label] = entry
    return out


def mpi_info() -> dict:
    from mpi4py import MPI

    from .launch.mpiexec import detect_flavor, find_mpiexec
    from .transport.mpi import thread_level_name

    vendor, vendor_version = MPI.get_vendor()
    info = {
        "mpi4py": _version(("mpi4py",)),
        "library": MPI.Get_library_version().strip().splitlines()[0],
        "vendor": f"{vendor} {'.'.join(map(str, vendor_version))}",
        "standard": ".".join(map(str, MPI.Get_version())),
        "thread_level": thread_level_name(MPI.Query_thread()),
        "thread_level_ok": MPI.Query_thread() >= MPI.THREAD_SERIALIZED,
    }
    try:
        exe = find_mpiexec()
        info["mpiexec"] = exe
        info["mpiexec_flavor"] = detect_flavor(exe).value
    except FileNotFoundError as err:
        info["mpiexec"] = None
        info["mpiexec_error"] = str(err)
    return info


def launcher_info(environ=None) -> dict:
    """What started this process, from the environment: Slurm, horovodrun, an MPI launcher."""
    environ = os.environ if environ is None else environ
    out = {}
    if "SLURM_JOB_ID" in environ:
        out["slurm"] = {"job_id": environ["SLURM_JOB_ID"], "ntasks": environ.get("SLURM_NTASKS"),
                        "procid": environ.get("SLURM_PROCID"), "nodelist": environ.get("SLURM_JOB_NODELIST"),
                        "step": "SLURM_STEP_ID" in environ}
    if "HOROVOD_RANK" in environ or "HOROVOD_SIZE" in environ:
        out["horovodrun"] = {"rank": environ.get("HOROVOD_RANK"), "size": environ.get("HOROVOD_SIZE"),
                             "controller": environ.get("HOROVOD_CONTROLLER", "")}
    for name, key in (("open_mpi", "OMPI_COMM_WORLD_RANK"), ("hydra", "PMI_RANK"), ("pmix", "PMIX_RANK")):
        if key in environ:
            out["mpi_launcher"] = {"kind": name, "rank": environ[key]}
            break
    return out


def config_info() -> dict:
    from .config import load_config
    from .config import config_sources

    cfg = load_config()
    sources = config_sources(os.environ)
    return {name: {"value": value, "source": sources.get(name, "default")} for name, value in asdict(cfg).items()}


def gather(quick: bool = False) -> dict:
    from . import __version__

    config = config_info()  # first: a malformed setting fails before the slow framework imports
    return {"hvd_partial": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "mpi": mpi_info(), "launcher": launcher_info(), "frameworks": framework_info(quick), "config": config}


def _print_text(info: dict) -> None:
    print(f"hvd_partial {info['hvd_partial']}  (Python {info['python']}, {info['platform']})")
    mpi = info["mpi"]
    print("MPI:")
    print(f"  library       {mpi['library']}")
    print(f"  vendor        {mpi['vendor']} (MPI {mpi['standard']}, mpi4py {mpi['mpi4py']})")
    ok = "ok" if mpi["thread_level_ok"] else "TOO LOW: the engine needs MPI_THREAD_SERIALIZED or more"
    print(f"  thread level  {mpi['thread_level']} ({ok})")
    print(f"  mpiexec       {mpi.get('mpiexec') or mpi.get('mpiexec_error')}"
          + (f" ({mpi['mpiexec_flavor']})" if mpi.get("mpiexec") else ""))
    launcher = info.get("launcher") or {}
    print("Launcher:")
    if not launcher:
        print("  none detected (started directly, or by an mpiexec that sets none of the variables looked for)")
    slurm = launcher.get("slurm")
    if slurm:
        where = "inside an srun step" if slurm["step"] else "in an allocation, outside srun"
        print(f"  Slurm         job {slurm['job_id']}, {slurm['ntasks'] or '?'} tasks, nodes {slurm['nodelist']}, "
              f"{where}; run with: srun --mpi=pmi2 -n N python train.py (MPICH; pmix for Open MPI), "
              "or hvd-partial-run -np N inside the allocation")
    horovodrun = launcher.get("horovodrun")
    if horovodrun:
        print(f"  horovodrun    rank {horovodrun['rank']} of {horovodrun['size']}"
              + (f" ({horovodrun['controller']})" if horovodrun["controller"] else "")
              + "; hvd_partial needs MPI: horovodrun --mpi")
    mpi_launcher = launcher.get("mpi_launcher")
    if mpi_launcher:
        print(f"  MPI launcher  {mpi_launcher['kind']}, rank {mpi_launcher['rank']}")
    print("Frameworks:")
    for label, entry in info["frameworks"].items():
        if entry["importable"] is True:
            state = f"importable, {entry.get('version')}"
            if entry.get("adapter"):
                state += f"; {entry['adapter']} " + ("importable" if entry.get("adapter_importable") else
                                                      f"FAILS: {entry.get('error')}")
        elif entry["importable"] is None:
            state = f"installed {entry['installed']} (import not tried: --quick)"
        else:
            state = entry.get("error", "not importable")
        print(f"  {label:<11} {state}")
    print("Configuration (effective on this process):")
    for name, entry in info["config"].items():
        print(f"  {name:<26} {entry['value']!r:<24} {entry['source']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvd_partial")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="version, MPI, frameworks and the effective configuration")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.add_argument("--quick", action="store_true", help="do not import the frameworks")
    p_merge = sub.add_parser("timeline-merge", help="merge the per-rank timeline files into one trace")
    p_merge.add_argument("filename", help="the timeline name given to the job (e.g. /tmp/tl.json)")
    p_merge.add_argument("-o", "--output", help="the merged file (default: filename)")
    args = parser.parse_args(argv)

    if args.command == "timeline-merge":
        from .observe.timeline import merge

        try:
            out, files, events = merge(args.filename, args.output)
        except FileNotFoundError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{out}: {events} events from {files} rank files")
        return 0

    from .errors import ConfigError

    try:
        info = gather(quick=args.quick)
    except ConfigError as err:
        print(f"error: invalid hvd_partial configuration: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        _print_text(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
