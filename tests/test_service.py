"""start / stop / status / doctor for real: detached worker processes, the default connection file
in a temporary HOME / XDG_RUNTIME_DIR, the command line as a user types it.

On Windows the same code runs the worker through wsl.exe; here a stand-in
``wsl.exe`` (a script that parses WSL's documented command line and runs
the Linux part) lets ``start --wsl``, ``doctor`` and ``stop`` run for real.
"""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import sklearn_gpu_bridge
from sklearn_gpu_bridge.cli import main as cli_main
from sklearn_gpu_bridge.manage import doctor, service
from sklearn_gpu_bridge.manage.state_file import read_state, state_path
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION
from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
from sklearn_gpu_bridge.runtime.private_files import exited, pid_alive

from .conftest import bare_env


def _env(home):
    env = bare_env()
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home))
    return env


def cli(env, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=env["HOME"])


def _kill(pid):
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _wait_gone(pid, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if exited(pid):
            return True
        time.sleep(0.05)
    return False


class Background:
    def __init__(self, home):
        self.home = home
        self.env = _env(home)
        self.connection_file = home / "sklearn-gpu-bridge" / "worker.json"
        self.log_file = home / "sklearn-gpu-bridge" / "worker.log"
        self.started = cli(self.env, "start", "--backend", "sklearn", "--log-level", "DEBUG")
        self.pid = read_connection_file(self.connection_file).pid if self.connection_file.exists() else None


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    """A worker started by ``sklearn-gpu-bridge start`` with the default file in a temporary home."""
    bg = Background(tmp_path_factory.mktemp("home"))
    yield bg
    cli(bg.env, "stop", "--timeout", "5")
    _kill(bg.pid)


def test_start_detaches_a_worker_and_leaves_the_file_where_clients_look(background):
    assert background.started.returncode == 0, background.started.stderr
    assert "started in" in background.started.stdout
    assert background.connection_file.exists()  # $XDG_RUNTIME_DIR/sklearn-gpu-bridge/worker.json
    assert stat.S_IMODE(background.connection_file.stat().st_mode) == 0o600
    assert pid_alive(background.pid)  # outlived the `start` process
    assert os.getsid(background.pid) != os.getsid(0)  # its own session: no SIGHUP from this terminal
    log = background.log_file.read_text()
    assert "starting: " in log and "-m sklearn_gpu_bridge.worker" in log and "worker ready on ipc://" in log
    assert stat.S_IMODE(background.log_file.stat().st_mode) == 0o600


def test_start_again_says_already_running(background):
    again = cli(background.env, "start", "--backend", "sklearn")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout and f"pid {background.pid}" in again.stdout


def test_start_drives_the_gpus_it_is_given(tmp_path):
    """``start --gpus 0,1``: the background worker drives both (simulated on the scikit-learn backend)."""
    env = _env(tmp_path)
    started = cli(env, "start", "--backend", "sklearn", "--gpus", "0,1")
    try:
        assert started.returncode == 0, started.stderr
        status = json.loads(cli(env, "status", "--json").stdout)
        assert [gpu["index"] for gpu in status["gpus"]] == [0, 1]
    finally:
        stopped = cli(env, "stop", "--timeout", "5")
    assert stopped.returncode == 0, stopped.stderr


def test_a_client_uses_the_background_worker_by_default(background):
    script = textwrap.dedent("""
        import json, numpy as np, sklearn_gpu_bridge
        from sklearn_gpu_bridge import GPUStandardScaler
        X = np.random.default_rng(0).normal(size=(20000, 8))
        GPUStandardScaler().fit_transform(X)
        conn = sklearn_gpu_bridge.get_connection()
        print(json.dumps({"pid": conn.info.pid, "stats": dict(conn.stats)}))
    """)
    run = subprocess.run([sys.executable, "-c", script], env=background.env, capture_output=True, text=True,
                         timeout=120, cwd=background.home)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["pid"] == background.pid  # no local worker of its own
    assert report["stats"].get("sent_pool")  # same host: arrays through shared memory


def test_status_shows_what_the_worker_says_and_where_its_log_is(background):
    run = cli(background.env, "status")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for expected in (f"running, pid {background.pid}, up ", "backend     sklearn", "scikit-learn ",
                     "sklearn-gpu-bridge 0.1.0", "handles     ", "GPU         none reported",
                     "transport   pool in shared memory (sealed memfd)", f"log file    {background.log_file}",
                     f"connection  {background.connection_file}"):
        assert expected in out, out
    as_json = service.status(connection_file=background.connection_file)
    assert as_json["running"] and as_json["backend"] == "sklearn" and as_json["uptime"] > 0
    assert as_json["versions"]["scikit-learn"] and as_json["log_file"] == str(background.log_file)
    assert as_json["transport"] == {"path": "pool", "pool_directory": None, "kind": "memfd"}
    assert as_json["requests"]["fit"] >= 1 and as_json["handles"] == 0  # the client above released its handle


def test_options_and_settings_come_from_the_environment(background, tmp_path):
    """Click's SKLEARN_GPU_BRIDGE_<COMMAND>_<OPTION>, and the settings shared with the client."""
    sklearn_gpu_bridge.set_config(connection_file=None)  # the suite's own worker; reset for the next test
    runner = CliRunner()
    base = {**background.env, "SKLEARN_GPU_BRIDGE_CONNECTION_FILE": None}  # None: unset while invoked
    elsewhere = tmp_path / "other.json"
    for variable in ("SKLEARN_GPU_BRIDGE_STATUS_CONNECTION_FILE", "SKLEARN_GPU_BRIDGE_CONNECTION_FILE"):
        run = runner.invoke(cli_main, ["status"], env={**base, variable: str(elsewhere)})
        assert run.exit_code == 1 and f"no connection file at {elsewhere}" in run.output
    run = runner.invoke(cli_main, ["status"], env=base)  # XDG_RUNTIME_DIR: the default file is the module's worker
    assert run.exit_code == 0 and f"pid {background.pid}" in run.output
    env = {**base, "SKLEARN_GPU_BRIDGE_TRANSPORT": "frames"}
    run = runner.invoke(cli_main, ["status", "--json"], env=env)
    assert run.exit_code == 0, run.output
    assert json.loads(run.output)["transport"]["path"] == "frames"
    with sklearn_gpu_bridge.config_context(transport="frames", connection_file=str(background.connection_file)):
        assert service.status()["transport"]["path"] == "frames"  # the Python API reads set_config too


def test_doctor_checks_each_link_and_measures_each_path(background):
    run = cli(background.env, "doctor", "--quick")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for expected in ("[-   ] WSL: not used here", "[ok  ] worker Python:", "[ok  ] sklearn-gpu-bridge (worker): 0.1.0",
                     "[ok  ] connection file:", "[ok  ] worker reachable:", "[ok  ] key accepted:",
                     f"[ok  ] protocol: protocol {PROTOCOL_VERSION}", "[warn] backend: sklearn",
                     "[ok  ] transport frames (ZeroMQ messages): round trip 1 MB",
                     "[ok  ] transport pool default (shared memory): round trip 1 MB", "[ok  ] transport chosen:",
                     "all checks passed"):
        assert expected in out, out
    assert "fix: " in out  # the CPU backend's warning says how to get cuML
    status = service.status(connection_file=background.connection_file)
    measured = status["transport_measured"]
    assert measured["worker"]["pid"] == background.pid
    assert {r["name"] for r in measured["results"]} == {"frames", "default"}
    assert "measured" in status["transport_reason"]


def test_doctor_names_the_fix_for_a_foreign_key_and_a_stale_file(background, tmp_path):
    data = json.loads(background.connection_file.read_text())
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({**data, "key": "00" * 32}))
    os.chmod(foreign, 0o600)
    run = cli(background.env, "doctor", "--no-measure", "--connection-file", str(foreign))
    assert run.returncode == 1
    assert "[FAIL] key accepted" in run.stdout
    assert (f"fix: sklearn-gpu-bridge stop --connection-file {foreign}, "
            f"then: sklearn-gpu-bridge start --connection-file {foreign}") in run.stdout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**data, "address": f"tcp://127.0.0.1:{free_port}"}))
    os.chmod(stale, 0o644)  # readable by others: refused, with the command that fixes it
    result = doctor.run(connection_file=stale, measure=False)
    checks = {c["name"]: c for c in result["checks"]}
    assert not result["ok"]
    assert checks["connection file"]["status"] == "fail" and checks["connection file"]["fix"] == f"chmod 600 {stale}"
    os.chmod(stale, 0o600)
    checks = {c["name"]: c for c in doctor.run(connection_file=stale, measure=False)["checks"]}
    assert checks["worker reachable"]["status"] == "fail" and "stale" in checks["worker reachable"]["detail"]
    missing = doctor.run(connection_file=tmp_path / "absent.json", measure=False)
    fix = {c["name"]: c for c in missing["checks"]}["connection file"]["fix"]
    assert fix == f"sklearn-gpu-bridge start --connection-file {tmp_path / 'absent.json'}"


