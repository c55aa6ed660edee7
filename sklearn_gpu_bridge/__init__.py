"""sklearn-gpu-bridge: scikit-learn estimators that run on cuML in a worker process.

Importing the package is cheap: the settings and errors load now; the
``GPU*`` wrappers (and with them scikit-learn and ZeroMQ) load on first use.
"""

import os as _os

from .config import config_context, get_config, set_config
from .errors import (
    BridgeError,
    BridgeWarning,
    ConfigurationError,
    ProtocolError,
    RemoteError,
    VersionMismatch,
    WorkerLost,
    WorkerUnavailable,
)
from .ledger import report
from .version import __version__ as __version__

# Imported in place from a checkout (``python -m ...`` in the repository's root puts it first on sys.path): its
# worker/ and shm/ folders sit beside this one, where an install puts them inside (pyproject's package-dir).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "shm")) and all(
        _os.path.isfile(_os.path.join(_root, *parts)) for parts in (("pyproject.toml",), ("shm", "__init__.py"))):
    __path__.append(_root)

_FROM_CLIENT = ("get_connection", "reset_connection")


def _wrappers():
    from .estimators import __all__ as names

    return names


def __getattr__(name):
    if name in _FROM_CLIENT:
        from . import client

        return getattr(client, name)
    if name == "execution_mode":
        from .client.discovery import execution_mode

        return execution_mode
    if name.startswith("GPU"):
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BridgeError", "BridgeWarning", "ConfigurationError", "ProtocolError", "RemoteError", "VersionMismatch",
    "WorkerLost", "WorkerUnavailable", "config_context", "execution_mode", "get_config", "get_connection",
    "report", "reset_connection", "set_config",
    *_wrappers(),
]
