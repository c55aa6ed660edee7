"""Fixtures that start REAL worker processes (no mocked transport, no mocked pool).

The backend is scikit-learn on CPU unless SKLEARN_GPU_BRIDGE_TEST_BACKEND=cuml
(the GPU machine). Every wait has a timeout, and a worker's log is printed
when a test using it fails.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.client import ENV_CONNECTION_FILE
from sklearn_gpu_bridge.connect import read_connection_file

BACKEND = os.environ.get("SKLEARN_GPU_BRIDGE_TEST_BACKEND", "sklearn")


def _has_cuml():
    try:
        import cuml  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means cuML is not usable
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if BACKEND == "cuml" and _has_cuml():
        return
    skip = pytest.mark.skip(reason="needs cuML and an NVIDIA GPU (run with SKLEARN_GPU_BRIDGE_TEST_BACKEND=cuml)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class WorkerProcess:
    """A worker subprocess on a free loopback port with its own fresh key."""

    def __init__(self, folder, backend=BACKEND, extra_args=()):
        self.folder = Path(folder)
        self.connection_file = self.folder / "worker.json"
        self.log_file = self.folder / "worker.log"
        command = [
            sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", backend,
            "--connection-file", str(self.connection_file), "--log-level", "INFO", *extra_args,
        ]
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.folder)
        deadline = time.monotonic() + 300
        while not self.connection_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"worker did not start:\n{self.log()}")
            time.sleep(0.05)
        self.info = read_connection_file(self.connection_file)

    def log(self):
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop(self):
        """SIGINT first (a clean stop), SIGKILL if it does not go within 10 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name in ("worker", "fresh_worker"):
            worker = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if isinstance(worker, WorkerProcess):
                report.sections.append((f"{name} log", worker.log()[-5000:]))
    return report


def use_worker(worker):
    """Point this process (and the joblib children it starts) at ``worker``."""
    sklearn_gpu_bridge.reset_connection()
    sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False)
    os.environ[ENV_CONNECTION_FILE] = str(worker.connection_file)


@pytest.fixture(scope="session")
def worker(tmp_path_factory):
    """The shared worker of the session; every test talks to it by default."""
    process = WorkerProcess(tmp_path_factory.mktemp("worker"))
    yield process
    sklearn_gpu_bridge.reset_connection()
    process.stop()


@pytest.fixture(autouse=True)
def _bridge_to_worker(worker):
    use_worker(worker)
    yield


@pytest.fixture
def fresh_worker(tmp_path, worker):
    """A worker of this test alone (for tests that kill or restart it)."""
    process = WorkerProcess(tmp_path)
    use_worker(process)
    yield process
    sklearn_gpu_bridge.reset_connection()
    process.stop()
    use_worker(worker)


@pytest.fixture
def connection(worker):
    return sklearn_gpu_bridge.get_connection()


def assert_same(bridged, direct):
    """Exactly equal on the scikit-learn backend; cuML (float32, other solvers) within tolerance."""
    bridged, direct = np.asarray(bridged), np.asarray(direct)
    assert bridged.shape == direct.shape
    if BACKEND == "sklearn":
        np.testing.assert_array_equal(bridged, direct)
    else:
        np.testing.assert_allclose(bridged, direct, rtol=1e-3, atol=1e-3)
