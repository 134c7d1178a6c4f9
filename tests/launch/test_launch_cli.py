"""hvd-partial-run and python -m hvd_partial info: command lines for both MPI
flavors, host lists, settings validation, and real runs under mpiexec."""

import json
import os
import stat
import sys

import pytest

from procs import ROOT, assert_no_leftovers, run_command, token

from hvd_partial.launch import cli
from hvd_partial.launch.hostfile import (Host, HostfileError, format_hostfile, parse_hostfile, parse_hosts)
from hvd_partial.launch.mpiexec import MpiFlavor, detect_flavor

WORKERS = ROOT / "tests" / "workers"


def fake_mpiexec(tmp_path, banner: str) -> str:
    path = tmp_path / "mpiexec"
    path.write_text(f"#!/bin/sh\necho '{banner}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def command_for(argv, environ=None):
    args = cli.build_parser().parse_args(argv)
    cmd, env, temporary = cli.build_command(args, environ if environ is not None else {})
    return cmd, env, temporary


# ===== command lines ==============================================================

def test_mpich_command_line_carries_settings_and_hosts(tmp_path):
    exe = fake_mpiexec(tmp_path, "HYDRA build details: Version: 4.2")
    detect_flavor.cache_clear()
    cmd, env, _ = command_for(["--mpiexec", exe, "-np", "4", "-H", "a:2,b:2", "--mode", "majority", "--quorum",
                               "2", "--seed", "9", "--max-staleness", "3", "--timeline-filename", "tl.json",
                               "--stall-check-warning-time-seconds", "30", "--fusion-threshold-mb", "2",
                               "--mpi-args", "-ppn 2", "python", "train.py", "--lr", "0.1"])
    assert cmd[0] == exe and cmd[1:3] == ["-bind-to", "none"]
    assert cmd[cmd.index("-hosts") + 1] == "a:2,b:2"
    assert cmd[-6:] == ["-n", "4", "python", "train.py", "--lr", "0.1"]
    genv = {cmd[i + 1]: cmd[i + 2] for i, word in enumerate(cmd) if word == "-genv"}
    assert genv == {"HVD_PARTIAL_MODE": "majority", "HVD_PARTIAL_QUORUM": "2", "HVD_PARTIAL_SEED": "9",
                    "HVD_PARTIAL_MAX_STALENESS": "3", "HVD_PARTIAL_TIMELINE_FILENAME": os.path.abspath("tl.json"),
                    "HVD_PARTIAL_STALL_WARNING_SECONDS": "30.0", "HVD_PARTIAL_FUSION_THRESHOLD_BYTES": "2097152"}
    assert env["HVD_PARTIAL_MODE"] == "majority"
    assert cmd.index("-ppn") < cmd.index("-n")  # extra mpiexec args go before the program
    assert "--oversubscribe" not in cmd


def test_open_mpi_command_line_and_hostfile_format(tmp_path):
    exe = fake_mpiexec(tmp_path, "mpirun (Open MPI) 5.0.8")
    detect_flavor.cache_clear()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4\nnode2:2   # mpich style\nnode3\n")
    cmd, env, temporary = command_for(["--mpiexec", exe, "--hostfile", str(hostfile), "--no-stall-check",
                                       "python", "t.py"])
    try:
        assert "--oversubscribe" in cmd and cmd[cmd.index("--bind-to") + 1] == "none"
        assert cmd[cmd.index("-n") + 1] == "7"  # the slots, without -np
        written = open(cmd[cmd.index("--hostfile") + 1]).read()
        assert written == "node1 slots=4\nnode2 slots=2\nnode3 slots=1\n"
        exported = [cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"]
        assert set(exported) == {"HVD_PARTIAL_STALL_WARNING_SECONDS", "HVD_PARTIAL_STALL_SHUTDOWN_SECONDS"}
        assert env["HVD_PARTIAL_STALL_WARNING_SECONDS"] == "0"  # -x exports the value from this env
    finally:
        for path in temporary:
            os.unlink(path)
    detect_flavor.cache_clear()


def test_host_lists_parse_and_reject_nonsense(tmp_path):
    assert parse_hosts("a:2,b") == [Host("a", 2), Host("b", 1)]
    assert format_hostfile([Host("a", 2)], MpiFlavor.MPICH) == "a:2\n"
    with pytest.raises(HostfileError, match="slots must be an integer"):
        parse_hosts("a:two")
    with pytest.raises(HostfileError, match="slots must be >= 1"):
        parse_hosts("a:0")
    bad = tmp_path / "h"
    bad.write_text("node1 cpus=4\n")
    with pytest.raises(HostfileError, match=r"h:1 .*unknown field 'cpus=4'"):
        parse_hostfile(str(bad))


@pytest.mark.parametrize("argv, message", [
    (["-np", "2", "--quorum", "2", "python", "x.py"], "quorum applies to mode='majority' only"),
    (["-np", "2", "--stall-check-warning-time-seconds", "10", "--stall-check-shutdown-time-seconds", "5",
      "python", "x.py"], "stall_shutdown_seconds must be 0 or >= stall_warning_seconds"),
    (["-np", "2"], "no program given"),
    (["python", "x.py"], "give -np N"),
    (["-np", "2", "-H", "a:1", "--hostfile", "f", "python", "x.py"], "not both"),
])
def test_bad_settings_fail_before_launch_with_a_named_problem(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_malformed_environment_variable_fails_the_launch(monkeypatch, capsys):
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "64MB")
    assert cli.main(["-np", "2", "--dry-run", "python", "x.py"]) == 2
    assert "HOROVOD_FUSION_THRESHOLD='64MB'" in capsys.readouterr().err


# ===== real runs ====================================================================

@pytest.mark.mpi
def test_launcher_runs_a_job_with_the_partial_settings(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "-np", "3", "--mode", "majority", "--seed",
                       "5", "--quorum", "2", "--max-staleness", "3", "--stall-check-warning-time-seconds", "20",
                       sys.executable, str(WORKERS / "observe_cases.py"), "default_mode"],
                      timeout=90, env={"HVD_TEST_OUT": str(out)})
    assert res.returncode == 0, res.stderr[-3000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]
    for rep in reports:
        assert (rep["mode"], rep["seed"], rep["quorum"], rep["max_staleness"], rep["stall"]) == \
               ("majority", 5, 2, 3, 20.0)
        assert rep["size"] == 3
        assert rep["initiators"]  # the designated initiators of majority (checked by each rank)
    assert reports[0]["initiators"] == reports[1]["initiators"] == reports[2]["initiators"]


@pytest.mark.mpi
def test_launcher_merges_the_timeline(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    timeline = tmp_path / "tl.json"
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "-np", "2", "--timeline-filename",
                       str(timeline), sys.executable, str(WORKERS / "observe_cases.py"), "timeline"],
                      timeout=90, env={"HVD_TEST_OUT": str(out)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "timeline" in res.stderr and "2 rank files" in res.stderr
    merged = json.loads(timeline.read_text())["traceEvents"]
    assert {e["pid"] for e in merged} == {0, 1}
    assert sum(1 for e in merged if e["name"] == "reduction") >= 2 * 26


@pytest.mark.mpi
@pytest.mark.timing
def test_launcher_a_raising_rank_fails_the_job_naming_it_and_leaves_no_process(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    word = token()
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "-np", "3", sys.executable,
                       str(WORKERS / "launch_faults.py"), "raise", word], timeout=60, env={"HVD_TEST_OUT": str(out)})
    assert res.returncode != 0
    assert "injected failure in rank 1's training step" in res.stderr
    for r in (0, 2):
        rep = json.loads((out / f"rank{r}.json").read_text())
        assert rep.get("failed_rank") == 1 and "KeyError" in rep["error"], rep
        assert rep["seconds"] < 15  # told by rank 1, not found by the 30 s liveness timeout
    assert res.elapsed < 40
    assert_no_leftovers(word)


def test_info_reports_mpi_and_effective_configuration():
    env = {"HVD_PARTIAL_MODE": "majority", "HVD_PARTIAL_QUORUM": "2", "HOROVOD_TIMELINE": "/tmp/x.json",
           "HOROVOD_RANK": "0"}
    res = run_command([sys.executable, "-m", "hvd_partial", "info", "--json", "--quick"], timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["hvd_partial"]
    assert info["mpi"]["thread_level"] == "MPI_THREAD_MULTIPLE" and info["mpi"]["thread_level_ok"]
    assert info["mpi"]["mpiexec_flavor"] in ("mpich", "openmpi")
    assert info["config"]["mode"] == {"value": "majority", "source": "HVD_PARTIAL_MODE"}
    assert info["config"]["timeline_filename"] == {"value": "/tmp/x.json", "source": "HOROVOD_TIMELINE"}
    assert info["config"]["max_staleness"]["source"] == "default"
    assert set(info["frameworks"]) == {"torch", "tensorflow", "keras", "horovod"}


def test_info_names_a_malformed_variable():
    res = run_command([sys.executable, "-m", "hvd_partial", "info", "--quick"], timeout=60,
                      env={"HVD_PARTIAL_STALL_WARNING_SECONDS": "soon"})
    assert res.returncode == 2
    assert "HVD_PARTIAL_STALL_WARNING_SECONDS='soon'" in res.stderr


# ===== horovodrun's flags and environment ============================================

def test_horovodrun_tuning_flags_are_dropped_and_launch_changing_ones_refused():
    argv, dropped = cli.split_horovod_flags(["-np", "2", "--autotune", "--cache-capacity", "512",
                                             "--hierarchical-allreduce", "--fusion-threshold-mb", "8", "python",
                                             "train.py", "--autotune"])
    assert argv == ["-np=2", "--fusion-threshold-mb=8", "python", "train.py", "--autotune"]
    assert dropped == ["--autotune", "--cache-capacity", "512", "--hierarchical-allreduce"]
    for flag, reason in (["--gloo", "MPI only"], ["--blacklist-cooldown-range", "not blacklisted"],
                         ["--mpi-threads-disable", "engine thread"],
                         ["--config-file", "flags"]):
        with pytest.raises(cli.ConfigError, match=reason):
            cli.split_horovod_flags(["-np", "2", flag, "x", "python", "t.py"])


def test_horovodrun_ssh_network_and_output_flags_for_both_mpis(tmp_path):
    argv = ["-np", "2", "-p", "2222", "-i", "key", "--network-interface", "eth0",
            "--output-filename", str(tmp_path / "logs"), "python", "t.py"]
    exe = fake_mpiexec(tmp_path, "HYDRA build details: Version: 4.2")
    detect_flavor.cache_clear()
    cmd, _, _ = command_for(["--mpiexec", exe] + cli.split_horovod_flags(argv)[0])
    assert cmd[cmd.index("-launcher-exec") + 1] == "ssh -p 2222 -i key"
    assert cmd[cmd.index("-iface") + 1] == "eth0"
    assert cmd[cmd.index("-outfile-pattern") + 1] == str(tmp_path / "logs" / "rank.%r" / "stdout")
    assert (tmp_path / "logs" / "rank.1").is_dir()
    exe = fake_mpiexec(tmp_path, "mpirun (Open MPI) 5.0.8")
    detect_flavor.cache_clear()
    cmd, _, _ = command_for(["--mpiexec", exe] + cli.split_horovod_flags(argv)[0])
    mca = {cmd[i + 1]: cmd[i + 2] for i, word in enumerate(cmd) if word == "--mca"}
    assert mca == {"plm_rsh_args": "-p 2222 -i key", "btl_tcp_if_include": "eth0", "oob_tcp_if_include": "eth0"}
    assert cmd[cmd.index("--output-filename") + 1] == str(tmp_path / "logs")
    detect_flavor.cache_clear()


def test_version_flag_has_horovods_meaning(capsys):
    assert cli.main(["-v"]) == 0
    assert "hvd_partial" in capsys.readouterr().out


def test_a_process_started_by_horovodrun_gloo_stops_naming_the_fix():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_CONTROLLER": "gloo"}
    res = run_command([sys.executable, "-c", "import hvd_partial; hvd_partial.init()"], timeout=60, env=env)
    assert res.returncode != 0
    assert "ConfigError" in res.stderr and "rank 1 of 4 by horovodrun" in res.stderr
    assert "horovodrun --mpi -np 4" in res.stderr
    from hvd_partial.launch.horovod import check_launcher_environment

    check_launcher_environment(4, {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"})  # horovodrun --mpi: fine
    check_launcher_environment(1, {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"})  # one process: fine


def test_info_detects_slurm():
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_PROCID": "3"}
    res = run_command([sys.executable, "-m", "hvd_partial", "info", "--json", "--quick"], timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    slurm = json.loads(res.stdout)["launcher"]["slurm"]
    assert slurm["job_id"] == "42" and slurm["ntasks"] == "8" and slurm["procid"] == "3"
    res = run_command([sys.executable, "-m", "hvd_partial", "info", "--quick"], timeout=60, env=env)
    assert "srun --mpi=pmi2" in res.stdout


@pytest.mark.mpi
def test_verbose_shows_the_slow_rank_report_without_logging_configured(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import numpy as np\nimport hvd_partial as hvd\nhvd.init()\n"
                      "for _ in range(20):\n    hvd.partial_allreduce(np.ones(4, np.float32), 'g')\n"
                      "hvd.shutdown()\n")
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "-np", "2", "--verbose",
                       sys.executable, str(script)], timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "slow-rank report" in res.stderr and "INFO hvd_partial" in res.stderr
