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
    return raw


def get_config():
    """The settings in force: Python overrides, then environment, then defaults."""
    with _lock:
        overrides = dict(_overrides)
    return {k: overrides[k] if k in overrides else _from_env(k, v) for k, v in DEFAULTS.items()}


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
