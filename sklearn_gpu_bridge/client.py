"""The client: one connection per process to one worker.

Each thread gets its own DEALER socket; the process has one shared-memory
pool and one list of handles waiting to be released. A forked or spawned
child (joblib's workers) opens its own connection to the SAME worker: it
finds it through the environment variable that names the connection file.
"""

import atexit
import importlib
import logging
import os
import threading
import time
import warnings
import weakref
from collections import Counter, deque

import numpy as np
import zmq

from .config import ENV_PREFIX, get_config
from .connect import default_connection_file, read_connection_file
from .local_worker import ensure_local_worker, is_local_connection_file
from .errors import (
    ProtocolError,
    RemoteError,
    RemoteTraceback,
    VersionMismatch,
    WorkerLost,
    WorkerUnavailable,
)
from .protocol import INLINE_MAX, PROTOCOL_VERSION, Decoder, Encoder, Session, new_id
from .shm import Pool

log = logging.getLogger(__name__)

ENV_CONNECTION_FILE = ENV_PREFIX + "CONNECTION_FILE"
HELLO_TIMEOUT = 10.0
POLL_SECONDS = 0.5


def start_hint(path="PATH"):
    return f"start one with:  sklearn-gpu-bridge worker --connection-file {path}"


# Remote exceptions are rebuilt only from these modules; others become RemoteError.
SAFE_ERROR_MODULES = frozenset({
    "builtins", "sklearn.exceptions", "sklearn_gpu_bridge.errors", "numpy.linalg", "numpy.exceptions",
})


