"""The exceptions and warnings a user of the bridge can see, and how errors cross the wire.

Every error the bridge itself raises derives from :class:`BridgeError`, every warning it gives is a
:class:`BridgeWarning`, and every warning it gives or passes on from the worker points at the user's
line (:func:`warn_at_caller`).
Errors raised by the estimator on the worker are NOT wrapped: the worker
describes them (:func:`describe`) and the client re-raises them with their
original type (``ValueError`` stays ``ValueError``) and the remote traceback
as ``__cause__`` (:func:`rebuild`), as loky does. Only types from a few
well-known modules are rebuilt; any other becomes :class:`RemoteError`.

Shared by both sides: imports nothing of the package.
"""

import importlib
import sys
import threading
import traceback
import warnings
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


class BridgeWarning(RuntimeWarning):
    """Base of every warning that the bridge itself gives.

    The notice that a worker runs scikit-learn on the CPU (cuML is not usable there), a fitted model
    answering on the CPU (``cpu_fallback``), a model pickled by another version. Warnings of the
    estimators on the worker (scikit-learn's or cuML's ``ConvergenceWarning`` ...) keep their own
    category. To silence the bridge's alone::

        warnings.filterwarnings("ignore", category=sklearn_gpu_bridge.BridgeWarning)
    """


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


# ---------------------------------------------------------------- the user's line

#: top-level modules whose frames a warning passes over on its way to the user's line: the bridge itself, and
#: what calls the estimators or loads them on the user's behalf (a Pipeline, a search, joblib, a pickle)
PASSED_OVER = frozenset({"sklearn_gpu_bridge", "sklearn", "joblib", "pickle", "copyreg", "copy"})


def _top_module(frame) -> str:
    return frame.f_globals.get("__name__", "").partition(".")[0]


def _internal(frame) -> bool:
    """A frame of the import system, which ``warnings.warn`` leaves out when it counts ``stacklevel``."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def caller_stacklevel() -> int:
    """The ``stacklevel`` at which ``warnings.warn``, called by the caller of this function, names the user's line.

    That is the innermost frame outside :data:`PASSED_OVER`, as a warning of scikit-learn's own points
    at the user's ``fit`` or ``predict``, also through a Pipeline or a search. Where every frame is
    passed over (in a joblib worker process, which runs no code of the user's), the innermost frame
    outside the bridge. Python 3.12's ``skip_file_prefixes`` does this; this runs on 3.10 too.
    """
    frame, level, fallback = sys._getframe(1), 1, None
    while True:
        top = _top_module(frame)
        if fallback is None and top != "sklearn_gpu_bridge":
            fallback = level
        if top not in PASSED_OVER:
            return level
        frame = frame.f_back
        while frame is not None and _internal(frame):
            frame = frame.f_back
        if frame is None:
            return fallback or level
        level += 1


#: top-level modules of the threads a search runs its fits in (joblib's threading backend)
THREAD_POOLS = frozenset({"threading", "concurrent", "multiprocessing"})


def _users_line_elsewhere():
    """(filename, line, globals) of the user's line in the main thread, where this thread runs none of the
    user's code (a search's thread, whose fits the main thread waits for in the user's ``fit``); else None."""
    main = threading.main_thread()
    if threading.current_thread() is main:
        return None
    frame = sys._getframe(2)
    while frame is not None:
        if _top_module(frame) not in PASSED_OVER | THREAD_POOLS and not _internal(frame):
            return None  # a thread of the user's own: its line is here
        frame = frame.f_back
    frame = sys._current_frames().get(main.ident)
    while frame is not None and (_top_module(frame) in PASSED_OVER | THREAD_POOLS or _internal(frame)):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


def warn_at_caller(message: str, category: type[Warning] = BridgeWarning) -> None:
    """``warnings.warn(message, category)`` at the user's line (:func:`caller_stacklevel`); in a search's
    thread, at the line of the main thread's that waits for it.

    Parameters
    ----------
    message : str
        What to say.
    category : type of Warning, default BridgeWarning
        The warning's class: the bridge's own, or a worker's warning's own (:func:`warning_class`).
    """
    elsewhere = _users_line_elsewhere()
    if elsewhere is None:
        warnings.warn(message, category, stacklevel=caller_stacklevel())
        return
    filename, line, module_globals = elsewhere
    warnings.warn_explicit(message, category, filename, line, module=module_globals.get("__name__"),
                           registry=module_globals.setdefault("__warningregistry__", {}),
                           module_globals=module_globals)