def test_stop_then_status_then_stop_again(background):
    """Last of the module's tests: it stops the module's worker."""
    env, pid = background.env, background.pid
    run = cli(env, "stop")
    assert run.returncode == 0, run.stderr
    assert f"stopped the worker (pid {pid}) by shutdown request" in run.stdout
    assert _wait_gone(pid) and not background.connection_file.exists()
    assert not state_path(background.connection_file).exists()  # what start made goes, but the log
    assert f"its log is kept: {background.log_file}" in run.stdout
    assert "worker stopped" in background.log_file.read_text()
    status = service.status(connection_file=background.connection_file)
    assert not status["running"] and status["log_file"] == str(background.log_file)  # the log outlives the worker
    assert "not running" in service.format_status(status)
    run = cli(env, "stop")
    assert run.returncode == 0 and "no worker running" in run.stdout


def test_python_api_a_hung_worker_is_refused_by_start_and_stopped_by_signals(tmp_path):
    connection_file = tmp_path / "w.json"
    result = service.start(backend="sklearn", connection_file=connection_file, log_level="WARNING")
    pid = result["pid"]
    try:
        assert result["running"] and result["log_file"] == str(tmp_path / "w.log")
        sock = Path(read_connection_file(connection_file).address[len("ipc://"):])
        bell = sock.with_suffix(".bell")  # the worker's doorbell (a datagram socket) beside its socket
        assert stat.S_ISSOCK(sock.lstat().st_mode) and stat.S_ISSOCK(bell.lstat().st_mode)
        os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
        with pytest.raises(service.ServiceError, match="does not answer; stop it with"):
            service.start(backend="sklearn", connection_file=connection_file)
        stopped = service.stop(connection_file=connection_file, timeout=1.0)
        assert stopped["stopped"] and stopped["how"] == "signals"
        assert _wait_gone(pid)
        assert not sock.exists() and not bell.exists()  # what a killed worker leaves, tidied by stop
    finally:
        _kill(pid)


