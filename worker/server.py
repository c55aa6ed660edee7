"""The worker: a ZeroMQ ROUTER loop in front of a backend.

The main thread owns the sockets. It answers quick operations (hello, ping,
status, release, goodbye, shutdown) itself, and hands estimator work (fit,
call, get_state, set_state) to an executor thread, whose reply comes back
through an inproc socket. So the worker still answers ``ping`` while a long
fit runs: that is how a client tells "busy" from "dead".

A message that fails its signature, or is malformed in any way, is dropped
and counted; it never reaches pickle and never stops the loop.
"""

import ipaddress
import re
import logging
import os
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import zmq

from sklearn_gpu_bridge import __version__
from sklearn_gpu_bridge.connect import ConnectionInfo, new_key, write_connection_file
from sklearn_gpu_bridge.errors import ProtocolError, VersionMismatch
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Decoder, Encoder, Session, new_id, to_plain
from sklearn_gpu_bridge.shm import PoolAttachment, PoolError, default_directory, pid_alive

from .backends import FIT_METHODS, METHODS
from .registry import Registry

log = logging.getLogger("sklearn_gpu_bridge.worker")

QUICK_OPS = frozenset({"hello", "ping", "status", "release", "goodbye", "shutdown"})
WORK_OPS = frozenset({"fit", "call", "attribute", "get_state", "set_state", "echo"})
# a public fitted attribute: lower case, trailing underscore (coef_, n_iter_)
FITTED_ATTRIBUTE = re.compile(r"^[a-z][a-z0-9_]*_$")
ALIGN = 64


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Worker:
    """Serves one backend on one address until shut down."""

    def __init__(self, backend, *, host="127.0.0.1", port=0, connection_file=None,
                 threads=1, parent_pid=None, fallback_reason=None, pool_dirs=None):
        self.backend = backend
        self.versions = {"sklearn-gpu-bridge": __version__, **backend.versions()}  # asked once
        self.fallback_reason = fallback_reason
        self.host, self.port = host, port
        self.connection_file = connection_file
        self.parent_pid = parent_pid
        # where clients' pool files may be found (never a folder a request names)
        self.pool_dirs = list(dict.fromkeys(pool_dirs or (default_directory(), tempfile.gettempdir())))
        self.worker_id = new_id()
        self.key = new_key()
        self.session = Session(bytes.fromhex(self.key))
        self.registry = Registry()
        self.pools = {}  # pool name -> PoolAttachment
        self.client_pools = {}  # client id -> pool name
        self.counts = Counter()
        self.started = time.time()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sgb-work")
        self._local = threading.local()
        self._stopping = threading.Event()
        self.context = zmq.Context()
        self.address = None
        self.curve_public = None

    # ------------------------------------------------------------ lifecycle

    def start(self):
        """Warm up, bind, and write the connection file (which means: ready)."""
        self.backend.warm_up()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        if not is_loopback(self.host):
            public, secret = zmq.curve_keypair()
            self.router.curve_server = True
            self.router.curve_secretkey = secret
            self.curve_public = public.decode()
            log.info("binding %s: CurveZMQ encryption is on", self.host)
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port:
            self.router.bind(f"tcp://{host}:{self.port}")
        else:
            self.port = self.router.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{self.port}"
        self.results = self.context.socket(zmq.PULL)
        self.results.bind(f"inproc://results-{self.worker_id}")
        self.info = ConnectionInfo(
            address=self.address, key=self.key, protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(), backend=self.backend.name, curve_server_key=self.curve_public,
        )
        if self.connection_file:
            write_connection_file(self.connection_file, self.info)
        log.info("worker ready on %s (backend %s, pid %d)", self.address, self.backend.name, os.getpid())
        return self

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM, a shutdown request, or the parent's death."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self._stopping.set())
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.results, zmq.POLLIN)
        last_parent_check = time.monotonic()
        try:
            while not self._stopping.is_set():
                events = dict(poller.poll(200))
                if self.results in events:
                    self._forward_results()
                if self.router in events:
                    self._receive()
                if self.parent_pid and time.monotonic() - last_parent_check > 1.0:
                    last_parent_check = time.monotonic()
                    if not pid_alive(self.parent_pid):
                        log.info("parent process %d is gone; stopping", self.parent_pid)
                        break
        finally:
            self.close()

    def close(self):
        self._stopping.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for pool in self.pools.values():
            pool.close()
        if self.connection_file:
            try:
                os.unlink(self.connection_file)
            except FileNotFoundError:
                pass
        self.context.destroy(linger=0)
        log.info("worker stopped")

    # ------------------------------------------------------------ the loop

    def _forward_results(self):
        while True:
            try:
                frames = self.results.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.router.send_multipart(frames, copy=False)

    def _receive(self):
        frames = self.router.recv_multipart(copy=False)
        identity, frames = frames[0], frames[1:]
        try:
            header, buffers = self.session.unpack(frames)
        except ProtocolError as exc:
            log.warning("dropped a message: %s", exc)
            return
        op = header["op"]
        self.counts[op] += 1
        if op in WORK_OPS:
            self._executor.submit(self._work, identity, header, buffers)
        elif op in QUICK_OPS:
            self.router.send_multipart([identity, *self._handle(header, buffers)], copy=False)
        else:
            error = ProtocolError(f"unknown operation {op!r}")
            self.router.send_multipart([identity, *self._error_reply(header, error)], copy=False)

    def _work(self, identity, header, buffers):
        frames = self._handle(header, buffers)
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.context.socket(zmq.PUSH)
            push.linger = 0
            push.connect(f"inproc://results-{self.worker_id}")
        push.send_multipart([identity, *frames], copy=False)

    def _handle(self, header, buffers):
        """Run one operation; always returns reply frames, never raises."""
        try:
            self._release(header.get("release"))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                payload, reply_buffers = getattr(self, "_op_" + header["op"])(header, buffers)
            reply = {"op": "reply", "id": new_id(), "parent": header.get("id"), **payload}
            if caught:
                reply["warnings"] = [
                    (w.category.__module__, w.category.__name__, str(w.message)) for w in caught
                ]
            return self.session.pack(reply, reply_buffers)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            return self._error_reply(header, exc)

    def _error_reply(self, header, exc):
        mro = [(c.__module__, c.__qualname__) for c in type(exc).__mro__ if issubclass(c, BaseException)]
        try:
            args = to_plain(tuple(exc.args))
        except TypeError:
            args = (str(exc),)
        reply = {
            "op": "error", "id": new_id(), "parent": header.get("id"), "mro": mro,
            "args": args, "message": str(exc), "traceback": traceback.format_exc(),
        }
        return self.session.pack(reply)

    def _release(self, handles):
        if handles:
            if not isinstance(handles, list):
                raise ProtocolError("'release' must be a list of handles")
            self.registry.release(handles)

    # ------------------------------------------------------------ quick ops

    def _op_hello(self, header, buffers):
        version = header.get("protocol_version")
        if version != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"client speaks protocol {version}, this worker speaks {PROTOCOL_VERSION}: "
                "install the same sklearn-gpu-bridge version on both sides"
            )
        pool_ok = False
        pool = header.get("pool")
        client = header.get("client")
        if isinstance(pool, dict):
            pool_ok = self._attach_pool(client, pool)
        return {
            "protocol_version": PROTOCOL_VERSION, "worker_id": self.worker_id,
            "backend": self.backend.name, "fallback_reason": self.fallback_reason,
            "float_dtype": self.backend.float_dtype, "pool": pool_ok,
            "versions": self.versions,
        }, []

    def _attach_pool(self, client, pool):
        """Map the client's pool if this host can see it; the probe bytes prove it.

        The client names its pool, never a path: the worker looks for that name
        in its own pool folders (``--pool-dir``) only.
        """
        name, probe = pool.get("name"), pool.get("probe", {})
        attachment = self.pools.get(name)
        candidates = [attachment] if attachment else []
        for directory in self.pool_dirs:
            try:
                candidates.append(PoolAttachment(directory, name))
            except PoolError as exc:
                log.info("client %s: %s", client, exc)
                return False
        for candidate in candidates:
            try:
                if bytes(candidate.buffer(probe.get("segment"), probe.get("offset"), 16)) == pool.get("probe_bytes"):
                    self.pools[candidate.name] = candidate
                    self.client_pools[client] = candidate.name
                    return True
            except (PoolError, AttributeError, TypeError):
                continue
        log.info("client %s: pool %r is not in %s; arrays go as frames", client, name, self.pool_dirs)
        return False

    def _op_ping(self, header, buffers):
        return {"busy": self._executor._work_queue.qsize()}, []

    def _op_status(self, header, buffers):
        return {
            "backend": self.backend.name, "pid": os.getpid(), "address": self.address,
            "uptime": time.time() - self.started, "handles": len(self.registry),
            "pools": len(self.pools), "requests": dict(self.counts),
            "refused": dict(self.session.refused),
            "versions": self.versions,
        }, []

    def _op_release(self, header, buffers):
        return {}, []  # the handles were released by _handle

    def _op_goodbye(self, header, buffers):
        client = header.get("client")
        released = self.registry.release_client(client)
        name = self.client_pools.pop(client, None)
        if name and name not in self.client_pools.values():
            self.pools.pop(name).close()
        return {"released": released}, []

    def _op_shutdown(self, header, buffers):
        self._stopping.set()
        return {}, []

    # ------------------------------------------------------------ work ops

    def _attachment(self, header):
        """The pool this request names, which must be the one its client attached."""
        name = header.get("pool")
        if not name:
            return None
        if self.client_pools.get(header.get("client")) != name:
            raise ProtocolError("request names a pool that its client did not attach")
        return self.pools[name]

    def _decoder(self, header, buffers):
        attachment = self._attachment(header)
        read_pool = None
        if attachment is not None:
            retains = header["op"] == "fit" or header.get("method") == "partial_fit"
            if self.backend.device_resident or not retains:
                read_pool = attachment.buffer
            else:  # a fitted CPU estimator may keep a view of its input: never of a slot the client reuses
                read_pool = lambda s, o, n: bytearray(attachment.buffer(s, o, n))  # noqa: E731
        return Decoder(header, buffers, read_pool=read_pool)

    def _encoder(self, header):
        """Results go into the output room the client leased, else as frames."""
        out = header.get("out")
        attachment = self._attachment(header)
        if not out or attachment is None:
            return Encoder()
        segment, start, size = out.get("segment"), out.get("offset"), out.get("nbytes")
        region = attachment.buffer(segment, start, size)  # validates the range once
        used = 0

        def place(nbytes):
            nonlocal used
            if used + nbytes > size:
                return None
            offset = used
            used = -(-(used + nbytes) // ALIGN) * ALIGN
            return segment, start + offset, region[offset : offset + nbytes]

        return Encoder(place)

    def _args(self, header, buffers):
        payload = self._decoder(header, buffers).decode(header.get("payload") or {})
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ProtocolError("payload must hold a list 'args' and a dict 'kwargs'")
        return args, kwargs

    def _params(self, header, buffers):
        params = header.get("params", {})
        if isinstance(params, dict) and "__blob__" in params:
            params = cloudpickle.loads(self._decoder(header, buffers).decode(params))
        if not isinstance(params, dict):
            raise ProtocolError("'params' must be a dict")
        return params

    def _reply_result(self, header, result, estimator, **extra):
        encoder = self._encoder(header)
        payload = encoder.encode({"result": None if result is estimator else result, **extra})
        try:
            payload = to_plain(payload)
        except TypeError as exc:
            raise TypeError(f"a result of type {exc} cannot be sent to the client") from None
        return {"payload": payload, "arrays": encoder.arrays}, encoder.buffers

    def _op_fit(self, header, buffers):
        method = header.get("method", "fit")
        if method not in FIT_METHODS:
            raise ProtocolError(f"{method!r} is not a fitting method")
        args, kwargs = self._args(header, buffers)
        estimator, dropped = self.backend.create(header.get("estimator"), self._params(header, buffers))
        with self.backend.output_context(method):
            result = getattr(estimator, method)(*args, **kwargs)
        handle = self.registry.add(estimator, header["estimator"], header.get("client"))
        return self._reply_result(header, result, estimator, handle=handle, dropped=dropped)

    def _op_call(self, header, buffers):
        entry = self.registry.get(header.get("handle"))
        method = header.get("method")
        if method not in METHODS or not callable(getattr(entry.estimator, method, None)):
            raise AttributeError(f"{entry.name} has no method {method!r} that the bridge may call")
        args, kwargs = self._args(header, buffers)
        with self.backend.output_context(method):
            result = getattr(entry.estimator, method)(*args, **kwargs)
        return self._reply_result(header, result, entry.estimator)

    def _op_attribute(self, header, buffers):
        entry = self.registry.get(header.get("handle"))
        name = header.get("name")
        if not isinstance(name, str) or not FITTED_ATTRIBUTE.match(name):
            raise AttributeError(f"{name!r} is not a public fitted attribute")
        return self._reply_result(header, getattr(entry.estimator, name), entry.estimator)

    def _op_echo(self, header, buffers):
        """Send the payload's arrays straight back: measures and tests the transport alone."""
        args, kwargs = self._args(header, buffers)
        return self._reply_result(header, args, None)

    def _op_get_state(self, header, buffers):
        entry = self.registry.get(header.get("handle"))
        fmt, blob = self.backend.export_state(entry.estimator)
        return {"format": fmt, "backend": self.backend.name}, [blob]

    def _op_set_state(self, header, buffers):
        name = header.get("estimator")
        self.backend.estimator_class(name)  # refuse unknown names before touching the blob
        blob = self._decoder(header, buffers).decode(header.get("state"))
        estimator = self.backend.import_state(name, header.get("format"), bytes(blob))
        return {"handle": self.registry.add(estimator, name, header.get("client"))}, []


