"""This process's connection: found or started on first use, in process inside a dask-cuda worker.

:func:`get_connection` is what the estimators call. It connects to the worker that the settings
name (``connection_file``), else to the default connection file's worker, else to a local worker
it starts (one per user process tree, :mod:`sklearn_gpu_bridge.manage.local_worker`); inside a
Dask worker that has cuML it runs cuML in this process instead (:func:`execution_mode`).
"""

import atexit
import logging
import os
import sys
import threading
import warnings

from ..catalogue import is_cuml_alias, real_cuml_importable
from ..config import ENV_CONNECTION_FILE, get_config, get_setting
from ..errors import ConfigurationError, WorkerUnavailable
from ..manage.local_worker import ensure_local_worker, is_local_connection_file
from ..manage.transport_select import client_transport
from ..runtime.connection_file import default_connection_file, read_connection_file, start_hint
from ..transport.inprocess import InProcessTransport
from .connection import Connection, connect

log = logging.getLogger(__name__)

EXECUTION_MODES = ("auto", "worker", "in_process")

_lock = threading.RLock()
_connection = None
_warned_fallback = False
_exit_hook = None


def _in_dask_worker():
    """The Dask worker this code runs in, or None (never imports distributed itself)."""
    worker_module = sys.modules.get("distributed.worker")
    if worker_module is None:
        return None
    try:
        return worker_module.get_worker()
    except ValueError:  # not in a task (client.run, say): a Dask worker process still has its running Worker
        running = (w for w in list(getattr(worker_module.Worker, "_instances", ()))
                   if getattr(getattr(w, "status", None), "name", None) == "running")
        return next(running, None)


def _cuml_importable():
    """Whether the real cuML can be imported here (this package's ``cuml`` alias is not cuML)."""
    module = sys.modules.get("cuml")
    if module is not None and not is_cuml_alias(module):
        return True
    return real_cuml_importable()


def execution_mode() -> dict:
    """Where this process's GPU* calls run: {"mode": "in_process" | "worker", "reason": ..., "gpu": ...}.

    ``execution="auto"`` (the default) runs cuML in this process when it is a Dask
    worker with cuML importable (dask-cuda gives each such worker its own GPU),
    and goes through a bridge worker everywhere else (a Windows client, a CPU
    Dask worker, a plain script). ``"worker"`` and ``"in_process"`` force it.
    Try ``client.run(sklearn_gpu_bridge.execution_mode)`` on a Dask cluster.
    """
    setting = get_setting("execution")
    if setting not in EXECUTION_MODES:
        raise ConfigurationError(f"execution={setting!r}: choose one of {EXECUTION_MODES}")
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or None
    if setting == "in_process":
        return {"mode": "in_process", "reason": "execution=in_process", "gpu": gpu}
    if setting == "worker":
        return {"mode": "worker", "reason": "execution=worker", "gpu": None}
    dask_worker = _in_dask_worker()
    if dask_worker is None:
        return {"mode": "worker", "reason": "not in a Dask worker", "gpu": None}
    if not _cuml_importable():
        return {"mode": "worker", "reason": f"Dask worker {dask_worker.address} has no cuML", "gpu": None}
    return {"mode": "in_process", "reason": f"Dask worker {dask_worker.address} with cuML", "gpu": gpu}



def get_connection() -> Connection:
    """This process's connection, made on first use (starting a local worker if needed).

    After a :class:`WorkerLost`, the next call connects anew: to the worker in
    the connection file, or to a local worker started again if it was one.
    """
    global _connection, _exit_hook
    conn = _connection
    if _usable(conn):
        return conn
    with _lock:
        if not _usable(_connection):
            if _connection is not None and _connection.pid == os.getpid():
                _connection.retire()  # lost: its pool files go now, not at exit
            _connection = None
            _connection = _connect_in_process() if execution_mode()["mode"] == "in_process" else _connect()
            if _exit_hook != os.getpid():
                _exit_hook = os.getpid()
                atexit.register(_close_at_exit)
        return _connection


def heads_up() -> None:
    """Tell this process's worker, if it has one already, that a request is on its way
    (:meth:`Connection.heads_up`); connects to nothing."""
    conn = _connection
    if conn is not None:
        conn.heads_up()


def _usable(conn):
    """Open, of this process, and (for a local worker this process started) that worker still runs."""
    return (conn is not None and conn.pid == os.getpid() and not conn.closed
            and (conn.process is None or conn.process.poll() is None))


def _close_at_exit():
    conn = _connection
    if conn is not None and conn.pid == os.getpid():
        conn.close()


def reset_connection() -> None:
    """Close this process's connection; the next call opens a new one."""
    global _connection
    with _lock:
        if _connection is not None and _connection.pid == os.getpid():
            _connection.close()
        _connection = None


def _connect_in_process():
    """cuML in this process (a dask-cuda worker, or execution="in_process"); said once in the log."""
    mode = execution_mode()
    try:
        conn = Connection(InProcessTransport())
    except Exception as exc:  # noqa: BLE001 - any import failure means "no cuML here"
        raise ConfigurationError(f"cuML in this process ({mode['reason']}) is not usable: "
                                 f"{type(exc).__name__}: {exc}; set execution='worker' to use a bridge worker") from exc
    log.info("sklearn-gpu-bridge: cuML %s in this process (pid %d, GPU %s): %s", conn.capabilities.versions.get("cuml"),
             conn.pid, mode["gpu"] or "default", mode["reason"])
    return conn


def _connect():
    global _warned_fallback
    config = get_config()
    path, process = config["connection_file"], None
    if path is None and default_connection_file().exists():
        path = default_connection_file()
    if path is None or is_local_connection_file(path):
        if path is None and not config["start_local_worker"]:
            raise WorkerUnavailable(
                f"no worker is configured and start_local_worker is off; {start_hint(default_connection_file())}"
            )
        path, process = ensure_local_worker(config["local_backend"], config["startup_timeout"], preferred=path)
        os.environ[ENV_CONNECTION_FILE] = str(path)  # children started from now on find it at once
    try:
        info = read_connection_file(path)
    except FileNotFoundError:
        raise WorkerUnavailable(f"connection file {path} does not exist; {start_hint(path)}") from None
    pool, pool_directory, _ = client_transport(path)
    conn = connect(
        info, connection_file=path, pool=pool, pool_directory=pool_directory,
        heartbeat_timeout=config["heartbeat_timeout"], process=process,
        array_cache=config["array_cache"], cache_min_bytes=config["cache_min_bytes"],
    )
    reason = conn.capabilities.fallback_reason
    if reason and not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"sklearn-gpu-bridge: running on scikit-learn (CPU): {reason}", RuntimeWarning, stacklevel=4)
    return conn
