"""Settings, in one table each for the client and the worker.

Client settings work as scikit-learn's do: ``set_config`` / ``config_context``
in Python, else the environment variable ``SKLEARN_GPU_BRIDGE_<NAME>``
(upper case), else :data:`DEFAULTS`; but they are the process's, not each
thread's, so that the threads of a search see what its caller set. A child
process started by joblib inherits the environment, which is how it finds the
same worker as its parent.

Worker settings (:data:`WORKER_DEFAULTS`) are the keyword arguments of
``Worker`` and the options of ``sklearn-gpu-bridge worker`` (the same
names); every entry point reads them from ``SKLEARN_GPU_BRIDGE_WORKER_<OPTION>``.

Shared by both sides: imports nothing of the package.
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENV_PREFIX = "SKLEARN_GPU_BRIDGE_"
#: environment prefix of the worker's options, whichever command starts it
WORKER_ENV_PREFIX = ENV_PREFIX + "WORKER"
#: set (to "1") by accel in a process and the ones it starts: their scikit-learn classes are served
ENV_ACCEL = ENV_PREFIX + "ACCEL"
#: the file a process's connection goes to; set for child processes (joblib) to find the same worker
ENV_CONNECTION_FILE = ENV_PREFIX + "CONNECTION_FILE"

DEFAULTS = {
    # connection file of a running worker; None: the default file, else a local worker
    "connection_file": None,
    # start a local worker process when none is configured
    "start_local_worker": True,
    # backend of that local worker: auto | cuml | sklearn
    "local_backend": "auto",
    # use the shared-memory pool when the worker can map it: auto | off
    "pool": "auto",
    # folder of the pool files (None: /dev/shm on Linux, else the temp folder)
    "pool_directory": None,
    # seconds to wait for a local worker to become ready (cuML warms up for a while)
    "startup_timeout": 300.0,
    # seconds a local worker stays after its last client, warm for the next script; 0: it stops with its process
    "local_worker_idle": 600.0,
    # seconds without an answer to a ping before a worker is declared lost
    "heartbeat_timeout": 3.0,
    # how bulk arrays travel: auto (the fastest `doctor`/`start` measured, else the pool) | pool | frames
    "transport": "auto",
    # skip arrays the worker already holds: auto (on with frames; a pool memcpy is cheaper than hashing) | on | off
    "array_cache": "auto",
    # ... for arrays of at least this many bytes
    "cache_min_bytes": 1 << 20,
    # elapsed time on stderr during long waits: auto (only when stderr is a terminal) | on | off
    "progress": "auto",
    # `start --wsl` / `doctor` on Windows: the WSL distribution (None: WSL's default one)
    "wsl_distro": None,
    # ... and the worker's Python inside it (a virtualenv's bin/python, for example)
    "wsl_python": "python3",
    # a fitted model that reaches no worker answers on the CPU with a RuntimeWarning (fits never do): bool
    "cpu_fallback": False,
    # when fitted state is copied to the client: lazy (first read, pickling) | eager (after each fit)
    "state_sync": "lazy",
    # float64 input to a float32 worker (cuML): float32 (half the bytes) | native (sent and computed as float64)
    "precision": "float32",
    # where GPU* calls run: auto (in process inside a Dask worker with cuML, else a worker) | worker | in_process
    "execution": "auto",
    # how a call waits for a local worker's reply: spin (watch the pool up to 10 ms, then sleep) | sleep | auto
    "reply_wait": "auto",
    # this client's CurveZMQ secret key file for a worker beyond loopback; None: derived from the signing key
    "curve_secret_key": None,
    # joblib's searches whose fits all run on a worker use threads, where no backend is chosen: auto | off
    "search_threads": "auto",
}

#: the values of the worker setting ``device_memory`` (worker.device_memory.use_device_memory)
DEVICE_MEMORY_KINDS = ("async", "async-cupy", "cuda")

WORKER_DEFAULTS = {
    # where to listen: ipc (this user's private socket) | a loopback address (TCP, PLAIN) | any other (CurveZMQ)
    "bind": "ipc",
    # TCP port; 0 picks a free one
    "port": 0,
    # auto (cuML when importable, else scikit-learn on the CPU) | cuml | sklearn
    "backend": "auto",
    # device memory of a cuML worker: async-cupy (stream-ordered pool, CuPy's own allocator) | async | cuda
    "device_memory": "async-cupy",
    # ms a worker thread watches a local spinning client's request slot after its reply before sleeping; 0: none
    "watch_ms": 3.0,
    # estimator calls run at once on each GPU, of all clients; 0: 4 on one GPU, 8 on each of several
    "threads": 0,
    # GPUs the worker drives: all | indices such as 0,1 (each runs `threads` calls at once); None: the first one
    "gpus": None,
    # several GPUs: a worker process for each, behind one address (True), or all of them in one process
    "gpu_processes": True,
    # folders where clients' shared-memory pools may be found (besides /dev/shm and the temp folder)
    "pool_dirs": (),
    # CurveZMQ secret key file (owner-only): encrypts all traffic
    "curve_secret_key": None,
    # a folder of client public keys (`sklearn-gpu-bridge keys --name NAME`) allowed besides the key's own
    "curve_allow": None,
    # file holding the signing key in hex (owner-only); None: a fresh random key
    "key_file": None,
    # seconds of silence before an unwatchable client is freed (0: never); it pings every quarter of it
    "client_timeout": 10.0,
    # requests one client may have waiting; more are refused at once
    "max_queued": 64,
    # MiB in one frame of a message; longer arrays travel as several frames (on TCP at most 1 MiB)
    "max_frame_mb": 1024.0,
    # MiB of arrays kept for clients (all together), so that a repeated array travels once
    "array_cache_mb": 1024.0,
    # seconds without any client after which the worker stops by itself; 0: never
    "idle_exit": 0.0,
    # DEBUG | INFO | WARNING | ERROR
    "log_level": "INFO",
}

_lock = threading.Lock()
_overrides: dict[str, Any] = {}
_env_before: dict[str, str | None] = {}  # the environment's own connection file, while set_config's stands in for it
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}


def _from_env(name, default):
    raw = os.environ.get(ENV_PREFIX + name.upper())
    if raw is None:
        return default
    if isinstance(default, bool):
        if raw.lower() not in _BOOL_WORDS:
            raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a boolean")
        return _BOOL_WORDS[raw.lower()]
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, int):
        return int(raw)
    return raw


def get_config() -> dict[str, Any]:
    """The client settings in force: Python overrides, then environment, then defaults."""
    with _lock:
        overrides = dict(_overrides)
    return {k: overrides[k] if k in overrides else _from_env(k, v) for k, v in DEFAULTS.items()}


def get_setting(name: str) -> Any:
    """One setting as :func:`get_config` gives it (cheap enough for every call)."""
    with _lock:
        if name in _overrides:
            return _overrides[name]
    return _from_env(name, DEFAULTS[name])


def is_explicit(name: str) -> bool:
    """Whether the user set ``name`` (in Python or the environment), rather than leaving the default."""
    with _lock:
        if name in _overrides:
            return True
    return ENV_PREFIX + name.upper() in os.environ


def set_config(**settings: Any) -> None:
    """Change settings for this process (``None`` goes back to env/default)."""
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown setting(s): {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    with _lock:
        for name, value in settings.items():
            if value is None:
                _overrides.pop(name, None)
            else:
                _overrides[name] = value
        if "connection_file" in settings:
            _export_connection_file(settings["connection_file"])


def _export_connection_file(path):
    """The worker this process uses goes to the environment too, for its children: joblib's processes
    under ``n_jobs`` then use the same worker (they do not see this process's settings). ``None`` puts
    back what the environment said before."""
    if path is not None:
        _env_before.setdefault(ENV_CONNECTION_FILE, os.environ.get(ENV_CONNECTION_FILE))
        os.environ[ENV_CONNECTION_FILE] = str(path)
    elif ENV_CONNECTION_FILE in _env_before:
        before = _env_before.pop(ENV_CONNECTION_FILE)
        if before is None:
            os.environ.pop(ENV_CONNECTION_FILE, None)
        else:
            os.environ[ENV_CONNECTION_FILE] = before


@contextmanager
def config_context(**settings: Any) -> Iterator[None]:
    """Change settings inside a ``with`` block, and put back after it what those settings were before it.

    Only those: a setting changed meanwhile by ``set_config`` (in another thread, or inside the block) stays
    as it was changed. The settings themselves are the process's, not the thread's as scikit-learn's are.
    """
    with _lock:
        saved = {name: _overrides.get(name) for name in settings}  # None: not overridden, as set_config reads it
    set_config(**settings)
    try:
        yield
    finally:
        set_config(**saved)
