"""sklearn-gpu-bridge: scikit-learn estimators that run on cuML in a worker process."""

__version__ = "0.1.0"

from .client import get_connection, reset_connection  # noqa: E402
from .config import config_context, get_config, set_config  # noqa: E402
from .errors import (  # noqa: E402
    BridgeError,
    ProtocolError,
    RemoteError,
    VersionMismatch,
    WorkerLost,
    WorkerUnavailable,
)
from .estimators import *  # noqa: E402,F403  (the GPU* classes: estimators.__all__)
from .estimators import __all__ as _estimators

__all__ = [
    "BridgeError", "ProtocolError", "RemoteError", "VersionMismatch", "WorkerLost", "WorkerUnavailable",
    "config_context", "get_config", "get_connection", "reset_connection", "set_config", *_estimators,
]
