"""Client settings, in scikit-learn's style: ``set_config`` / ``config_context``.

Every setting can also come from an environment variable named
``SKLEARN_GPU_BRIDGE_<NAME>`` (upper case); a value set in Python wins. A
child process started by joblib inherits the environment, which is how it
finds the same worker as its parent.
"""

import os
import threading
from contextlib import contextmanager

ENV_PREFIX = "SKLEARN_GPU_BRIDGE_"

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
    # seconds without an answer to a ping before a worker is declared lost
    "heartbeat_timeout": 3.0,
    # how bulk arrays travel: auto (what `doctor`/`start` measured fastest for the running
    # worker, else the pool where the worker can map it) | pool | frames (no pool); see transport.py
    "transport": "auto",
    # arrays the worker already holds are not sent again (a content fingerprint names them):
    # auto (on when arrays travel as frames; with the pool, a memcpy is cheaper than hashing) | on | off
    "array_cache": "auto",
    # ... for arrays of at least this many bytes
    "cache_min_bytes": 1 << 20,
    # elapsed time on stderr during long waits: auto (only when stderr is a terminal) | on | off
    "progress": "auto",
    # `start --wsl` / `doctor` on Windows: the WSL distribution (None: WSL's default one)
    "wsl_distro": None,
    # ... and the worker's Python inside it (a virtualenv's bin/python, for example)
    "wsl_python": "python3",
    # a fitted model that can reach no worker answers with the scikit-learn model it
    # carries (with a RuntimeWarning) instead of raising WorkerUnavailable; fits never do
    "cpu_fallback": False,
    # when a fitted model's state is copied to the client: "lazy" (first read of a fitted
    # attribute, pickling) or "eager" (right after each fit: models outlive their worker)
    "state_sync": "lazy",
}

_lock = threading.Lock()
_overrides = {}
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


def get_config():
    """The settings in force: Python overrides, then environment, then defaults.

    ``pool`` and ``pool_directory`` are those that ``transport`` implies for
    the worker in force (see :func:`transport_settings`).
    """
    settings, explicit = _raw_config()
    if settings["transport"] != "auto" or not explicit:
        settings["pool"], settings["pool_directory"], _ = _resolve_transport(
            settings, explicit, _connection_file_in_force(settings))
    return settings


def get_setting(name):
    """One setting as :func:`get_config` gives it, without resolving the transport.

    Read on every fit (``state_sync``): get_config() would stat and read the
    worker's state file each time, a tenth of a millisecond per call.
    """
    if name in ("pool", "pool_directory"):
        return get_config()[name]
    with _lock:
        if name in _overrides:
            return _overrides[name]
    return _from_env(name, DEFAULTS[name])


def transport_settings(connection_file=None):
    """(pool, pool_directory, reason) that ``transport`` implies for the worker at ``connection_file``.

    ``frames`` turns the pool off; ``pool`` and ``auto`` use what ``doctor`` or
    ``start`` measured for that worker, unless ``pool`` or ``pool_directory``
    were set explicitly (in Python or the environment).
    """
    settings, explicit = _raw_config()
    if connection_file is None:
        connection_file = _connection_file_in_force(settings)
    return _resolve_transport(settings, explicit, connection_file)


def _raw_config():
    with _lock:
        overrides = dict(_overrides)
    settings = {k: overrides[k] if k in overrides else _from_env(k, v) for k, v in DEFAULTS.items()}
    explicit = {k for k in ("pool", "pool_directory") if k in overrides or ENV_PREFIX + k.upper() in os.environ}
    return settings, explicit


def _resolve_transport(settings, explicit, connection_file):
    from .transport import resolve  # imported here: config is imported by everything

    return resolve(settings["transport"], connection_file, pool=settings["pool"],
                   pool_directory=settings["pool_directory"], explicit=explicit)


def _connection_file_in_force(settings):
    """The file the client will read: the setting, else the default file if it exists."""
    if settings["connection_file"] is not None:
        return settings["connection_file"]
    from .connect import default_connection_file

    path = default_connection_file()
    return path if path.exists() else None


def set_config(**settings):
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


@contextmanager
def config_context(**settings):
    """Change settings inside a ``with`` block, and restore them after."""
    with _lock:
        saved = dict(_overrides)
    set_config(**settings)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)