def _cuml_importable():
    try:
        import cuml  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    return True


@pytest.mark.skipif(_cuml_importable(), reason="cuML is importable here: a cuml worker would start, not fail")
def test_start_reports_a_worker_that_dies_with_the_end_of_its_log(tmp_path):
    with pytest.raises(service.ServiceError) as caught:
        service.start(backend="cuml", connection_file=tmp_path / "w.json", startup_timeout=120)
    message = str(caught.value)
    assert "exited with code" in message and str(tmp_path / "w.log") in message and "cuml" in message


FAKE_WSL = '''#!{python}
"""A stand-in for wsl.exe: parses WSL's documented options and runs the Linux command here."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_WSL_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if args == ["--status"]:
    sys.stdout.buffer.write("Default Distribution: FakeLinux\\r\\nDefault Version: 2\\r\\n".encode("utf-16-le"))
    sys.exit(0)
if args == ["--list", "--verbose"]:
    text = "  NAME         STATE      VERSION\\r\\n* FakeLinux    Running    2\\r\\n  Old   Stopped   1\\r\\n"
    sys.stdout.buffer.write(text.encode("utf-16-le"))
    sys.exit(0)
distro = None
while args and args[0] != "--exec":
    if args[0] in ("-d", "--distribution"):
        distro, args = args[1], args[2:]
    elif args[0] in ("-u", "--user"):
        args = args[2:]
    elif args[0] == "--cd":
        os.chdir(os.path.expanduser(args[1]))
        args = args[2:]
    else:
        sys.stderr.buffer.write(f"unknown option {{args[0]}}".encode("utf-16-le"))
        sys.exit(1)
if distro not in (None, "FakeLinux"):
    sys.stderr.buffer.write("There is no distribution with the supplied name.".encode("utf-16-le"))
    sys.exit(1)
os.environ["WSL_DISTRO_NAME"] = "FakeLinux"
os.execvp(args[1], args[1:])
'''


