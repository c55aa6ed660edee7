"""A connection: the operations of the bridge (fit, call, get_state ...) over a transport.

The estimators speak to a :class:`Connection`; it builds each request's header, casts the arrays
it sends as the worker computes (:func:`features_as_sent`), sizes room for the reply's arrays, and
reads the reply. How the request travels is its transport's business
(:mod:`sklearn_gpu_bridge.transport`): ZeroMQ to a worker process, or the worker's operations in
this process.
"""

import time
from dataclasses import dataclass

import cloudpickle
import numpy as np

from .. import ledger
from ..config import get_setting
from ..errors import ConfigurationError, ProtocolError
from ..protocol import AsDtype, to_plain
from ..protocol.arrays import is_sparse
from ..transport.base import Transport
from ..transport.remote import HELLO_TIMEOUT, RemoteTransport

ALIGN = 64  # reply arrays start on this boundary inside the output block
PRECISIONS = ("float32", "native")


def _precision():
    value = get_setting("precision")
    if value not in PRECISIONS:
        raise ConfigurationError(f"precision={value!r}: choose one of {PRECISIONS}")
    return value


def features_as_sent(args, float_dtype):
    """``args`` with X (the first) as it travels.

    float64 is cast to the worker's float dtype on its way (cuML: float32)
    unless the ``precision`` setting is "native";
    strings and objects (categories) go as nested lists of plain values.
    """
    X = args[0] if args else None
    if not isinstance(X, np.ndarray) and not is_sparse(X):
        return list(args)
    if X.dtype.kind in "OUS":
        try:
            return [to_plain(X.tolist()), *args[1:]]
        except TypeError as exc:
            raise TypeError(f"values of type {exc} cannot be sent to the worker") from None
    if X.dtype == np.float64 and float_dtype and _precision() == "float32":
        return [AsDtype(X, float_dtype), *args[1:]]
    return list(args)


@dataclass
class Fitted:
    """What a fit request gives back."""

    handle: int
    result: object  #: the method's result (fit_transform's X', fit_predict's labels), None for fit
    dropped: list  #: parameters the worker's class does not take


