"""This process's connection: found or started on first use, in process inside a dask-cuda worker.

:func:`get_connection` is what the estimators call. It connects to the worker that the settings
name (``connection_file``), else to the default connection file's worker, else to a local worker
it starts (kept warm for the next script, :mod:`sklearn_gpu_bridge.manage.local_worker`); inside a
Dask worker that has cuML it runs cuML in this process instead (:func:`execution_mode`).
:func:`connection_at_hand` is the same without starting a worker: a loaded model that can answer
in process asks it.
"""

import atexit
import logging
import os
import sys
import threading
import time

from ..catalogue import is_cuml_alias, real_cuml_importable
from ..config import ENV_CONNECTION_FILE, ENV_PREFIX, get_config, get_setting
from ..errors import ConfigurationError, WorkerUnavailable, warn_at_caller
from ..manage.local_worker import (
    is_local_connection_file,
    local_connection_file,
    local_worker,
    owner_pid,
    running_local_worker,
)
from ..manage.transport_select import client_transport
from ..runtime.connection_file import default_connection_file, read_connection_file, start_hint
from ..runtime.private_files import pid_alive
from ..transport.inprocess import InProcessTransport
from .connection import Connection, connect

log = logging.getLogger(__name__)

EXECUTION_MODES = ("auto", "worker", "in_process")
#: set once a process has said that its worker runs on the CPU: the processes it starts from then on
#: (joblib's workers, a subprocess) inherit it and do not say it again
ENV_CPU_NOTICE = ENV_PREFIX + "CPU_NOTICE_GIVEN"
#: seconds for which :func:`connection_at_hand` trusts that no worker is at hand
NONE_AT_HAND_SECONDS = 1.0

_lock = threading.RLock()
_connection = None
_exit_hook = None
_none_at_hand_until = 0.0


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


def connection_at_hand() -> Connection | None:
    """This process's connection where it has one, or can have one without starting a worker; else None.

    At hand are: the connection this process holds; the worker configured (the ``connection_file``
    setting, or ``SKLEARN_GPU_BRIDGE_CONNECTION_FILE``, which joblib's children inherit) and execution in
    process, both as :func:`get_connection` gives them, errors included; the default connection file's
    worker, if it answers; the local worker this process would use (a warm one, its parent's), if it
    runs. None where there is none of these: a loaded model then answers in process with its portable
    form, rather than wait seconds for a local worker to start.
    """
    global _none_at_hand_until
    conn = _connection
    if _usable(conn):
        return conn
    if get_setting("connection_file") is not None or execution_mode()["mode"] == "in_process":
        return get_connection()
    # Looking costs tens of microseconds (files, a private folder's checks), a call that answers in
    # process little more: a "none" holds for a moment, so a loop of small predicts does not pay it each time.
    if time.monotonic() < _none_at_hand_until:
        return None
    conn = _unconfigured_at_hand()
    if conn is None:
        _none_at_hand_until = time.monotonic() + NONE_AT_HAND_SECONDS
    return conn


def _unconfigured_at_hand():
    """The default connection file's worker if it answers, else the local worker of this process tree if it
    runs (connected to), else None."""
    default = default_connection_file()
    if default.exists():
        try:
            info = read_connection_file(default)
        except (OSError, ConfigurationError):
            return None
        if info.address.startswith("ipc://") and not pid_alive(info.pid):
            return None  # a file left by a worker of this host that is gone: no need to ask it
        try:
            return get_connection()
        except WorkerUnavailable:
            return None
    return get_connection() if _local_worker_runs() else None


def _local_worker_runs():
    """Whether the local worker this process would use runs."""
    config = get_config()
    path = local_connection_file(config["local_backend"], config["local_worker_idle"])
    return running_local_worker(path) is not None


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
    config = get_config()
    path = config["connection_file"]
    if path is None and default_connection_file().exists():
        path = default_connection_file()
    if path is not None and not is_local_connection_file(path):
        return _connect_to(path, config)
    if path is None and not config["start_local_worker"]:
        raise WorkerUnavailable(
            f"no worker is configured and start_local_worker is off; {start_hint(default_connection_file())}"
        )
    with local_worker(config["local_backend"], config["startup_timeout"], config["local_worker_idle"],
                      preferred=path) as (path, process):
        conn = _connect_to(path, config, process)
    os.environ[ENV_CONNECTION_FILE] = str(path)  # children started from now on find it at once
    return conn


def _connect_to(path, config, process=None):
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
    if reason:
        _cpu_notice(reason)
    return conn


def _cpu_notice(reason):
    """Say, once per process tree, that the worker runs scikit-learn on the CPU (a BridgeWarning).

    Not again in this process, nor in one started after it said so (:data:`ENV_CPU_NOTICE`); never in
    a joblib or multiprocessing child, whose parent is the user's process: a search's children use the
    worker before the parent does, and the parent says it when it refits (a parent that uses no worker
    itself, such as ``cross_val_score``'s, says nothing).
    """
    if os.environ.get(ENV_CPU_NOTICE) or owner_pid() != os.getpid():
        return
    os.environ[ENV_CPU_NOTICE] = "1"
    warn_at_caller(f"sklearn-gpu-bridge: running on scikit-learn (CPU): {reason}")
