"""The client: one connection per process to one worker.

Each thread gets its own DEALER socket; the process has one shared-memory
pool and one list of handles waiting to be released. A forked or spawned
child (joblib's workers) opens its own connection to the SAME worker: it
finds it through the environment variable that names the connection file.

While a call waits, the client watches three things and raises
:class:`WorkerLost` on the first that fails: the TCP connection (a worker
that dies, SIGKILL included, closes it, which a socket monitor reports at
once), the local worker's process (when this process started it), and the
worker's answers to a ping sent every half second on a socket of its own (a
worker that hangs without dying stops answering; ``heartbeat_timeout``
seconds after its last answer it is declared lost). A worker busy with a
long fit still answers pings, so it is never mistaken for a dead one.
"""

import atexit
import importlib
import logging
import os
import subprocess
import threading
import time
import warnings
import weakref
from collections import Counter, deque

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from .config import ENV_PREFIX, get_config
from .connect import default_connection_file, read_connection_file
from .local_worker import ensure_local_worker, is_local_connection_file
from .errors import (
    CacheMiss,
    ProtocolError,
    RemoteError,
    RemoteTraceback,
    VersionMismatch,
    WorkerLost,
    WorkerUnavailable,
)
from .protocol import INLINE_MAX, PROTOCOL_VERSION, BoundedLRU, Decoder, Encoder, Session, new_id
from .shm import Pool

log = logging.getLogger(__name__)

ENV_CONNECTION_FILE = ENV_PREFIX + "CONNECTION_FILE"
HELLO_TIMEOUT = 10.0
POLL_SECONDS = 0.5  # a waiting call wakes up at least this often, and pings the worker this often
ARRAY_CACHE_MODES = ("auto", "on", "off")


def start_hint(path="PATH"):
    return f"start one with:  sklearn-gpu-bridge worker --connection-file {path}"


# Remote exceptions are rebuilt only from these modules; others become RemoteError.
SAFE_ERROR_MODULES = frozenset({
    "builtins", "sklearn.exceptions", "sklearn_gpu_bridge.errors", "numpy.linalg", "numpy.exceptions",
})


def _signing_key(info, path):
    """The connection file's key as bytes; an empty or unreadable key is refused."""
    try:
        key = bytes.fromhex(info.key or "")
    except (TypeError, ValueError):
        raise ProtocolError(f"the key in the connection file {path} is not hex") from None
    if not key:
        raise ProtocolError(
            f"the connection file {path} holds an empty key, which would turn message signing off; "
            f"refusing it. {start_hint(path)}"
        )
    return key


def _dealer(info, connect=True):
    """A DEALER to the worker (CurveZMQ when the worker encrypts), on the process's ZeroMQ context.

    The context is the process-wide ``zmq.Context.instance()``, never one per
    connection: a connection dropped with sockets still open (a thread that
    never noticed the loss) then costs those sockets, never a ``term()`` that
    blocks forever inside the garbage collector.
    """
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if info.curve_server_key:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = info.curve_server_key.encode()
        sock.curve_publickey, sock.curve_secretkey = public, secret
    if connect:
        sock.connect(info.address)
    return sock


class _Link:
    """One thread's sockets: requests, a monitor of the connection, and (when needed) pings."""

    def __init__(self, info):
        self.info = info
        self.socket = _dealer(info, connect=False)
        self.events = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        self.socket.connect(info.address)  # after the monitor: no event is missed
        self.pinger = None

    def disconnected(self):
        """Whether, since the last look, the connection dropped or a reconnect found nobody listening.

        ZeroMQ retries a refused connect every 100 ms, so a worker that died
        between two requests is known within that, not after a heartbeat timeout.
        """
        dropped = False
        while self.events.poll(0):
            event = recv_monitor_message(self.events)
            dropped |= event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED)
        return dropped

    def ping_socket(self):
        if self.pinger is None:
            self.pinger = _dealer(self.info)
        return self.pinger

    def close(self):
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        for sock in (self.events, self.socket, self.pinger):
            if sock is not None:
                sock.close(linger=0)