class Connection:
    """A process's link to one worker: sockets per thread, one pool, pending releases."""

    def __init__(self, info, *, connection_file=None, pool="auto", pool_directory=None,
                 heartbeat_timeout=2.0, process=None):
        self.info = info
        self.connection_file = connection_file or "PATH"
        self.pid = os.getpid()
        self.client_id = new_id()
        self.process = process  # the local worker's Popen, to notice its death at once
        self.heartbeat_timeout = heartbeat_timeout
        self.context = zmq.Context()
        self.session = Session(info.key_bytes)
        self.stats = Counter()  # arrays sent/received per path: inline, pool, frame
        self._stats_lock = threading.Lock()
        self.closed = False
        self._local = threading.local()
        self._sockets = []
        self._sockets_lock = threading.Lock()
        self._releases = deque()
        self.pool = Pool(pool_directory) if pool != "off" else None
        try:
            self.hello = self._hello()
        except BaseException:
            self._close_sockets()
            raise

    # ------------------------------------------------------------ sockets

    def _new_socket(self):
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        if self.info.curve_server_key:
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey = self.info.curve_server_key.encode()
            sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.connect(self.info.address)
        return sock

    def _socket(self):
        sock = getattr(self._local, "socket", None)
        if sock is None:
            sock = self._local.socket = self._new_socket()
            with self._sockets_lock:
                self._sockets.append(sock)
        return sock

    # ------------------------------------------------------------ round trips

    def _hello(self):
        header = {"op": "hello", "protocol_version": PROTOCOL_VERSION, "pid": os.getpid()}
        probe = None
        if self.pool is not None:
            probe, token = self.pool.lease(16), os.urandom(16)
            probe.buffer()[:16] = token
            header["pool"] = {
                "name": self.pool.name,
                "probe": {"segment": probe.segment, "offset": probe.offset}, "probe_bytes": token,
            }
        try:
            reply, _ = self._roundtrip(header, timeout=HELLO_TIMEOUT)
        except WorkerLost as exc:
            raise WorkerUnavailable(
                f"no worker answered at {self.info.address} within {HELLO_TIMEOUT:.0f} s "
                f"(not running, or a different key); {start_hint(self.connection_file)}"
            ) from exc
        finally:
            if probe is not None:
                probe.release()
        if reply.get("protocol_version") != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"worker speaks protocol {reply.get('protocol_version')}, this client {PROTOCOL_VERSION}"
            )
        if not reply.get("pool") and self.pool is not None:
            self.pool.close()
            self.pool = None
        return reply

    def _roundtrip(self, header, buffers=(), timeout=None):
        """Send one signed request and wait for its reply (or an error)."""
        header["id"] = new_id()
        header["client"] = self.client_id
        releases = self._drain_releases()
        if releases:
            header["release"] = releases
        sock = self._socket()
        sock.send_multipart(self.session.pack(header, buffers), copy=False)
        reply, reply_buffers = self._await(sock, header["id"], timeout)
        if reply["op"] == "error":
            raise rebuild_error(reply)
        for module, category, message in reply.get("warnings", ()):
            warnings.warn(message, _warning_class(module, category), stacklevel=4)
        return reply, reply_buffers

    def _await(self, sock, msg_id, timeout):
        waited = 0.0
        while True:
            if sock.poll(POLL_SECONDS * 1000):
                frames = sock.recv_multipart(copy=False)
                try:
                    reply, buffers = self.session.unpack(frames)
                except ProtocolError as exc:
                    log.warning("dropped a reply: %s", exc)
                    continue
                if reply.get("parent") == msg_id:
                    return reply, buffers
                continue  # the late reply of a request given up on
            waited += POLL_SECONDS
            if self.process is not None and self.process.poll() is not None:
                self.closed = True
                raise WorkerLost(f"the local worker exited (code {self.process.returncode}) during the call")
            if timeout is not None:
                if waited >= timeout:
                    raise WorkerLost(f"no reply from {self.info.address} within {timeout:.0f} s")
            elif not self.ping(self.heartbeat_timeout):
                self.closed = True
                raise WorkerLost(
                    f"the worker at {self.info.address} stopped answering "
                    f"(no ping reply within {self.heartbeat_timeout:.0f} s) during the call"
                )

    def ping(self, timeout=2.0):
        """True if the worker answers a ping within ``timeout`` seconds (busy or not)."""
        sock = self._new_socket()
        try:
            msg_id = new_id()
            sock.send_multipart(self.session.pack({"op": "ping", "id": msg_id, "client": self.client_id}))
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(left * 1000):
                    return False
                try:
                    reply, _ = self.session.unpack(sock.recv_multipart())
                except ProtocolError:
                    continue
                if reply.get("parent") == msg_id:
                    return True
            return False
        finally:
            sock.close(linger=0)

    def request(self, header, payload=None, *, blobs=None, out_nbytes=0):
        """A round trip carrying arrays: pool slots are leased for the request's lifetime.

        ``out_nbytes`` reserves room in the pool for the reply's arrays; the
        slots that results occupy stay leased until those arrays are freed.
        Returns (reply header, decoded payload, reply buffers).
        """
        leases = []
        place = None
        if self.pool is not None:
            header["pool"] = self.pool.name

            def place(nbytes):
                lease = self.pool.lease(nbytes)
                leases.append(lease)
                return lease.segment, lease.offset, lease.buffer()

        encoder = Encoder(place)
        if payload is not None:
            header["payload"] = encoder.encode(payload)
        for name, blob in (blobs or {}).items():
            header[name] = encoder.blob(blob)
        header["arrays"] = encoder.arrays
        out = None
        if self.pool is not None and out_nbytes > INLINE_MAX:
            out = self.pool.lease(out_nbytes)
            header["out"] = {"segment": out.segment, "offset": out.offset, "nbytes": out.nbytes}
        self._count("sent_", encoder.counts)
        try:
            reply, buffers = self._roundtrip(header, encoder.buffers)
        except WorkerLost:
            raise  # the lost worker may still write: its slots are never reused
        except BaseException:
            for lease in leases:
                lease.release()
            if out is not None:
                out.release()
            raise
        for lease in leases:
            lease.release()
        decoder = Decoder(reply, buffers, read_pool=_OutputReader(out), writeable=True)
        value = decoder.decode(reply.get("payload"))
        self._count("received_", decoder.counts)
        return reply, value, buffers

    def _count(self, prefix, counts):
        with self._stats_lock:
            for where, n in counts.items():
                self.stats[prefix + where] += n

    # ------------------------------------------------------------ operations

    def fit(self, estimator, params, method, args, kwargs, *, params_blob=None, out_nbytes=0):
        header = {"op": "fit", "estimator": estimator, "method": method, "params": params}
        blobs = {"params": params_blob} if params_blob is not None else None
        _, value, _ = self.request(header, {"args": args, "kwargs": kwargs}, blobs=blobs, out_nbytes=out_nbytes)
        return value

    def call(self, handle, method, args, kwargs, *, out_nbytes=0):
        header = {"op": "call", "handle": handle, "method": method}
        _, value, _ = self.request(header, {"args": args, "kwargs": kwargs}, out_nbytes=out_nbytes)
        return value["result"]

    def attribute(self, handle, name):
        """A public fitted attribute (``coef_`` ...) of a remote estimator."""
        _, value, _ = self.request({"op": "attribute", "handle": handle, "name": name})
        return value["result"]

    def echo(self, *arrays, out_nbytes=None):
        """Send arrays to the worker and get them back (tests and benchmarks of the transport)."""
        if out_nbytes is None:
            out_nbytes = sum(a.nbytes for a in arrays) + 64 * len(arrays)
        _, value, _ = self.request({"op": "echo"}, {"args": list(arrays), "kwargs": {}}, out_nbytes=out_nbytes)
        return value["result"]

    def get_state(self, handle):
        reply, buffers = self._roundtrip({"op": "get_state", "handle": handle})
        if len(buffers) != 1:
            raise ProtocolError("a state reply carries exactly one blob")
        return reply["format"], reply["backend"], buffers[0].bytes

    def set_state(self, estimator, fmt, blob):
        header = {"op": "set_state", "estimator": estimator, "format": fmt}
        reply, _, _ = self.request(header, blobs={"state": blob})
        return reply["handle"]

    def status(self):
        reply, _ = self._roundtrip({"op": "status"}, timeout=HELLO_TIMEOUT)
        return {k: v for k, v in reply.items() if k not in ("op", "id", "parent")}

    def schedule_release(self, handle):
        """Called from finalizers: no I/O here, the next request carries it."""
        self._releases.append(handle)

    def _drain_releases(self):
        handles = []
        while self._releases:
            try:
                handles.append(self._releases.popleft())
            except IndexError:
                break
        return handles

    def close(self):
        """Say goodbye (the worker frees this client's handles), close sockets and the pool."""
        if self.closed or self.pid != os.getpid():
            return
        self.closed = True
        try:
            self._roundtrip({"op": "goodbye"}, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - best effort at exit; the worker may be gone
            log.debug("goodbye failed: %s", exc)
        self._close_sockets()

    def _close_sockets(self):
        with self._sockets_lock:
            for sock in self._sockets:
                sock.close(linger=0)
            self._sockets.clear()
        if self.pool is not None:
            self.pool.close()
        self.context.term()


class _OutputReader:
    """Reads reply arrays from the request's output lease; the lease lives as long as they do."""

    def __init__(self, lease):
        self.lease = lease
        self.used = 0
        if lease is not None:
            self.whole = np.frombuffer(lease.buffer(), np.uint8)
            weakref.finalize(self.whole, lease.release)

    def __call__(self, segment, offset, nbytes):
        lease = self.lease
        if lease is None:
            raise ProtocolError("reply names the pool, but no output room was leased")
        start = offset - lease.offset if type(offset) is int else -1
        if segment != lease.segment or start < 0 or start + nbytes > lease.nbytes:
            raise ProtocolError("reply array lies outside the output room")
        return self.whole[start : start + nbytes].data


def _warning_class(module, name):
    if module in SAFE_ERROR_MODULES:
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type) and issubclass(cls, Warning):
            return cls
    return UserWarning


