"""The worker: a ZeroMQ ROUTER loop in front of a backend.

The main thread owns the sockets. It answers quick operations (hello, ping,
status, release, goodbye, shutdown) itself, and hands estimator work (fit,
call, get_state, set_state) to an executor thread, whose reply comes back
through an inproc socket. So the worker still answers ``ping`` while a long
fit runs: that is how a client tells "busy" from "dead".

A message that fails its signature, or is malformed in any way, is dropped
and counted; it never reaches pickle and never stops the loop.

The worker keeps a small table of its clients. Once a second it frees what a
client left behind (its handles, its pool mapping, and the pool files of a
client that died) when that client is gone: a client on this host proves its
pid at hello (the pool file it names is mapped in that process), so its death
is seen at once; any other client is freed after ``client_timeout`` seconds
without a message (the client pings while it is idle, to stay).
"""

import cProfile
import ipaddress
import logging
import os
import pstats
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import numpy as np
import zmq
import zmq.auth

from sklearn_gpu_bridge import __version__
from sklearn_gpu_bridge.connect import ConnectionInfo, new_key, write_connection_file
from sklearn_gpu_bridge.errors import ProtocolError, VersionMismatch
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Decoder, Encoder, Session, new_id, to_plain
from sklearn_gpu_bridge.shm import PoolAttachment, PoolError, default_directory, pid_alive

from .backends import FIT_METHODS, METHODS
from .cache import ArrayCache
from .registry import Registry

log = logging.getLogger("sklearn_gpu_bridge.worker")

QUICK_OPS = frozenset({"hello", "ping", "status", "release", "goodbye", "shutdown"})
WORK_OPS = frozenset({"fit", "call", "attribute", "get_state", "set_state", "echo"})
# a public fitted attribute: lower case, trailing underscore (coef_, n_iter_)
FITTED_ATTRIBUTE = re.compile(r"^[a-z][a-z0-9_]*_$")
ALIGN = 64
SWEEP_SECONDS = 1.0
CLIENT_TIMEOUT = 600.0  # seconds without a message before a client that cannot be watched is freed
ARRAY_CACHE_BYTES = 1024 << 20  # arrays kept for clients (all together), so that a repeated array travels once
MIN_KEY_BYTES = 16
#: a file name: the work of every request is profiled and the stats written there at exit (diagnosis)
PROFILE_ENV = "SKLEARN_GPU_BRIDGE_WORKER_PROFILE"


class ConfigurationError(ValueError):
    """The worker was started with settings it refuses (the message says how to fix them)."""


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key(key):
    """The signing key as hex: a fresh one for None; an empty or short key is refused."""
    if key is None:
        return new_key()
    if isinstance(key, bytes):
        key = key.decode("ascii", errors="replace")
    key = key.strip()
    if not key:
        raise ConfigurationError(
            "the signing key is empty, which would turn message signing off; refusing to start "
            "(give no key and the worker makes a fresh one)"
        )
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise ConfigurationError("the signing key must be written in hex digits") from None
    if len(raw) < MIN_KEY_BYTES:
        raise ConfigurationError(f"the signing key must hold at least {MIN_KEY_BYTES * 8} bits "
                                 f"({MIN_KEY_BYTES * 2} hex digits), not {len(raw) * 8}")
    return raw.hex()


def curve_hint(host):
    return (
        f"binding {host} (not loopback) needs CurveZMQ encryption keys that you made. Make a pair once:\n"
        "    sklearn-gpu-bridge keys DIR\n"
        "then start the worker with\n"
        f"    sklearn-gpu-bridge worker --bind {host} --curve-secret-key DIR/worker.key_secret\n"
        "The public key goes into the connection file; clients need nothing else."
    )


