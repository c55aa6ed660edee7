"""The local worker: started for the client when no worker is configured.

The process that calls first starts a worker (:mod:`.launcher`) with this
interpreter and waits for its connection file; the others find that file.
Its name says which worker it is:

- ``local-warm-<tag>.json`` (``local_worker_idle`` > 0, the default): one
  worker per user, interpreter, backend and worker environment (``tag``),
  shared by every script of theirs. It outlives its clients: it stops by
  itself after ``local_worker_idle`` seconds without any, so the next script
  within that while finds it warm (cuML imported, the GPU set up) instead of
  paying seconds for its first call. ``sklearn-gpu-bridge stop`` ends it.
- ``local-<pid>.json`` (``local_worker_idle`` = 0): one per process tree,
  keyed by the process that owns it (the process itself, or in a
  joblib/multiprocessing child, its parent), stopped when that process exits.

Either way ``GridSearchCV(n_jobs=2)``'s children find their parent's worker
(or start it, under a lock) instead of one each. A warm worker takes the
same lock before it stops, so a client that has just found it is never left
without one.

Its files live in this user's private runtime folder
(:func:`sklearn_gpu_bridge.runtime.private_files.runtime_folder`), which is also
the worker's working folder: another local user can neither plant a module
there nor redirect its log.
"""

import atexit
import functools
import hashlib
import itertools
import logging
import multiprocessing
import os
import re
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

from ..config import WORKER_ENV_PREFIX
from ..errors import ConfigurationError, WorkerUnavailable
from ..progress import waiting
from ..runtime.connection_file import read_connection_file, start_lock_path
from ..runtime.private_files import ExclusiveLock, pid_alive, runtime_folder, terminate
from ..version import __version__
from .launcher import spawn, wait_ready, worker_argv

log = logging.getLogger(__name__)

_NAME = re.compile(r"^local-(\d+|warm-[0-9a-f]{12})\.json$")
_stopped_at_exit = set()
_started = {}  # connection file -> Popen of the worker this process started there last


def is_local_connection_file(path):
    path = Path(path)
    return _NAME.match(path.name) is not None and path.parent == runtime_folder()


def is_warm_local_worker(path):
    """Whether ``path`` is the connection file of a local worker kept warm between scripts."""
    return path is not None and is_local_connection_file(path) and Path(path).name.startswith("local-warm-")


def warm_tag(backend):
    """What a warm worker must share with the client that reuses it: interpreter, the package's code (its
    version, and when its files last changed: a checkout being edited), backend, and the environment the
    worker reads (its options, the GPUs it sees)."""
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(WORKER_ENV_PREFIX) or k == "CUDA_VISIBLE_DEVICES")
    text = repr((os.path.realpath(sys.executable), __version__, _code_changed(), backend, env))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.cache
def _code_changed():
    """The latest modification time of the package's modules: a few milliseconds of stat calls, once a process
    (code that changes under a running process is not the code it runs)."""
    package = sys.modules[__package__.partition(".")[0]]
    latest = 0
    for folder in map(Path, package.__path__):
        for path in itertools.chain(folder.glob("*.py"), folder.glob("*/*.py")):
            try:
                latest = max(latest, path.stat().st_mtime_ns)
            except OSError:
                continue
    return latest


def local_connection_file(backend, idle):
    """The connection file of the local worker this process would use (there or not)."""
    return warm_connection_file(backend) if idle > 0 else runtime_folder() / f"local-{owner_pid()}.json"


def warm_connection_file(backend):
    """The connection file of the warm local worker this environment's scripts share (there or not)."""
    return runtime_folder() / f"local-warm-{warm_tag(backend)}.json"


def owner_pid():
    """This process, or its parent when it is a multiprocessing/loky child."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def running_local_worker(path):
    """The worker pid in a connection file, if that worker is alive."""
    try:
        pid = read_connection_file(path).pid
    except (OSError, ConfigurationError):
        return None
    ours = _started.get(Path(path))
    if ours is not None and ours.pid == pid:
        return pid if ours.poll() is None else None  # our child: poll() also reaps it (a zombie looks alive)
    return pid if pid_alive(pid) else None


@contextmanager
def local_worker(backend, startup_timeout, idle, preferred=None):
    """Yield (connection file, Popen or None) of a running local worker, starting one if needed.

    The start lock is held while the ``with`` block runs: a warm worker about to stop for idleness takes
    it too, so it cannot stop between this process finding it and connecting to it.
    """
    if preferred is not None and running_local_worker(preferred):
        path = Path(preferred)
    else:
        path = local_connection_file(backend, idle)
    lock = ExclusiveLock(start_lock_path(path), startup_timeout, "the local worker's start lock")
    try:
        with lock:
            process = None
            if not running_local_worker(path):
                process = _start(path, backend, startup_timeout, idle)
            _stop_with_owner(path, idle)
            yield path, process
    except TimeoutError as exc:
        raise WorkerUnavailable(str(exc)) from None


def _start(path, backend, startup_timeout, idle):
    path.unlink(missing_ok=True)
    warm = idle > 0
    options = {"idle_exit": idle} if warm else {}
    argv = worker_argv(connection_file=path, backend=backend, parent_pid=None if warm else owner_pid(), **options)
    log_file = path.with_suffix(".log")
    log.info("starting a local worker (%s); its log: %s", backend, log_file)
    # a warm worker outlives this process: in a session of its own, a Ctrl-C here does not reach it
    process = spawn(argv, log_file, cwd=path.parent, detached=warm)
    _started[path] = process
    with waiting("starting a local worker (the first one loads cuML: seconds)"):
        wait_ready(process, path, startup_timeout, log_file=log_file)
    return process


def _stop_with_owner(path, idle):
    """A process tree's own worker is stopped when its owner exits, whoever started it."""
    if idle <= 0 and path.name == f"local-{os.getpid()}.json" and path not in _stopped_at_exit:
        _stopped_at_exit.add(path)
        atexit.register(_stop_at_exit, path)


def _stop_at_exit(path):
    stop_local_worker(path, _started.get(path))


def stop_local_worker(path, process=None):
    """SIGTERM (the worker stops cleanly and removes its file), then SIGKILL after 5 s; the log goes too."""
    if process is not None and process.poll() is not None:
        process = None  # that one has exited (its pid may be someone else's by now)
    pid = process.pid if process is not None else running_local_worker(path)
    if pid is not None and pid_alive(pid):
        terminate(pid, 5.0, first=signal.SIGTERM)
        if process is not None:
            process.poll()
    Path(path).with_suffix(".log").unlink(missing_ok=True)