def rebuild_error(reply):
    """The worker's exception as its own type where that type is safe to build."""
    mro = reply.get("mro") or [("builtins", "Exception")]
    message = reply.get("message", "")
    exc = None
    for depth, (module, name) in enumerate(mro):
        if module not in SAFE_ERROR_MODULES:
            continue
        cls = getattr(importlib.import_module(module), name, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
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


# ---------------------------------------------------------------- the process's connection

_lock = threading.RLock()
_connection = None
_warned_fallback = False


def get_connection():
    """This process's connection, made on first use (starting a local worker if needed)."""
    global _connection
    conn = _connection
    if conn is not None and conn.pid == os.getpid() and not conn.closed:
        return conn
    with _lock:
        if _connection is None or _connection.pid != os.getpid() or _connection.closed:
            _connection = _connect()
            atexit.register(_connection.close)
        return _connection


def reset_connection():
    """Close this process's connection; the next call opens a new one."""
    global _connection
    with _lock:
        if _connection is not None and _connection.pid == os.getpid():
            _connection.close()
        _connection = None


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
    conn = Connection(
        info, connection_file=path, pool=config["pool"], pool_directory=config["pool_directory"],
        heartbeat_timeout=config["heartbeat_timeout"], process=process,
    )
    reason = conn.hello.get("fallback_reason")
    if reason and not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"sklearn-gpu-bridge: running on scikit-learn (CPU): {reason}", RuntimeWarning, stacklevel=4)
    return conn