class Connection:
    """The bridge's operations, spoken over one :class:`~sklearn_gpu_bridge.transport.base.Transport`.

    Parameters
    ----------
    transport : Transport
        How requests reach the worker; see :func:`connect` for a worker process.
    """

    def __init__(self, transport: Transport):
        self.transport = transport

    # what the transport knows, read by the estimators, the CLI and the tests
    capabilities = property(lambda self: self.transport.capabilities)
    pid = property(lambda self: self.transport.pid)
    closed = property(lambda self: self.transport.closed)
    process = property(lambda self: self.transport.process)
    pool = property(lambda self: self.transport.pool)
    cache = property(lambda self: self.transport.cache)
    stats = property(lambda self: self.transport.stats)
    info = property(lambda self: self.transport.info)
    last_timing = property(lambda self: self.transport.last_timing)
    last_stamps = property(lambda self: self.transport.last_stamps)

    def _features(self, args):
        return features_as_sent(args, self.capabilities.float_dtype)

    def _out_nbytes(self, args, n_classes):
        """Room for the reply's arrays: one row per sample, as wide as X or the class scores."""
        X = args[0] if args else None
        if not hasattr(X, "shape") or not hasattr(X, "ndim") or X.ndim == 0:
            return 0
        width = max(X.shape[1] if X.ndim > 1 else 1, n_classes * max(n_classes - 1, 1) // 2, n_classes, 2)
        return X.shape[0] * width * 8

    def _request(self, header, payload=None, *, blobs=None, out_nbytes=0):
        """``transport.request``, measured (:meth:`_measured`)."""
        return self._measured(header, blobs, lambda: self.transport.request(header, payload, blobs=blobs,
                                                                            out_nbytes=out_nbytes))

    def _measured(self, header, blobs, send):
        """``send()`` (the request of ``header``, a tuple from the reply to its buffers), measured for
        :mod:`~sklearn_gpu_bridge.ledger` while a report records; nothing more otherwise."""
        if not ledger.recording():
            return send()
        started, answer = time.monotonic(), None
        try:
            answer = send()
        finally:
            reply, buffers = (answer[0], answer[-1]) if answer is not None else (None, None)
            ledger.note(self, header, reply, blobs, buffers, started)
        return answer

    # ------------------------------------------------------------ operations

    def fit(self, estimator: str, params: dict, method: str, args: list, kwargs: dict, changed=(),
            params_from: str | None = None, finite: bool = False) -> Fitted:
        """Build ``estimator`` with ``params`` on the worker and run ``method``; a :class:`Fitted`.

        ``changed``: the parameters the user set (a worker refuses to ignore those).
        ``params_from="sklearn"``: ``params`` are scikit-learn's class's (accel), mapped on the worker.
        ``finite``: every float array was checked for NaN and inf here; the worker does not look again.
        """
        header = {"op": "fit", "estimator": estimator, "method": method, "changed": list(changed)}
        if params_from is not None:
            header["params_from"] = params_from
        if finite:
            header["finite"] = True
        blobs = None
        try:
            header["params"] = to_plain(params)
        except TypeError:  # a value that is not plain (a callable, an object): cloudpickle
            blobs = {"params": cloudpickle.dumps(params)}
        out_nbytes = 0 if method in ("fit", "partial_fit") else self._out_nbytes(args, 0)
        payload = {"args": self._features(args), "kwargs": kwargs}
        _, value, _ = self._request(header, payload, blobs=blobs, out_nbytes=out_nbytes)
        return Fitted(value["handle"], value["result"], value.get("dropped") or [])

    def call(self, handle: int, method: str, args: list, kwargs: dict, *, n_classes: int = 0,
             finite: bool = False):
        """``method(*args, **kwargs)`` on the fitted estimator ``handle``; its result (``finite``: see fit)."""
        header = {"op": "call", "handle": handle, "method": method}
        if finite:
            header["finite"] = True
        payload = {"args": self._features(args), "kwargs": kwargs}
        _, value, _ = self._request(header, payload, out_nbytes=self._out_nbytes(args, n_classes))
        return value["result"]

    def attribute(self, handle: int, name: str):
        """A public fitted attribute (``coef_`` ...) of a remote estimator."""
        _, value, _ = self._request({"op": "attribute", "handle": handle, "name": name})
        return value["result"]

    def echo(self, *arrays, out_nbytes=None):
        """Send arrays to the worker and get them back (tests and benchmarks of the transport)."""
        if out_nbytes is None:
            out_nbytes = sum(a.nbytes for a in arrays) + ALIGN * len(arrays)
        payload = {"args": list(arrays), "kwargs": {}}
        _, value, _ = self.transport.request({"op": "echo"}, payload, out_nbytes=out_nbytes)
        return value["result"]

    def get_state(self, handle: int) -> tuple[str, bytes | None, bytes | None]:
        """(backend, portable bytes or None, native bytes or None) of a fitted estimator."""
        header = {"op": "get_state", "handle": handle}
        reply, buffers = self._measured(header, None, lambda: self.transport.roundtrip(header))
        blobs = [getattr(buffer, "bytes", buffer) for buffer in buffers]  # ZeroMQ frames, or bytes
        forms = [form for form in ("portable", "native") if reply.get(form)]
        if len(blobs) != len(forms) or not forms:
            raise ProtocolError("a state reply carries one blob per form it names")
        state = dict(zip(forms, blobs))
        return reply["backend"], state.get("portable"), state.get("native")

    def set_state(self, estimator: str, form: str, blob: bytes) -> int:
        """A handle to a fitted ``estimator`` rebuilt on the worker from a form of its state."""
        header = {"op": "set_state", "estimator": estimator, "form": form}
        reply, _, _ = self._request(header, blobs={"state": blob})
        return reply["handle"]

    def status(self) -> dict:
        """The worker's state: backend, versions, handles, clients, memory (see docs/protocol.md)."""
        reply, _ = self.transport.roundtrip({"op": "status"}, timeout=HELLO_TIMEOUT)
        return {k: v for k, v in reply.items() if k not in ("op", "id", "parent", "worker_span")}

    def ping(self, timeout: float = 2.0) -> bool:
        """True if the worker answers within ``timeout`` seconds, busy or not."""
        return self.transport.ping(timeout)

    def heads_up(self) -> None:
        """A call is about to validate and send its request: let the transport wake the worker."""
        self.transport.heads_up()

    def schedule_release(self, handle: int) -> None:
        """Free ``handle`` with the next request (called from finalizers: no I/O here)."""
        self.transport.schedule_release(handle)

    def close(self) -> None:
        """Say goodbye (the worker frees this client's handles) and close the transport."""
        self.transport.close()

    def retire(self) -> None:
        """After the worker was lost: release what is left without talking to it."""
        self.transport.retire()


def connect(info, **options) -> Connection:
    """A :class:`Connection` to the worker of ``info`` (a connection file's contents), over ZeroMQ.

    ``options`` are :class:`~sklearn_gpu_bridge.transport.remote.RemoteTransport`'s: ``pool``,
    ``pool_directory``, ``heartbeat_timeout``, ``array_cache``, ``cache_min_bytes``, ``process``,
    ``connection_file``.
    """
    return Connection(RemoteTransport(info, **options))