def load_curve_secret(path):
    """(public, secret) Z85 keys from a ZeroMQ certificate file; it must be owner-only."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigurationError(f"CurveZMQ key file {path}: {exc.strerror}") from None
    if sys.platform != "win32" and mode & 0o077:
        raise ConfigurationError(
            f"CurveZMQ secret key file {path} can be read by other users (mode {mode & 0o777:03o}); "
            f"run  chmod 600 {path}"
        )
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path} is not a ZeroMQ certificate: {exc}") from None
    if not secret:
        raise ConfigurationError(
            f"{path} holds no secret key: pass the .key_secret file that `sklearn-gpu-bridge keys` wrote"
        )
    return public, secret


def make_curve_keys(directory, name="worker", force=False):
    """Write a CurveZMQ keypair as ZeroMQ certificate files; returns (public path, secret path).

    ``NAME.key_secret`` is created owner-only (0600) from the start, never
    widened afterwards; ``NAME.key`` holds the public key alone.
    """
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    paths = directory / f"{name}.key", directory / f"{name}.key_secret"
    if not force:
        for path in paths:
            if path.exists():
                raise FileExistsError(0, "exists", str(path))
    banner = "#   ZeroMQ CURVE {} certificate of a sklearn-gpu-bridge worker\n#   {}\n\nmetadata\ncurve\n"
    texts = (
        banner.format("public", "Give this file to anyone.") + f'    public-key = "{public.decode()}"\n',
        banner.format("SECRET", "Keep this file to yourself (mode 0600).")
        + f'    public-key = "{public.decode()}"\n    secret-key = "{secret.decode()}"\n',
    )
    for path, text, mode in zip(paths, texts, (0o644, 0o600)):
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(path, mode)  # whatever the umask
    return paths


def process_start(pid):
    """When process ``pid`` started (from /proc), or None if it does not exist or /proc is absent."""
    if type(pid) is not int or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # the command name (field 2) may hold spaces and ")": fields 3.. follow its last ")"
        return data[data.rindex(b")") + 2 :].split()[19]  # field 22: start time
    except (OSError, ValueError, IndexError):
        return None


def maps_file(pid, name):
    """Whether process ``pid`` has a file whose name contains ``name`` mapped (Linux)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return name.encode() in f.read()
    except OSError:
        return False


def rss_bytes():
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class ClientState:
    """What the worker knows of one client (one connection of one process)."""

    last_seen: float
    pid: int | None = None
    started: bytes | None = None  # the pid's start time, once the client proved its pid
    pool: str | None = None  # the name of the pool it attached
    inflight: int = 0  # work requests submitted and not yet answered
    freed: bool = False  # its handles were freed (again later for results of requests then in flight)