class KnownArrays(BoundedLRU):
    """The keys of the arrays that the worker keeps for this connection, as far as the client knows.

    Kept in the worker's order and within its byte bound, so that for a lone
    client it is what the worker holds. Where it is not (other clients filled
    the worker's cache, a worker restarted behind the same address), the
    worker answers CacheMiss and the request goes again in full.
    """

    def __init__(self, max_bytes, min_bytes):
        super().__init__(max_bytes)
        self.min_bytes = min_bytes

    def holds(self, key):
        return self.get(key) is not None


class Connection:
    """A process's link to one worker: sockets per thread, one pool, pending releases.

    ``array_cache`` (auto | on | off): arrays of at least ``cache_min_bytes``
    are named by a fingerprint of their content, and one the worker already
    keeps is sent as its key alone (see :class:`KnownArrays`). ``auto`` turns it
    on only when arrays travel as frames. Measured on a 2-core x86 VM, 50 MB::

        python -c "import hashlib,timeit,numpy as np; a=np.ones(50_000_000,np.uint8); b=a.copy(); \
          print(timeit.timeit(lambda: hashlib.blake2b(memoryview(a),digest_size=16).digest(),number=5)/5, \
                timeit.timeit(lambda: np.copyto(b,a),number=5)/5)"

    blake2b 40 to 44 ms (1.2 GB/s), np.copyto 2.6 ms (19 GB/s). With the pool
    (one memcpy into a slot) hashing costs 15 times what it saves. A frame
    crosses a network stack on each side: over TCP loopback on that VM, a
    repeated 50 MB fit took the same with and without the cache (100-120 ms);
    over a real network or WSL's forwarding, each repeat saves its transfer.
    """

    def __init__(self, info, *, connection_file=None, pool="auto", pool_directory=None,
                 heartbeat_timeout=2.0, process=None, array_cache="off", cache_min_bytes=1 << 20):
        if array_cache not in ARRAY_CACHE_MODES:
            raise ValueError(f"array_cache must be one of {', '.join(ARRAY_CACHE_MODES)}, not {array_cache!r}")
        self.info = info
        self.connection_file = connection_file or "PATH"
        key = _signing_key(info, self.connection_file)
        self.pid = os.getpid()
        self.client_id = new_id()
        self.process = process  # the local worker's Popen, to notice its death at once
        self.heartbeat_timeout = heartbeat_timeout
        self.session = Session(key)
        self.stats = Counter()  # arrays sent/received per path (inline, pool, frame, cached); cache_hits ...
        self._stats_lock = threading.Lock()
        self.closed = False
        self._local = threading.local()
        self._links = []
        self._sockets_lock = threading.Lock()
        self._releases = deque()
        self._keepalive = None
        self._stop_keepalive = threading.Event()
        self.pool = Pool(pool_directory) if pool != "off" else None
        try:
            self.hello = self._hello()
        except BaseException:
            self._close_sockets()
            raise
        if self.hello.get("client_timeout"):
            self._start_keepalive(float(self.hello["client_timeout"]))
        capacity = self.hello.get("array_cache") or 0
        wanted = array_cache == "on" or (array_cache == "auto" and self.pool is None)
        self.cache = KnownArrays(capacity, cache_min_bytes) if wanted and capacity else None

    # ------------------------------------------------------------ sockets

    def _new_socket(self):
        return _dealer(self.info)

    def _link(self):
        link = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = _Link(self.info)
            with self._sockets_lock:
                self._links.append(link)
        return link

    def _socket(self):
        return self._link().socket

    def _drop_link(self):
        """Close this thread's sockets (after its worker was lost); a thread closes only its own."""
        link = getattr(self._local, "link", None)
        if link is not None:
            self._local.link = None
            with self._sockets_lock:
                if link in self._links:
                    self._links.remove(link)
            link.close()

    def _lost(self, message):
        self.closed = True
        self._drop_link()
        return WorkerLost(message)

    # ------------------------------------------------------------ staying known to the worker

    def _start_keepalive(self, client_timeout):
        """Ping now and then, so that a worker that cannot watch this process does not free it."""
        interval = max(0.05, client_timeout / 4)

        def run():
            while not self._stop_keepalive.wait(interval):
                if self.closed or self.pid != os.getpid():
                    return
                if not self.ping(timeout=min(5.0, interval)):
                    log.debug("keepalive ping to %s got no answer", self.info.address)

        self._keepalive = threading.Thread(target=run, name="sgb-keepalive", daemon=True)
        self._keepalive.start()

    def _stop_keepalive_thread(self):
        self._stop_keepalive.set()
        thread = self._keepalive
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

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
            why = (f"within {HELLO_TIMEOUT:.0f} s (not running, or a different key)" if "within" in str(exc)
                   else "(nothing listens there, or it closed the connection: stopped, or a CurveZMQ key that "
                        "does not match)")
            raise WorkerUnavailable(
                f"no worker answered at {self.info.address} {why}; {start_hint(self.connection_file)}"
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
        link = self._link()
        link.disconnected()  # forget drops that happened before this request
        sent = time.monotonic()  # before the send: a send can return after the worker has the message
        link.socket.send_multipart(self.session.pack(header, buffers), copy=False)
        reply, reply_buffers = self._await(link, header["id"], timeout, header["op"])
        self._local.timing = (sent, time.monotonic(), reply.get("worker_span"))
        if reply["op"] == "error":
            raise rebuild_error(reply)
        for module, category, message in reply.get("warnings", ()):
            warnings.warn(message, _warning_class(module, category), stacklevel=4)
        return reply, reply_buffers

    def _await(self, link, msg_id, timeout, op):
        """The reply to ``msg_id``; WorkerLost as soon as the worker is known to be gone.

        With ``timeout`` (hello, status, goodbye): give up after that many
        seconds. Without: wait as long as the worker answers pings.
        """
        start = last_alive = time.monotonic()
        poller = zmq.Poller()
        poller.register(link.socket, zmq.POLLIN)
        poller.register(link.events, zmq.POLLIN)
        ping_id = None
        ping_every = min(POLL_SECONDS, self.heartbeat_timeout / 4)
        while True:
            now = time.monotonic()
            left = (start + timeout if timeout is not None else last_alive + self.heartbeat_timeout) - now
            if left <= 0:
                if timeout is not None:
                    raise self._lost(f"no reply from {self.info.address} within {timeout:.0f} s")
                raise self._lost(
                    f"the worker at {self.info.address} stopped answering "
                    f"(no ping reply for {self.heartbeat_timeout:g} s) during a {op!r} request"
                )
            events = dict(poller.poll(min(left, ping_every) * 1000))
            if link.socket in events:
                reply = self._receive(link.socket)
                if reply is not None and reply[0].get("parent") == msg_id:
                    return reply
                # otherwise the late reply of a request given up on: read on
            if link.events in events and link.disconnected():
                raise self._lost(f"the connection to the worker at {self.info.address} closed during a {op!r} "
                                 "request (the worker stopped or was killed)")
            if link.pinger is not None and link.pinger in events:
                pong = self._receive(link.pinger)
                if pong is not None and pong[0].get("parent") == ping_id:
                    last_alive, ping_id = time.monotonic(), None
            if self.process is not None and self.process.poll() is not None:
                raise self._lost(f"the local worker exited (code {self.process.returncode}) during a {op!r} request")
            if timeout is None and ping_id is None and time.monotonic() - last_alive >= ping_every:
                pinger = link.ping_socket()
                if pinger not in dict(poller.sockets):
                    poller.register(pinger, zmq.POLLIN)
                ping_id = new_id()
                pinger.send_multipart(self.session.pack({"op": "ping", "id": ping_id, "client": self.client_id}))

    def _receive(self, sock):
        """(header, buffers) of the next message on ``sock``, or None if it is refused."""
        frames = sock.recv_multipart(copy=False)
        try:
            return self.session.unpack(frames)
        except ProtocolError as exc:
            log.warning("dropped a reply: %s", exc)
            return None

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

        Arrays the worker keeps go as their key alone; if it no longer holds
        one (CacheMiss), the request is sent once more with every array in full.
        """
        try:
            return self._request(header, payload, blobs, out_nbytes, reuse=True)
        except CacheMiss:
            self._count("cache_", {"misses": 1})
            header.pop("release", None)  # the worker released those with the first try
            return self._request(header, payload, blobs, out_nbytes, reuse=False)

    def _request(self, header, payload, blobs, out_nbytes, reuse):
        leases = []
        place = None
        if self.pool is not None:
            header["pool"] = self.pool.name

            def place(nbytes):
                lease = self.pool.lease(nbytes)
                leases.append(lease)
                return lease.segment, lease.offset, lease.buffer()

        encoder = Encoder(place, cache=self.cache, reuse=reuse)
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
        except BaseException as exc:
            for lease in leases:
                lease.release()
            if out is not None:
                out.release()
            if isinstance(exc, CacheMiss) and encoder.reused:
                for key, _ in encoder.reused:
                    self.cache.pop(key)
            raise
        for lease in leases:
            lease.release()
        if encoder.reused or encoder.offered:
            kept = set(reply.get("cache_kept") or ())
            for key, nbytes in encoder.offered:
                if key in kept:
                    self.cache.put(key, True, nbytes)
            self._count("cache_", {"hits": len(encoder.reused),
                                   "bytes_saved": sum(nbytes for _, nbytes in encoder.reused)})
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
        return {k: v for k, v in reply.items() if k not in ("op", "id", "parent", "worker_span")}

    @property
    def last_timing(self):
        """This thread's last request, in seconds: (to the worker, on the worker, back), or None.

        From CLOCK_MONOTONIC stamps that the client and a worker on the same
        host share (profiles; across hosts only the middle one means anything).
        """
        timing = getattr(self._local, "timing", None)
        if timing is None or not timing[2]:
            return None
        sent, received, (arrived, replied) = timing
        return arrived - sent, replied - arrived, received - replied

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
        self._stop_keepalive_thread()
        try:
            self._roundtrip({"op": "goodbye"}, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - best effort at exit; the worker may be gone
            log.debug("goodbye failed: %s", exc)
        self._close_sockets()

    def retire(self):
        """After the worker was lost: stop pinging and remove the pool's files.

        Sockets of other threads are left to those threads (each closes its own
        when it notices the loss), so nothing is closed under a thread's feet.
        """
        self.closed = True
        self._stop_keepalive_thread()
        if self.pid == os.getpid():
            self._drop_link()  # the calling thread's own sockets
            if self.pool is not None:
                self.pool.close()
            if self.process is not None:
                # A local worker this process started: make sure it is gone (and reaped) before a new
                # one is started in its place. A killed one may still be tearing down; a frozen one is
                # killed here, since it stopped answering.
                try:
                    self.process.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    log.warning("the local worker %d stopped answering; killing it", self.process.pid)
                    self.process.kill()
                    self.process.wait()

    def _close_sockets(self):
        self._stop_keepalive_thread()
        with self._sockets_lock:
            for link in self._links:
                link.close()
            self._links.clear()
        if self.pool is not None:
            self.pool.close()


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


_exit_hook = None


def get_connection():
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
            _connection = _connect()
            if _exit_hook != os.getpid():
                _exit_hook = os.getpid()
                atexit.register(_close_at_exit)
        return _connection


def _usable(conn):
    """Open, of this process, and (for a local worker this process started) that worker still runs."""
    return (conn is not None and conn.pid == os.getpid() and not conn.closed
            and (conn.process is None or conn.process.poll() is None))


def _close_at_exit():
    conn = _connection
    if conn is not None and conn.pid == os.getpid():
        conn.close()


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
        array_cache=config["array_cache"], cache_min_bytes=config["cache_min_bytes"],
    )
    reason = conn.hello.get("fallback_reason")
    if reason and not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"sklearn-gpu-bridge: running on scikit-learn (CPU): {reason}", RuntimeWarning, stacklevel=4)
    return conn
