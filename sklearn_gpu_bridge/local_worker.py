"""The local worker: started for the client when no worker is configured.

One per user process tree. The process that calls first starts
``python -m sklearn_gpu_bridge.worker`` with this interpreter and waits for
its connection file (written once the worker is warm). The file's name is
keyed by the *owner*: the process itself, or, in a joblib/multiprocessing
child, its parent. So when ``GridSearchCV(n_jobs=2)`` makes its first fits in
two children, they find (or start, under a lock) the one worker of their
parent instead of one each. The worker stops when its owner exits: the owner
stops it at exit, and the worker also watches the owner's pid.
"""

import atexit
import getpass
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .connect import make_private_folder, read_connection_file
from .errors import WorkerUnavailable
from .shm import pid_alive

_NAME = re.compile(r"^local-(\d+)\.json$")
_stopped_at_exit = set()
_started = {}  # connection file -> Popen of the worker this process started there last


def rendezvous_folder():
    """A private folder of this user for the local workers' connection files."""
    folder = Path(tempfile.gettempdir()) / f"sklearn-gpu-bridge-{getpass.getuser()}"
    return folder if folder.is_dir() else make_private_folder(folder)  # asked often: made private once


def is_local_connection_file(path):
    path = Path(path)
    return path.parent == rendezvous_folder() and _NAME.match(path.name) is not None


def owner_pid():
    """This process, or its parent when it is a multiprocessing/loky child."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def _running(path):
    """The worker pid in a connection file, if that worker is alive."""
    try:
        pid = read_connection_file(path).pid
    except (OSError, ValueError, TypeError, KeyError):
        return None
    ours = _started.get(Path(path))
    if ours is not None and ours.pid == pid:
        return pid if ours.poll() is None else None  # our child: poll() also reaps it (a zombie looks alive)
    return pid if pid_alive(pid) else None


class _Lock:
    """An exclusive lock file (portable); a lock left by a dead process is broken."""

    def __init__(self, path, timeout):
        self.path, self.timeout = Path(path), timeout

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                try:
                    holder = int(self.path.read_text() or 0)
                except (OSError, ValueError):
                    holder = 0
                if holder and not pid_alive(holder):
                    self.path.unlink(missing_ok=True)
                elif time.monotonic() > deadline:
                    raise WorkerUnavailable(f"timed out waiting for the lock {self.path}") from None
                else:
                    time.sleep(0.05)
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def ensure_local_worker(backend, startup_timeout, preferred=None):
    """(connection file, Popen or None) of a running local worker, starting one if needed."""
    if preferred is not None and _running(preferred):
        path, process = Path(preferred), None
    else:
        owner = owner_pid()
        folder = rendezvous_folder()
        path, process = folder / f"local-{owner}.json", None
        with _Lock(folder / f"local-{owner}.lock", startup_timeout):
            if not _running(path):
                path.unlink(missing_ok=True)
                process = _start(backend, path, folder / f"local-{owner}.log", owner, startup_timeout)
                _started[path] = process
    if path.name == f"local-{os.getpid()}.json" and path not in _stopped_at_exit:
        _stopped_at_exit.add(path)  # the owner stops it, whoever started it (and whichever restart runs)
        atexit.register(_stop_at_exit, path)
    return path, process


def _stop_at_exit(path):
    stop_local_worker(path, _started.get(path))


def _start(backend, path, log_file, owner, startup_timeout):
    command = [
        sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", backend,
        "--connection-file", str(path), "--parent-pid", str(owner),
    ]
    with open(log_file, "ab") as log:
        # cwd: never the caller's folder, where a checkout's sklearn_gpu_bridge/ could shadow the install
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=path.parent)
    deadline = time.monotonic() + startup_timeout
    while not path.exists():
        if process.poll() is not None:
            tail = "".join(Path(log_file).read_text(errors="replace").splitlines(True)[-20:])
            raise WorkerUnavailable(f"the local worker exited with code {process.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            process.kill()
            raise WorkerUnavailable(f"the local worker was not ready within {startup_timeout:.0f} s")
        time.sleep(0.05)
    return process


def stop_local_worker(path, process=None):
    """SIGTERM (the worker stops cleanly and removes its file), then SIGKILL after 5 s."""
    if process is not None and process.poll() is not None:
        process = None  # that one has exited (its pid may be someone else's by now)
    pid = process.pid if process is not None else _running(path)
    if pid is not None and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not _exited(pid, process):
            if time.monotonic() > deadline:
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
                break
            time.sleep(0.05)
    Path(path).with_suffix(".log").unlink(missing_ok=True)


def _exited(pid, process):
    return process.poll() is not None if process is not None else not pid_alive(pid)
