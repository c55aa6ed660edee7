"""The local worker kept warm between scripts: found by the next one, stopped by `stop` or by its idle time."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from sklearn_gpu_bridge.runtime.connection_file import start_lock_path
from sklearn_gpu_bridge.runtime.private_files import ExclusiveLock, pid_alive, terminate

from .conftest import RawClient, WorkerProcess, bare_env, wait_until

_SCRIPT = textwrap.dedent("""
    import json, os, time, warnings
    import numpy as np
    import sklearn_gpu_bridge
    from sklearn_gpu_bridge import GPUStandardScaler
    warnings.simplefilter("ignore")
    X = np.ones((20, 3))
    started = time.perf_counter()
    GPUStandardScaler().fit(X)
    first_fit = time.perf_counter() - started
    connection = sklearn_gpu_bridge.get_connection()
    print(json.dumps({"pid": connection.info.pid, "file": os.environ["SKLEARN_GPU_BRIDGE_CONNECTION_FILE"],
                      "first_fit": first_fit}))
""")


@pytest.fixture
def warm_env(tmp_path):
    """A new user's environment with its own runtime folder; any worker left warm there is stopped after."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = bare_env(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(run), SKLEARN_GPU_BRIDGE_LOCAL_BACKEND="sklearn",
                   SKLEARN_GPU_BRIDGE_LOCAL_WORKER_IDLE="60")
    yield env
    for path in (run / "sklearn-gpu-bridge").glob("local-*.json"):
        try:
            pid = json.loads(path.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            continue
        if pid_alive(pid):
            terminate(pid, 5.0)


def _script(env, **extra):
    run = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=240,
                         env={**env, **extra}, cwd=env["HOME"])
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _cli(env, *args):
    return subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=env["HOME"])


def test_the_next_script_finds_the_worker_warm_and_stop_ends_it(warm_env):
    first = _script(warm_env)
    assert pid_alive(first["pid"]), "the worker stopped with the script that started it"
    second = _script(warm_env)
    assert second["pid"] == first["pid"] and second["file"] == first["file"]
    status = _cli(warm_env, "status")
    assert status.returncode == 0 and str(first["pid"]) in status.stdout and "without clients" in status.stdout
    stop = _cli(warm_env, "stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_until(lambda: not pid_alive(first["pid"]), 10)
    assert not os.path.exists(first["file"])


def test_a_script_with_other_worker_settings_gets_a_worker_of_its_own(warm_env):
    """The worker reads its options from the environment it starts in: a script that sets others is not
    handed a worker that ignores them."""
    first = _script(warm_env)
    other = _script(warm_env, SKLEARN_GPU_BRIDGE_WORKER_THREADS="2")
    assert other["pid"] != first["pid"]


def test_the_worker_stops_by_itself_after_its_idle_time(warm_env):
    report = _script(warm_env, SKLEARN_GPU_BRIDGE_LOCAL_WORKER_IDLE="1")
    assert wait_until(lambda: not pid_alive(report["pid"]), 30), "the idle worker did not stop"
    assert not os.path.exists(report["file"])


def test_an_idle_worker_waits_while_a_client_holds_its_start_lock(warm_env):
    """A client that has found the worker holds the start lock until it has connected: the worker, idle,
    does not stop under it (it would leave that client without a worker)."""
    report = _script(warm_env, SKLEARN_GPU_BRIDGE_LOCAL_WORKER_IDLE="1")
    with ExclusiveLock(start_lock_path(report["file"]), 5):
        time.sleep(3)  # past its idle time, and a sweep
        assert pid_alive(report["pid"]) and os.path.exists(report["file"])
    assert wait_until(lambda: not pid_alive(report["pid"]), 30)


def test_messages_without_the_key_do_not_keep_an_idle_worker_alive(tmp_path):
    """A peer past the socket's gate that cannot sign (another key) sends all the while: the worker still stops
    after its idle time, since only a message that passes its signature counts as use."""
    process = WorkerProcess(tmp_path, bind="127.0.0.1", idle_exit=2)
    hostile = RawClient(process, key=os.urandom(32), name="hostile")
    try:
        deadline = time.monotonic() + 30
        while process.process.poll() is None and time.monotonic() < deadline:
            hostile.send_header(hostile.header("ping"))
            time.sleep(0.2)
        assert process.process.poll() is not None, "unsigned messages kept the idle worker alive"
    finally:
        hostile.close()
        process.stop()