@pytest.fixture
def fake_wsl(tmp_path, monkeypatch):
    exe = tmp_path / "wsl.exe"
    exe.write_text(FAKE_WSL.format(python=sys.executable))
    exe.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_WSL_CALLS", str(calls))
    monkeypatch.setenv("HOME", str(tmp_path / "linux-home"))
    (tmp_path / "linux-home").mkdir()
    return exe, calls


def test_start_wsl_doctor_and_stop_through_wsl_exe(tmp_path, fake_wsl):
    exe, calls = fake_wsl
    connection_file = tmp_path / "LocalAppData" / "sklearn-gpu-bridge" / "worker.json"
    result = service.start(backend="sklearn", connection_file=connection_file, use_wsl=True, distro="FakeLinux",
                           python=sys.executable, wsl_exe=str(exe), windows=False, device_memory="cuda")
    linux_pid = result["pid"]
    state = read_state(connection_file)
    try:
        assert result["running"] and result["wsl"]["distro"] == "FakeLinux"
        assert result["log_file"] == str(connection_file.with_suffix(".log"))
        probe_call, worker_call = [json.loads(line) for line in calls.read_text().splitlines()[:2]]
        assert probe_call[:6] == ["-d", "FakeLinux", "--cd", "~", "--exec", sys.executable]
        assert probe_call[6] == "-c" and probe_call[7].startswith("exec(bytes.fromhex('")
        assert worker_call[6:8] == ["-m", "sklearn_gpu_bridge.worker"]
        assert worker_call[worker_call.index("--connection-file") + 1] == str(connection_file)
        assert worker_call[worker_call.index("--device-memory") + 1] == "cuda"  # the worker's setting, passed on
        shared_pool = str(connection_file.parent / "pool")
        assert shared_pool in [worker_call[i + 1] for i, a in enumerate(worker_call) if a == "--pool-dir"]
        assert (tmp_path / "linux-home" / ".cache" / "sklearn-gpu-bridge" / "pool").is_dir()  # made by the probe
        # the worker runs in the foreground of "wsl.exe" (here: the same process, exec'ed)
        assert state["pid"] == linux_pid and state["wsl"]["python"] == sys.executable
        measured = result["transport_measured"]
        by_name = {r["name"]: r for r in measured["results"]}
        assert by_name["frames"]["coherent"] and by_name["windows-disk"]["coherent"]
        assert by_name["windows-disk"]["pool_directory"] == shared_pool
        assert result["transport"]["path"] == ("frames" if measured["choice"] == "frames" else "pool")

        report = doctor.run(connection_file=connection_file, quick=True, windows=False, wsl_exe=str(exe))
        checks = {c["name"]: c for c in report["checks"]}
        assert report["ok"], report["checks"]
        assert checks["WSL"]["status"] == "ok"
        assert checks["distribution"]["detail"].startswith("FakeLinux (WSL 2, running, default)")
        assert "WSL FakeLinux" in checks["worker Python"]["detail"]
        assert checks["transport pool windows-disk (" + shared_pool + ")"]["status"] == "ok"

        wrong = doctor.run(connection_file=connection_file, measure=False, windows=False, wsl_exe=str(exe),
                           distro="Nope")
        checks = {c["name"]: c for c in wrong["checks"]}
        assert checks["distribution"]["status"] == "fail"
        assert checks["distribution"]["fix"].startswith("wsl --install -d Nope")

        stopped = service.stop(connection_file=connection_file)
        assert stopped["stopped"] and stopped["how"] == "shutdown request"
        assert _wait_gone(linux_pid) and not connection_file.exists()
    finally:
        _kill(linux_pid)


def test_start_wsl_without_the_package_there_names_the_install_command(tmp_path, fake_wsl):
    exe, _ = fake_wsl
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")  # no site-packages: no sklearn_gpu_bridge
    bare.chmod(0o755)
    with pytest.raises(service.ServiceError) as caught:
        service.start(connection_file=tmp_path / "w.json", use_wsl=True, python=str(bare), wsl_exe=str(exe),
                      windows=False)
    assert f'wsl -- {bare} -m pip install "sklearn-gpu-bridge[worker-cu12]==' in str(caught.value)
    assert not Path(tmp_path / "w.json").exists()
