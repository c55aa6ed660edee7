"""The exceptions a user of the bridge can see, and how errors cross the wire.

Every error the bridge itself raises derives from :class:`BridgeError`.
Errors raised by the estimator on the worker are NOT wrapped: the worker
describes them (:func:`describe`) and the client re-raises them with their
original type (``ValueError`` stays ``ValueError``) and the remote traceback
as ``__cause__`` (:func:`rebuild`), as loky does. Only types from a few
well-known modules are rebuilt; any other becomes :class:`RemoteError`.

Shared by both sides: imports nothing of the package.
"""

import importlib
import traceback
from collections.abc import Callable, Mapping
from typing import Any


class BridgeError(Exception):
    """Base of every error that the bridge itself raises."""


class ConfigurationError(BridgeError, ValueError):
    """A setting, key or file was refused; the message says how to fix it (``fix``: the command, if one)."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class WorkerUnavailable(BridgeError):
    """No worker answered at the configured address."""


class WorkerLost(BridgeError):
    """The worker stopped answering in the middle of a call."""


class ProtocolError(BridgeError):
    """A message broke the protocol: bad framing, signature or descriptor."""


class VersionMismatch(ProtocolError):
    """Client and worker speak different protocol versions."""


class CacheMiss(BridgeError):
    """The worker no longer holds an array the client sent as "cached" (evicted, or another worker).

    The client answers it by sending the request again with the full data.
    """


class NotOnWorker(BridgeError, ValueError):
    """The worker cannot run this estimator as scikit-learn configured it (accel: it runs on the CPU instead).

    A cuML worker raises it where cuML's own conversion of scikit-learn's
    parameters says ``UnsupportedOnGPU``.
    """


class RemoteError(BridgeError):
    """An error on the worker whose type cannot be rebuilt on the client."""


class RemoteTraceback(Exception):
    """Carries the worker's traceback text; set as ``__cause__`` of remote errors."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n\n--- traceback on the worker ---\n{self.text}"


# ---------------------------------------------------------------- errors and warnings on the wire

#: remote exceptions and warnings are rebuilt only from these modules
SAFE_MODULES = frozenset({
    "builtins", "sklearn.exceptions", "sklearn_gpu_bridge.errors", "numpy.linalg", "numpy.exceptions",
})


def describe(exc: BaseException, plain: Callable[[Any], Any]) -> dict[str, Any]:
    """The fields of an error reply for ``exc``: its type's MRO, args, message and traceback.

    ``plain(value)`` turns the args into plain values or raises TypeError;
    args that cannot be are replaced by the message alone.
    """
    mro = [(c.__module__, c.__qualname__) for c in type(exc).__mro__ if issubclass(c, BaseException)]
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose text cannot be made
        message = f"{type(exc).__name__} (its message could not be rendered)"
    try:
        args = plain(tuple(exc.args))
    except (TypeError, ValueError):
        args = (message,)
    return {"mro": mro, "args": args, "message": message, "traceback": traceback.format_exc()}


def _safe_class(module: str, name: str, base: type) -> type | None:
    if module not in SAFE_MODULES:
        return None
    cls = getattr(importlib.import_module(module), name, None)
    return cls if isinstance(cls, type) and issubclass(cls, base) else None


def rebuild(reply: Mapping[str, Any]) -> Exception:
    """The worker's exception (an error reply) as its own type where that type is safe to build."""
    mro = reply.get("mro") or [("builtins", "Exception")]
    message = reply.get("message", "")
    exc = None
    for depth, (module, name) in enumerate(mro):
        cls = _safe_class(module, name, Exception)
        if cls is None:
            continue
        try:
            exc = cls(*reply.get("args", ())) if depth == 0 else cls(f"{mro[0][1]}: {message}")
        except Exception:  # noqa: BLE001 - a type whose constructor wants other arguments
            continue
        break
    if exc is None:
        exc = RemoteError(f"{mro[0][0]}.{mro[0][1]}: {message}")
    exc.__cause__ = RemoteTraceback(reply.get("traceback", ""))
    return exc


def warning_class(module: str, name: str) -> type[Warning]:
    """A warning category from the worker, or UserWarning where it is not safe to name."""
    return _safe_class(module, name, Warning) or UserWarning
