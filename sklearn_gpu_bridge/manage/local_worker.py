"""The local worker: started for the client when no worker is configured.

One per user process tree. The process that calls first starts a worker
(:mod:`.launcher`) with this interpreter and waits for its connection file.
The file's name is keyed by the *owner*: the process itself, or, in a
joblib/multiprocessing child, its parent. So when ``GridSearchCV(n_jobs=2)``
makes its first fits in two children, they find (or start, under a lock)
the one worker of their parent instead of one each. The worker stops when
its owner exits: the owner stops it at exit, and the worker also watches
the owner's pid.

Its files live in this user's private runtime folder
(:func:`sklearn_gpu_bridge.runtime.private_files.runtime_folder`), which is also
the worker's working folder: another local user can neither plant a module
there nor redirect its log.
"""

import atexit
import multiprocessing
import os
import re
import signal
from pathlib import Path

from ..errors import ConfigurationError, WorkerUnavailable
from ..runtime.connection_file import read_connection_file
from ..runtime.private_files import ExclusiveLock, pid_alive, runtime_folder, terminate
from .launcher import spawn, wait_ready, worker_argv

_NAME = re.compile(r"^local-(\d+)\.json$")
_stopped_at_exit = set()
_started = {}  # connection file -> Popen of the worker this process started there last


def is_local_connection_file(path):
    path = Path(path)
    return _NAME.match(path.name) is not None and path.parent == runtime_folder()


def local_connection_file(owner):
    """The connection file of the local worker of ``owner``'s process tree (there or not)."""
    return runtime_folder() / f"local-{owner}.json"


def owner_pid():
    """This process, or its parent when it is a multiprocessing/loky child."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def _running(path):
    """The worker pid in a connection file, if that worker is alive."""
    try:
        pid = read_connection_file(path).pid
    except (OSError, ConfigurationError):
        return None
    ours = _started.get(Path(path))
    if ours is not None and ours.pid == pid:
        return pid if ours.poll() is None else None  # our child: poll() also reaps it (a zombie looks alive)
    return pid if pid_alive(pid) else None


def ensure_local_worker(backend, startup_timeout, preferred=None):
    """(connection file, Popen or None) of a running local worker, starting one if needed."""
    if preferred is not None and _running(preferred):
        path, process = Path(preferred), None
    else:
        owner = owner_pid()
        folder = runtime_folder()
        path, process = local_connection_file(owner), None
        try:
            with ExclusiveLock(folder / f"local-{owner}.lock", startup_timeout, "the local worker's start lock"):
                if not _running(path):
                    path.unlink(missing_ok=True)
                    argv = worker_argv(connection_file=path, backend=backend, parent_pid=owner)
                    log_file = path.with_suffix(".log")
                    process = spawn(argv, log_file, cwd=folder)
                    _started[path] = process
                    wait_ready(process, path, startup_timeout, log_file=log_file)
        except TimeoutError as exc:
            raise WorkerUnavailable(str(exc)) from None
    if path.name == f"local-{os.getpid()}.json" and path not in _stopped_at_exit:
        _stopped_at_exit.add(path)  # the owner stops it, whoever started it (and whichever restart runs)
        atexit.register(_stop_at_exit, path)
    return path, process


def _stop_at_exit(path):
    stop_local_worker(path, _started.get(path))


def stop_local_worker(path, process=None):
    """SIGTERM (the worker stops cleanly and removes its file), then SIGKILL after 5 s; the log goes too."""
    if process is not None and process.poll() is not None:
        process = None  # that one has exited (its pid may be someone else's by now)
    pid = process.pid if process is not None else _running(path)
    if pid is not None and pid_alive(pid):
        terminate(pid, 5.0, first=signal.SIGTERM)
        if process is not None:
            process.poll()
    Path(path).with_suffix(".log").unlink(missing_ok=True)