class Worker:
    """Serves one backend on one address until shut down."""

    def __init__(self, backend, *, host="127.0.0.1", port=0, connection_file=None,
                 threads=1, parent_pid=None, fallback_reason=None, pool_dirs=None,
                 key=None, curve_secret_key=None, client_timeout=CLIENT_TIMEOUT,
                 array_cache_bytes=ARRAY_CACHE_BYTES):
        self.key, self.curve = self.check_settings(host=host, key=key, curve_secret_key=curve_secret_key)
        self.client_timeout = float(client_timeout or 0)
        self.backend = backend
        self.versions = {"sklearn-gpu-bridge": __version__, **backend.versions()}  # asked once
        self.fallback_reason = fallback_reason
        self.host, self.port = host, port
        self.connection_file = connection_file
        self.parent_pid = parent_pid
        # where clients' pool files may be found (never a folder a request names)
        self.pool_dirs = list(dict.fromkeys(pool_dirs or (default_directory(), tempfile.gettempdir())))
        self.worker_id = new_id()
        self.session = Session(bytes.fromhex(self.key))
        self.registry = Registry()
        self.array_cache = ArrayCache(array_cache_bytes) if array_cache_bytes > 0 else None
        self.pools = {}  # pool name -> PoolAttachment
        self.clients = {}  # client id -> ClientState
        self._clients_lock = threading.Lock()
        self.swept = Counter()  # clients freed by the sweep, by reason: gone, idle
        self.counts = Counter()
        self._dropped_logged_at, self._dropped_unlogged = -1e9, 0
        self.started = time.time()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sgb-work")
        self._profile = [] if os.environ.get(PROFILE_ENV) else None
        self._profile_lock = threading.Lock()
        self._local = threading.local()
        self._stopping = threading.Event()
        self.context = zmq.Context()
        self.address = None
        self.curve_public = None

    @staticmethod
    def check_settings(*, host, key=None, curve_secret_key=None):
        """(hex key, CurveZMQ keys or None), or ConfigurationError saying what to change.

        Called before the backend warms up, so that a refusal comes at once.
        """
        key = check_key(key)
        curve = load_curve_secret(curve_secret_key) if curve_secret_key else None
        if curve is None and not is_loopback(host):
            raise ConfigurationError(curve_hint(host))
        return key, curve

    # ------------------------------------------------------------ lifecycle

    def start(self):
        """Warm up, bind, and write the connection file (which means: ready)."""
        self.backend.warm_up()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        if self.curve is not None:
            public, secret = self.curve
            self.router.curve_server = True
            self.router.curve_publickey = public
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
        last_sweep = time.monotonic()
        try:
            while not self._stopping.is_set():
                events = dict(poller.poll(200))
                if self.results in events:
                    self._forward_results()
                if self.router in events:
                    try:
                        self._receive()
                    except Exception:  # noqa: BLE001 - a message must never stop the loop; say so loudly
                        self.counts["failed"] += 1
                        log.exception("a message could not be handled; dropped it")
                if time.monotonic() - last_sweep > SWEEP_SECONDS:
                    last_sweep = time.monotonic()
                    if self.parent_pid and not pid_alive(self.parent_pid):
                        log.info("parent process %d is gone; stopping", self.parent_pid)
                        break
                    self._sweep()
        finally:
            self.close()

    def close(self):
        self._stopping.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._profile:
            with self._profile_lock:
                pstats.Stats(*self._profile).dump_stats(os.environ[PROFILE_ENV])
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
        arrived = time.monotonic()
        identity, frames = frames[0], frames[1:]
        try:
            header, buffers = self.session.unpack(frames)
        except ProtocolError as exc:
            self._log_dropped(exc)
            return
        op = header["op"]
        self.counts[op if op in WORK_OPS or op in QUICK_OPS else "unknown"] += 1
        client = header.get("client")
        if not isinstance(client, str):
            client = header["client"] = None
        if op in WORK_OPS and client is None:
            error = ProtocolError(f"a {op!r} request must name its client")
            self.router.send_multipart([identity, *self._error_reply(header, error)], copy=False)
            return
        state = self._seen(client, working=op in WORK_OPS)
        if op in WORK_OPS:
            self._executor.submit(self._work, identity, header, buffers, state, arrived)
        elif op in QUICK_OPS:
            self.router.send_multipart([identity, *self._handle(header, buffers)], copy=False)
        else:
            error = ProtocolError(f"unknown operation {op!r}")
            self.router.send_multipart([identity, *self._error_reply(header, error)], copy=False)

    def _log_dropped(self, exc):
        """One warning per second at most: a flood of bad messages must not flood the log too."""
        now = time.monotonic()
        self._dropped_unlogged += 1
        if now - self._dropped_logged_at >= 1.0:
            more = self._dropped_unlogged - 1
            log.warning("dropped a message: %s%s", exc, f" (and {more} more since the last report)" if more else "")
            self._dropped_logged_at, self._dropped_unlogged = now, 0

    def _work(self, identity, header, buffers, state, received):
        try:
            if self._profile is None:
                frames = self._handle(header, buffers, received)
            else:
                profiler = cProfile.Profile()
                frames = profiler.runcall(self._handle, header, buffers, received)
                with self._profile_lock:
                    self._profile.append(profiler)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer, or the client waits forever
            log.exception("a request failed outside its operation")
            frames = self._error_reply(header, exc)
        finally:
            if state is not None:
                with self._clients_lock:
                    state.inflight -= 1
                    state.last_seen = time.monotonic()  # silence counts from the answer, not the question
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.context.socket(zmq.PUSH)
            push.linger = 0
            push.connect(f"inproc://results-{self.worker_id}")
        push.send_multipart([identity, *frames], copy=False)

    def _handle(self, header, buffers, received=None):
        """Run one operation; always returns reply frames, never raises."""
        self._local.kept = []  # keys of the arrays this request asked the worker to keep, and it kept
        try:
            started = received or time.monotonic()
            self._release(header)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                payload, reply_buffers = getattr(self, "_op_" + header["op"])(header, buffers)
            # when the message arrived and its reply was ready (CLOCK_MONOTONIC, which processes on one
            # host share): profiles tell the worker's share from the client's and the sockets'
            reply = {"op": "reply", "id": new_id(), "parent": header.get("id"), **payload,
                     "worker_span": [started, time.monotonic()]}
            if self._local.kept:
                reply["cache_kept"] = self._local.kept
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
            message = str(exc)
        except Exception:  # noqa: BLE001 - an exception whose text cannot be made
            message = f"{type(exc).__name__} (its message could not be rendered)"
        try:
            args = to_plain(tuple(exc.args))
        except (TypeError, ValueError):
            args = (message,)
        if isinstance(exc, MemoryError):
            message += self._memory_note(header)
            args = (message,)
        reply = {
            "op": "error", "id": new_id(), "parent": header.get("id"), "mro": mro,
            "args": args, "message": message, "traceback": traceback.format_exc(),
        }
        try:
            return self.session.pack(reply)
        except Exception:  # noqa: BLE001 - e.g. args too odd to pickle: send the text alone
            reply.update(args=(message,), mro=[("builtins", "Exception")])
            return self.session.pack(reply)

    def _memory_note(self, header):
        """What a MemoryError needs to be understood: the request's size and the device's memory."""
        arrays = header.get("arrays") if isinstance(header.get("arrays"), list) else []
        sent = 0
        for desc in arrays:
            try:
                sent += int(np.prod(desc["shape"])) * np.dtype(desc["dtype"]).itemsize
            except Exception:  # noqa: BLE001 - informative only
                continue
        note = f" [worker: {header.get('op')} {header.get('estimator') or ''}{'.' if header.get('estimator') else ''}" \
               f"{header.get('method') or ''} on {_size(sent)} of input"
        if self.backend.device_resident:
            try:
                import cupy

                free, total = cupy.cuda.Device().mem_info
                note += f"; GPU memory: {_size(free)} free of {_size(total)}"
            except Exception:  # noqa: BLE001 - informative only
                log.debug("could not read the GPU's memory", exc_info=True)
        return note + "; the worker carries on]"

    def _release(self, header):
        handles = header.get("release")
        if handles:
            if not isinstance(handles, list):
                raise ProtocolError("'release' must be a list of handles")
            self.registry.release(handles, header.get("client"))

    # ------------------------------------------------------------ clients

    def _seen(self, client, working):
        """Note a message of ``client``; returns its state (None for a message without a client)."""
        if client is None:
            return None
        with self._clients_lock:
            state = self.clients.get(client)
            if state is None:
                state = self.clients[client] = ClientState(time.monotonic())
            state.last_seen = time.monotonic()
            if working:
                state.inflight += 1
            return state

    def _sweep(self):
        """Free what clients that are gone left behind; forget clients that hold nothing."""
        now = time.monotonic()
        owners = self.registry.owners()
        with self._clients_lock:
            clients = list(self.clients.items())
        for client, state in clients:
            if state.started is not None:  # watched: freed when its process is gone, however long it is silent
                if process_start(state.pid) != state.started:
                    self._free(client, state, "gone", f"its process {state.pid} is gone")
            elif not owners.get(client) and state.pool is None and not (
                    self.array_cache is not None and self.array_cache.holds_arrays_of(client)):
                with self._clients_lock:  # holds nothing: forget it
                    if state.inflight == 0:
                        self.clients.pop(client, None)
            elif self.client_timeout and state.inflight == 0 and now - state.last_seen > self.client_timeout:
                self._free(client, state, "idle", f"no message for {now - state.last_seen:.0f} s")

    def _free(self, client, state, reason, why):
        released = self.registry.release_client(client)
        cached = self.array_cache.drop_client(client) if self.array_cache is not None else 0
        name, state.pool = state.pool, None
        removed = self._detach(name, remove_files=reason == "gone") if name else 0
        with self._clients_lock:
            if state.inflight == 0:
                self.clients.pop(client, None)
        first, state.freed = not state.freed, True
        if reason != "goodbye" and (first or released or removed or cached):
            self.swept[reason] += first
            log.info("client %s: %s; released %d handle(s) and %d cached array(s), removed %d pool file(s)",
                     client, why, released, cached, removed)
        return released

    def _detach(self, name, remove_files=False):
        """Unmap a pool no client uses any more; remove its files if its owner is dead."""
        with self._clients_lock:
            if any(state.pool == name for state in self.clients.values()):
                return 0
        attachment = self.pools.pop(name, None)
        if attachment is None:
            return 0
        attachment.close()
        removed = 0
        if remove_files:
            try:
                names = os.listdir(attachment.directory)
            except OSError:
                names = []
            for file in names:
                if file.startswith(name + "-") and file[len(name) + 1 :].isdigit():
                    try:
                        os.unlink(os.path.join(attachment.directory, file))
                        removed += 1
                    except OSError:
                        pass
        return removed

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
        if isinstance(pool, dict) and client is not None:
            pool_ok = self._attach_pool(client, pool)
        watched = False
        if pool_ok:
            # the client's pid is proven when that process maps the pool file it named
            pid = header.get("pid")
            started = process_start(pid)
            if started is not None and maps_file(pid, f"{pool['name']}-0"):
                with self._clients_lock:
                    state = self.clients.get(client)
                    if state is not None:
                        state.pid, state.started = pid, started
                        watched = True
        return {
            "protocol_version": PROTOCOL_VERSION, "worker_id": self.worker_id,
            "backend": self.backend.name, "fallback_reason": self.fallback_reason,
            "float_dtype": self.backend.float_dtype, "pool": pool_ok,
            "versions": self.versions,
            # bytes of arrays this worker keeps for its clients (0: it keeps none; the client then never asks)
            "array_cache": self.array_cache.max_bytes if self.array_cache is not None else 0,
            # seconds of silence after which this client's handles are freed (None: its pid is watched)
            "client_timeout": None if watched or not self.client_timeout else self.client_timeout,
        }, []

    def _attach_pool(self, client, pool):
        """Map the client's pool if this host can see it; the probe bytes prove it.

        The client names its pool, never a path: the worker looks for that name
        in its own pool folders (``--pool-dir``) only.
        """
        name, probe = pool.get("name"), pool.get("probe")
        if not isinstance(name, str) or not isinstance(probe, dict):
            return False
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
                    self.pools.setdefault(candidate.name, candidate)
                    with self._clients_lock:
                        self.clients[client].pool = candidate.name
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
            "pools": len(self.pools), "clients": len(self.clients), "requests": dict(self.counts),
            "refused": dict(self.session.refused), "swept": dict(self.swept), "rss": rss_bytes(),
            "versions": self.versions, "array_cache": self._cache_status(),
        }, []

    def _cache_status(self):
        cache = self.array_cache
        if cache is None:
            return {"entries": 0, "bytes": 0, "max_bytes": 0}
        return {"entries": len(cache), "bytes": cache.nbytes, "max_bytes": cache.max_bytes}

    def _op_release(self, header, buffers):
        return {}, []  # the handles were released by _handle

    def _op_goodbye(self, header, buffers):
        client = header.get("client")
        with self._clients_lock:
            state = self.clients.get(client)
        released = self._free(client, state, "goodbye", "said goodbye") if state is not None else 0
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
        with self._clients_lock:
            state = self.clients.get(header.get("client"))
            attachment = self.pools.get(name) if state is not None and state.pool == name else None
        if attachment is None:
            raise ProtocolError("request names a pool that its client did not attach")
        return attachment

    def _decoder(self, header, buffers):
        attachment = self._attachment(header)
        read_pool = None
        if attachment is not None:
            retains = header["op"] == "fit" or header.get("method") == "partial_fit"
            if self.backend.device_resident or not retains:
                read_pool = attachment.buffer
            else:  # a fitted CPU estimator may keep a view of its input: never of a slot the client reuses
                read_pool = lambda s, o, n: bytearray(attachment.buffer(s, o, n))  # noqa: E731
        cache = None
        if self.array_cache is not None:
            cache = self.array_cache.for_client(header["client"], self._local.kept)
        return Decoder(header, buffers, read_pool=read_pool, cache=cache)

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


def _size(nbytes):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
