"""Fixtures that start REAL worker processes (no mocked transport, no mocked pool).

The backend is scikit-learn on CPU unless SKLEARN_GPU_BRIDGE_TEST_BACKEND=cuml
(the GPU machine). Every wait has a timeout, and a worker's log is printed
when a test using it fails.

Tests leave the machine as they found it, also when they fail: a user they
create is removed, a folder they make is removed (finalizers), and the
private folders the suite's workers made in the temp folder go when the
session ends, if the session made them.
"""

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

import sklearn_gpu_bridge
from sklearn_gpu_bridge.config import ENV_CONNECTION_FILE
from sklearn_gpu_bridge.manage.launcher import LaunchedWorker
from sklearn_gpu_bridge.protocol import Session, new_id
from sklearn_gpu_bridge.runtime.keys import secure

BACKEND = os.environ.get("SKLEARN_GPU_BRIDGE_TEST_BACKEND", "sklearn")
#: the local workers the suite starts stop with their process tree: none stays warm after the suite
LOCAL_WORKER_IDLE = "SKLEARN_GPU_BRIDGE_LOCAL_WORKER_IDLE"
os.environ[LOCAL_WORKER_IDLE] = "0"


def bare_env(*drop, **extra):
    """The environment without this package's settings (as a new user's), less ``drop``, plus ``extra``; its
    local workers still stop with their process tree unless ``extra`` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKLEARN_GPU_BRIDGE_") and k not in drop}
    return {**env, LOCAL_WORKER_IDLE: "0", **extra}


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


class WorkerProcess(LaunchedWorker):
    """A worker subprocess (the test backend) on a free loopback port with its own fresh key.

    ``options``: the worker's settings (``client_timeout=1``, ``threads=2`` ...).
    """

    def __init__(self, folder, backend=BACKEND, **options):
        super().__init__(folder, backend=backend, log_level="INFO", **options)


class RawClient:
    """A DEALER socket to ``worker``, past its gate (``keys.secure``), that signs whatever it is given with ``key``
    (the worker's own unless given) under its own client id: what the protocol, security and trust tests attack
    the worker with. Every receive times out (``reply_ms``, unless given)."""

    def __init__(self, worker, key=None, name="raw", reply_ms=5000):
        self.info = worker.info
        self.context = zmq.Context()
        self.socket = secure(self.context.socket(zmq.DEALER), worker.info)
        self.socket.linger = 0
        self.socket.connect(worker.info.address)
        self.session = Session(key or worker.info.key_bytes, peer=worker.info.worker_id)
        self.client = f"{name}-{new_id()}"
        self.reply_ms = reply_ms

    def header(self, op, **fields):
        return {"op": op, "id": new_id(), "client": self.client, **fields}

    def receive(self, timeout_ms=None):
        """The next reply (header, buffers), or None when none comes within ``timeout_ms``."""
        if not self.socket.poll(self.reply_ms if timeout_ms is None else timeout_ms):
            return None
        return self.session.unpack(self.socket.recv_multipart())

    def send_header(self, header, buffers=()):
        """Sign ``header`` (and ``buffers``) and send it; its id."""
        self.socket.send_multipart(self.session.pack(header, buffers))
        return header["id"]

    def request(self, header, buffers=(), timeout_ms=None):
        """Send ``header`` (signed) and return the reply, which must be the next message and answer it."""
        self.send_header(header, buffers)
        reply = self.receive(timeout_ms)
        assert reply is not None, f"no reply to {header['op']!r}"
        assert reply[0]["parent"] == header["id"]
        return reply

    def close(self):
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def accelerated():
    """accel installed in this process for one test, then taken out (with the environment it set and the
    report it opened)."""
    from sklearn_gpu_bridge import accel
    from sklearn_gpu_bridge.accel import report

    saved = dict(os.environ)
    accel.install()
    report.reset()
    yield
    accel.uninstall()
    report.reset()
    os.environ.clear()
    os.environ.update(saved)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, worker in getattr(item, "funcargs", {}).items():
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


@contextlib.contextmanager
def own_worker(folder, shared, **options):
    """A worker of one test with ``options`` (WorkerProcess's), used while the block runs; then ``shared`` again."""
    process = WorkerProcess(folder, **options)
    use_worker(process)
    try:
        yield process
    finally:
        sklearn_gpu_bridge.reset_connection()
        process.stop()
        use_worker(shared)


@pytest.fixture
def fresh_worker(tmp_path, worker):
    """A worker of this test alone (for tests that kill or restart it)."""
    with own_worker(tmp_path, worker) as process:
        yield process


@pytest.fixture
def connection(worker):
    return sklearn_gpu_bridge.get_connection()


def assert_ulps(got, expected, ulps=64, err_msg=""):
    """Labels and integers exactly; floats to a few units in the last place of the largest value.

    The same scikit-learn code in two processes need not round alike: BLAS
    splits its sums by the number of threads, which differs between the
    worker and this process and from machine to machine (a 2-core CI runner).
    """
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if got.dtype.kind not in "fc" or expected.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, expected, err_msg=err_msg)
        return
    eps = np.finfo(np.result_type(got.dtype, expected.dtype)).eps
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(got, expected, rtol=ulps * eps, atol=ulps * eps * scale, err_msg=err_msg)


def assert_same(bridged, direct):
    """The scikit-learn backend: scikit-learn's answer to a few ULPs; cuML (float32, own solvers): within 1e-3."""
    bridged, direct = np.asarray(bridged), np.asarray(direct)
    assert bridged.shape == direct.shape
    if BACKEND == "sklearn":
        assert_ulps(bridged, direct)
    else:
        np.testing.assert_allclose(bridged, direct, rtol=1e-3, atol=1e-3)


def record(name, **values):
    """Print a measured figure and append it to $SKLEARN_GPU_BRIDGE_FIGURES (JSON lines)."""
    print(f"FIGURE {name}: {values}")
    path = os.environ.get("SKLEARN_GPU_BRIDGE_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"figure": name, **values}) + "\n")


def nested_tuples(depth):
    """msgpack of ``depth`` tuples, each holding the next, around an empty list: the tuple extension written by
    hand (the packer refuses to nest it past MAX_TUPLE_DEPTH)."""
    inner = b"\x90"  # []
    for _ in range(depth):
        inner = b"\x91" + inner  # an array of one: what the extension holds
        n = len(inner)
        size = (b"\xc7" + n.to_bytes(1, "big") if n < 1 << 8 else
                b"\xc8" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xc9" + n.to_bytes(4, "big"))
        inner = size + b"\x01" + inner
    return inner


def wait_until(condition, seconds, step=0.05):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


# ---------------------------------------------------------------- leaving the machine as it was


def _suite_folders():
    """The private folders this user's workers make in the temp folder (sockets, local workers' files)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folders = [Path(tempfile.gettempdir()) / f"sklearn-gpu-bridge-{os.getuid()}", Path(f"/tmp/sgb-{os.getuid()}")]
    if base:
        folders.append(Path(base) / "sklearn-gpu-bridge")
    return folders


def _stale(path):
    """Whether ``path`` is a socket of this user that nobody listens on any more, or a local worker's file whose
    owner process is gone (what a worker killed by a test leaves behind)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    if info.st_uid != os.getuid():
        return False
    if stat.S_ISSOCK(info.st_mode):
        kind = socket.SOCK_DGRAM if path.suffix == ".bell" else socket.SOCK_STREAM
        with socket.socket(socket.AF_UNIX, kind) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                return True
            except OSError:
                return False
        return False
    name = path.name.split(".")[0]
    if name.startswith("local-") and name[len("local-"):].isdigit():
        pid = int(name[len("local-"):])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


@pytest.fixture(scope="session", autouse=True)
def _leave_the_temp_folder_as_found():
    """What the session's workers left in the suite's private folders goes when it ends: sockets nobody listens on,
    files of local workers whose process is gone; then each folder the session made, once empty (a folder a live
    worker of another session uses stays, and so does anything that was there before)."""
    if os.name != "posix":
        yield
        return
    before = {}
    for folder in _suite_folders():
        try:
            before[folder] = set(os.listdir(folder))
        except OSError:
            before[folder] = None  # made by this session, if at all
    yield
    for folder, found in before.items():
        try:
            entries = [] if folder.is_symlink() else list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if (found is None or entry.name not in found) and _stale(entry):
                entry.unlink(missing_ok=True)
        if found is None:
            with contextlib.suppress(OSError):
                folder.rmdir()


@pytest.fixture
def shared_folder():
    """``shared_folder(sticky=True)``: a folder every local user may write to, as /tmp is (sticky) or as a careless
    share is (not); removed after the test, with whatever another user put in it."""
    made = []

    def make(sticky=True):
        folder = Path(tempfile.mkdtemp(prefix="sgb-shared-", dir="/tmp"))
        made.append(folder)
        folder.chmod(0o1777 if sticky else 0o777)
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- a second local user, for attacks

OTHER_USER = "sgb-attacker"  # used where it exists already (provisioned for the tests); else one is made


class OtherUser:
    """Another local account: runs commands as itself, as an attacker on the same host would."""

    def __init__(self, entry):
        self.name, self.uid, self.gid = entry.pw_name, entry.pw_uid, entry.pw_gid
        self.python = next((p for p in (sys.executable, "/usr/bin/python3", shutil.which("python3") or "")
                            if p and self._runs(p)), None)

    def _runs(self, python):
        try:
            return self.run([python, "-c", "import socket"], check=False).returncode == 0
        except OSError:  # not theirs to run (a virtualenv under a private home)
            return False

    def run(self, argv, check=True, **kwargs):
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "HOME": "/"}, timeout=60, check=check, cwd="/", **kwargs)

    def popen(self, argv, **kwargs):
        """A process of this user, running on (the caller ends it)."""
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], text=True,
                                env={"PATH": "/usr/bin:/bin", "HOME": "/"}, cwd="/", **kwargs)

    def sh(self, script, check=True):
        return self.run(["sh", "-c", script], check=check)

    def end_processes(self):
        """End this user's processes (the tests started them all: the user was made for them)."""
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == self.uid:
                        os.kill(int(entry.name), signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture(scope="session")
def other_user():
    """A second local user (made when the tests run as root, and removed when the session ends, whatever happened;
    skipped otherwise, with the reason)."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("needs root: the attack needs a second local user, which only root can create here")
    try:
        yield OtherUser(pwd.getpwnam(OTHER_USER))  # provisioned: used, and left as it was
        return
    except KeyError:
        pass
    name = f"sgb-atk-{os.getpid()}"  # this session's own: another session's is never removed under it
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    user = OtherUser(pwd.getpwnam(name))
    try:
        yield user
    finally:
        user.end_processes()
        subprocess.run(["userdel", name], capture_output=True)


class DriverStandIn:
    """cudaHostRegister's bookkeeping without a GPU: refuses what the CUDA driver refuses.

    Registering a range that overlaps one registered already, or unregistering
    an address that is not registered, is an error, as in CUDA; both ends of a
    range are read, so a range that is not mapped memory fails the test.
    """

    def __init__(self, fail=False, delay=0.0):
        self.ranges, self.calls, self.fail, self.delay = {}, [], fail, delay
        self.attempts = 0
        self.lock = threading.Lock()

    def register(self, address, nbytes):
        with self.lock:
            self.attempts += 1
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("cudaErrorNotSupported")
        ctypes.string_at(address, 1), ctypes.string_at(address + nbytes - 1, 1)
        with self.lock:
            if any(a < address + nbytes and address < a + n for a, n in self.ranges.items()):
                raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
            self.ranges[address] = nbytes
            self.calls.append(("register", address, nbytes))

    def unregister(self, address):
        with self.lock:
            if self.ranges.pop(address, None) is None:
                raise RuntimeError("cudaErrorHostMemoryNotRegistered")
            self.calls.append(("unregister", address))
