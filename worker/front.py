"""A worker process per GPU behind one address: what ``sklearn-gpu-bridge worker --gpus all`` runs on a box of
several GPUs.

A process that drives several GPUs runs every call's Python (cuML's input checks, the request, the reply) under
one interpreter lock, which its GPUs then wait on (docs/scale-out.md). A :class:`Front` keeps what clients see of
one worker (its address and gate, key, connection file, run id, the pool handshake) and hands each work request,
as it came, to a worker process of its own for each GPU (a child): started with ``CUDA_VISIBLE_DEVICES`` naming
that GPU alone, on this user's private ipc socket, with the same key and run id, so that the child checks the
client's signature itself.

- A request that reads a model (``handle``) goes to the child that made it: a child's handles carry its GPU
  (:func:`.handles.tag_of`). Any other goes to the child with the fewest requests in flight; each child admits
  work by its own GPU's memory.
- The quick operations are the front's own. ``hello`` and ``attach`` prove the client's pool to the front, which
  then has each child attach it (``adopt``); a ``ping`` goes on to every child, which judges a client's silence
  as any worker does; ``release`` and ``goodbye`` go to the children concerned, and ``status`` gathers theirs.
- A child that ends (a GPU in a sticky CUDA error ends its process) fails the requests it had, each with an error
  naming its GPU; its models are lost, and the other GPUs carry on.

One thread reads both sides; the bytes of requests and replies pass without a copy, and the front reads only
their headers.
"""

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import zmq

from sklearn_gpu_bridge.config import WORKER_DEFAULTS
from sklearn_gpu_bridge.errors import ConfigurationError, ProtocolError, WorkerUnavailable, describe
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Capabilities, Session, new_id, to_plain
from sklearn_gpu_bridge.protocol.session import StaleMessage, message_waits
from sklearn_gpu_bridge.runtime.connection_file import NotAConnectionFile, read_connection_file
from sklearn_gpu_bridge.runtime.private_files import prepare_folder, runtime_folder, write_private_file
from sklearn_gpu_bridge.shm import default_directory

from .clients import Clients
from .devices import DeviceUnusable, parse_gpus
from .dispatch import WORK
from .handles import TAG_BITS, HandleTable, tag_of
from .listener import SWEEP_SECONDS, Listener, read_message
from .quick_ops import check_version, rss_bytes

log = logging.getLogger("sklearn_gpu_bridge.worker")

READY_SECONDS = 600.0  # a child not ready by then (cuML warms up for a while) stops the front's start
OFFERS_KEPT = 1024  # pools offered at hello and not yet attached, at most (the oldest go)
STOP_SECONDS = 10.0  # a child still running this long after SIGTERM is killed


def processes_for(gpus, backend):
    """The GPU indices to give a process each (two or more), from the ``gpus`` setting; None: one process serves.

    ``"all"`` counts the GPUs CUDA shows this process, without making a context on any (``backend``
    ``sklearn``: one simulated GPU)."""
    if gpus is None:
        return None
    indices = parse_gpus(gpus, None if backend == "sklearn" else visible_gpus())
    if len(indices) > 1 << TAG_BITS:
        raise ConfigurationError(f"a worker gives a process each to {1 << TAG_BITS} GPUs at most, "
                                 f"not {len(indices)}")
    return indices if len(indices) > 1 else None


def visible_gpus():
    """How many GPUs CUDA shows this process; None where CuPy or a driver is missing."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy, no driver: the CPU backend's stand-in
        return None


@dataclass(eq=False)
class Child:
    """The worker process of one GPU, and what the front has sent it."""

    gpu: int
    process: subprocess.Popen
    connection_file: Path
    socket: zmq.Socket | None = None
    inflight: int = 0  # clients' requests sent and not yet answered
    gone: str | None = None  # why it serves no more; None: it serves


@dataclass(eq=False)
class Pending:
    """A request a child has: a client's (``identity``, to send its reply to), or the front's own (``then``,
    called with the reply's header, or with None when the child ended first)."""

    child: Child
    header: dict  # the request's op, id and client, for an error reply
    identity: bytes | None = None
    then: object = None


class Front(Listener):
    """Serves clients at one address with a worker process per GPU of ``gpus`` behind it; the other keyword
    arguments as :data:`config.WORKER_DEFAULTS` (``backend``, ``device_memory`` and ``log_level`` go to the
    children)."""

    def __init__(self, gpus, *, connection_file=None, parent_pid=None, key=None, backend=WORKER_DEFAULTS["backend"],
                 device_memory=WORKER_DEFAULTS["device_memory"], log_level=WORKER_DEFAULTS["log_level"],
                 bind=WORKER_DEFAULTS["bind"], port=WORKER_DEFAULTS["port"], threads=WORKER_DEFAULTS["threads"],
                 pool_dirs=WORKER_DEFAULTS["pool_dirs"], key_file=WORKER_DEFAULTS["key_file"],
                 curve_secret_key=WORKER_DEFAULTS["curve_secret_key"], curve_allow=WORKER_DEFAULTS["curve_allow"],
                 client_timeout=WORKER_DEFAULTS["client_timeout"], max_queued=WORKER_DEFAULTS["max_queued"],
                 max_frame_mb=WORKER_DEFAULTS["max_frame_mb"], array_cache_mb=WORKER_DEFAULTS["array_cache_mb"],
                 watch_ms=WORKER_DEFAULTS["watch_ms"], idle_exit=WORKER_DEFAULTS["idle_exit"]):
        self._listen(connection_file=connection_file, parent_pid=parent_pid, key=key, bind=bind, port=port,
                     key_file=key_file, curve_secret_key=curve_secret_key, curve_allow=curve_allow,
                     watch_ms=watch_ms, threads=threads, max_frame_mb=max_frame_mb, idle_exit=idle_exit)
        self.gpus = list(gpus)
        self.inner = Session(bytes.fromhex(self.key), peer=self.worker_id)  # the front's own requests to children
        pool_dirs = list(dict.fromkeys([*pool_dirs, default_directory(), tempfile.gettempdir()]))
        self.client_timeout = float(client_timeout or 0)
        self.clients = Clients(HandleTable(), None, pool_dirs, 0)  # the pool handshake; children free clients
        self.child_argv = [
            "--backend", backend, "--device-memory", device_memory, "--log-level", log_level, "--bind", "ipc",
            "--threads", str(threads), "--client-timeout", str(self.client_timeout), "--max-queued", str(max_queued),
            "--max-frame-mb", str(max_frame_mb), "--array-cache-mb", str(array_cache_mb / len(self.gpus)),
            *[arg for folder in pool_dirs for arg in ("--pool-dir", str(folder))]]
        self.children = []
        self.pending = {}  # request id -> Pending
        self.counts = Counter()
        self.capabilities = None  # a child's, as the front's hello answers them
        self._offered = {}  # client -> (pool, pid) of its hello, until it attaches
        self.files = None  # the stem of the children's connection files and of the key they read, in this user's
        # private folder: each child removes its own file as it ends, the front the key once all are ready

    # ------------------------------------------------------------ lifecycle

    def start(self):
        """Start a worker process per GPU and wait until all are warm; bind; write the connection file."""
        self.files = runtime_folder() / f"front-{new_id()[:16]}"
        prepare_folder(self.files.parent)
        key_file = self.files.with_suffix(".key")
        write_private_file(key_file, self.key)
        try:
            for gpu in self.gpus:
                self.children.append(self._spawn(gpu, key_file))
            for child in self.children:
                self._connect(child, self._ready(child))
            self.capabilities = self._first_hello()
            self._open_router()
            self._announce(self.capabilities.backend, os.getpid())
        except BaseException:  # the children too: none outlives a front that could not start
            self.close()
            raise
        finally:
            key_file.unlink(missing_ok=True)
        log.info("serving GPUs %s, a worker process each (pids %s)", ",".join(map(str, self.gpus)),
                 ", ".join(str(child.process.pid) for child in self.children))
        return self

    def _spawn(self, gpu, key_file):
        connection_file = self.files.with_name(f"{self.files.name}-gpu{gpu}.json")
        argv = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "sklearn_gpu_bridge.worker",
                "--connection-file", str(connection_file), "--parent-pid", str(os.getpid()),
                "--key-file", str(key_file), "--front", f"{self.worker_id}:{gpu}", *self.child_argv]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=_visible_id(gpu))
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=self.files.parent, env=env)  # logs in ours
        return Child(gpu, process, connection_file)

    def _ready(self, child):
        """The child's connection info once it wrote its file; WorkerUnavailable if it exits or times out."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise WorkerUnavailable(f"the worker process of GPU {child.gpu} exited with code "
                                        f"{child.process.returncode} before it was ready (its log is above)")
            try:
                info = read_connection_file(child.connection_file)
                if info.pid == child.process.pid:
                    return info
            except (OSError, NotAConnectionFile):
                pass  # not there yet, or being written
            time.sleep(0.05)
        raise WorkerUnavailable(f"the worker process of GPU {child.gpu} was not ready within {READY_SECONDS:.0f} s")

    def _connect(self, child, info):
        child.socket = self.context.socket(zmq.DEALER)
        child.socket.linger = 0
        child.socket.sndhwm = child.socket.rcvhwm = 0  # every client's requests to this GPU pass here
        child.socket.connect(info.address)

    def _first_hello(self):
        """The first child's capabilities (backend, dtype, versions ...), which the front's own hello answers."""
        child = self.children[0]
        child.socket.send_multipart(self.inner.pack({"op": "hello", "id": new_id(),
                                                     "protocol_version": PROTOCOL_VERSION}))
        if not child.socket.poll(READY_SECONDS * 1000):
            raise WorkerUnavailable(f"the worker process of GPU {child.gpu} did not answer")
        header, _ = self.inner.unpack(child.socket.recv_multipart())
        if header["op"] == "error":
            raise WorkerUnavailable(f"the worker process of GPU {child.gpu}: {header.get('message')}")
        return Capabilities.from_reply(header)

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM, a shutdown request, the parent's death, ``idle_exit`` seconds without
        clients, or the end of every child."""
        self._catch_signals()
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        for child in self.children:
            poller.register(child.socket, zmq.POLLIN)
        by_socket = {child.socket: child for child in self.children}
        last_look = time.monotonic()
        try:
            while not self._stopping.is_set():
                for sock, _ in poller.poll(SWEEP_SECONDS * 200):
                    if sock is self.router:
                        self._read_clients()
                    else:
                        self._read_child(by_socket[sock])
                if time.monotonic() - last_look >= SWEEP_SECONDS:
                    last_look = time.monotonic()
                    for child in self._look_at_children():
                        poller.unregister(child.socket)
                    self.clients.sweep()
                    if self._should_stop():
                        break
        finally:
            self.close()

    def _busy(self):
        return len(self.clients) > 0 or bool(self.pending)

    def close(self):
        """Stop the children (SIGTERM, then SIGKILL), the gate and the sockets; remove the files."""
        self._stopping.set()
        for child in self.children:
            if child.process.poll() is None:
                child.process.terminate()
        for child in self.children:
            try:
                child.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        self.clients.close()
        self._close_gates(*(child.connection_file for child in self.children))
        self.context.destroy(linger=0)
        log.info("worker stopped")

    # ------------------------------------------------------------ clients' messages

    def _read_clients(self):
        while not self._stopping.is_set() and message_waits(self.router):
            frames = read_message(self.router, self.refused)
            if frames is None:
                self._log_dropped(ProtocolError("a message of too many frames"))
                continue
            try:
                self._from_client(frames[0], frames[1:])
            except Exception:  # noqa: BLE001 - a message must never stop the reading; say so loudly
                self.counts["failed"] += 1
                log.exception("a message could not be handled; dropped it")

    def _from_client(self, identity, message):
        try:  # the buffers' digests are the child's to check
            header, buffers = self.session.unpack(message, check_buffers=False)
        except StaleMessage as exc:  # signed, but not for now: say why
            self._log_dropped(exc)
            self._send(identity, self._error({}, exc))
            return
        except ProtocolError as exc:  # a Duplicate too, which no front's client sends
            self._log_dropped(exc)
            return
        op, client = header["op"], header.get("client")
        self.last_message = time.monotonic()
        self.counts[op if op in WORK or op in self.QUICK else "unknown"] += 1
        if not isinstance(client, str):
            client = header["client"] = None
        if op in WORK:
            self._forward(identity, header, message)
        elif op in self.QUICK:
            self.clients.seen(client, working=False)
            self._release_on_others(client, header.get("release"))  # any request may carry releases
            try:
                self.session.check_buffers(header, buffers)  # quick ops carry none: nothing to hash
            except ProtocolError as exc:
                self._log_dropped(exc)
                return
            try:
                fields = self.QUICK[op](self, identity, header)
            except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
                self._send(identity, self._error(header, exc))
                return
            if fields is not None:  # else answered once the children have
                self._answer(identity, header, fields)
        else:
            self._send(identity, self._error(header, ProtocolError(f"unknown operation {op!r}")))

    def _forward(self, identity, header, message):
        """Hand a work request, as it came, to its child (:meth:`_child_for`); its releases of models of other
        GPUs go to those."""
        request_id, client = header.get("id"), header["client"]
        if client is None or type(request_id) is not str or request_id in self.pending:
            why = "must name its client" if client is None else "needs an id of its own"
            self._send(identity, self._error(header, ProtocolError(f"a {header['op']!r} request {why}")))
            return
        child = self._child_for(header)
        if child.gone is not None:
            self._send(identity, self._error(header, self._lost(child)))
            return
        self._release_on_others(client, header.get("release"), but=child)
        child.socket.send_multipart(message, copy=False)
        self.pending[request_id] = Pending(child, _brief(header), identity)
        child.inflight += 1

    def _child_for(self, header):
        """The child of the model the request reads; else the serving child with the fewest requests in flight
        (none serving: the first, whose loss the request is told of)."""
        handle = header.get("handle")
        if type(handle) is int:
            owner = next((child for child in self.children if child.gpu == tag_of(handle)), None)
            if owner is not None:
                return owner  # none such: any child answers that it holds no such model
        serving = [child for child in self.children if child.gone is None]
        return min(serving, key=lambda child: (child.inflight, child.gpu), default=self.children[0])

    def _release_on_others(self, client, handles, but=None):
        """Ask each child other than ``but`` to free those of ``handles`` that it made (their GPU tags)."""
        if not isinstance(handles, list):
            return
        by_gpu = {}
        for handle in handles:
            if type(handle) is int:
                by_gpu.setdefault(tag_of(handle), []).append(handle)
        for child in self.children:
            mine = by_gpu.get(child.gpu)
            if mine and child is not but and child.gone is None:
                self._ask(child, {"op": "release", "client": client, "release": mine})

    # ------------------------------------------------------------ the quick operations

    def _hello(self, identity, header):
        check_version(header)
        pool, client = header.get("pool"), header.get("client")
        slot = None
        if isinstance(pool, dict) and client is not None:
            slot = self.clients.challenge(client, pool, header.get("pid"))
            if slot is not None:
                self._offered[client] = (pool, header.get("pid"))
                while len(self._offered) > OFFERS_KEPT:
                    del self._offered[next(iter(self._offered))]
        serving = sum(child.gone is None for child in self.children)
        return replace(self.capabilities, worker_id=self.worker_id, pool=False, pool_challenge=slot,
                       max_frame_bytes=self.max_frame_bytes, array_cache=self.capabilities.array_cache * serving,
                       client_timeout=self.client_timeout or None).to_reply()

    def _attach(self, identity, header):
        client = header.get("client")
        attached, watched = self.clients.attach(client, header.get("nonce"))
        offered = self._offered.pop(client, None)
        if attached and offered is not None:  # before any request of the client that names the pool
            for child in self.children:
                if child.gone is None:
                    self._ask(child, {"op": "adopt", "client": client, "pool": offered[0], "pid": offered[1]})
        return {"pool": attached, "client_timeout": None if watched or not self.client_timeout else self.client_timeout,
                "doorbell": None}  # requests come through ZeroMQ, which the front reads

    def _ping(self, identity, header):
        self._tell_all({"op": "ping", "client": header["client"]})  # each child judges a client's silence
        return {"busy": sum(child.inflight for child in self.children)}

    def _release(self, identity, header):
        return {}  # the handles went with the request's releases (_from_client)

    def _goodbye(self, identity, header):
        client = header["client"]
        state = self.clients.get(client)
        if state is not None:
            self.clients.free(client, state, "goodbye", "said goodbye")
        self._gather(identity, header, {"op": "goodbye", "client": client},
                     lambda parts: {"released": sum(reply.get("released", 0) for reply in parts.values())})

    def _status(self, identity, header):
        self._gather(identity, header, {"op": "status", "client": header["client"]}, self._merged_status)

    def _shutdown(self, identity, header):
        self._stopping.set()
        return {}

    #: op name -> the front's answer: reply fields, or None where it answers once its children have
    QUICK = {"hello": _hello, "attach": _attach, "ping": _ping, "status": _status, "release": _release,
             "goodbye": _goodbye, "shutdown": _shutdown}

    def _merged_status(self, parts):
        """The status of the whole worker: the front's own, each child's GPUs, and their counts summed."""
        def total(name):
            return sum(reply.get(name) or 0 for reply in parts.values())

        gpus = []
        for child in self.children:
            reply = parts.get(child.gpu)
            if reply is not None:
                gpus += [{**gpu, "index": child.gpu, "pid": child.process.pid} for gpu in reply.get("gpus") or ()]
            else:
                gpus.append({"index": child.gpu, "pid": child.process.pid, "requests": 0, "running": 0,
                             "queued": 0, "failed": 0, "handles": 0, "budget": None, "in_use": 0, "peak_in_use": 0,
                             "memory_used": None, "unusable": child.gone or "did not answer"})
        budgets = [gpu.get("budget") for gpu in gpus]
        caches = [reply.get("array_cache") or {} for reply in parts.values()]
        return {
            "backend": self.capabilities.backend, "pid": os.getpid(), "address": self.address,
            "uptime": time.time() - self.started, "handles": total("handles"), "pools": len(self.clients.pools),
            "clients": max((reply.get("clients") or 0 for reply in parts.values()), default=0),
            "requests": dict(self.counts),
            "refused": self._refusals(),
            "swept": dict(sum((Counter(reply.get("swept") or {}) for reply in parts.values()), Counter())),
            "rss": rss_bytes(), "queued": total("queued"), "threads": total("threads"), "running": total("running"),
            "peak_running": total("peak_running"), "watch_ms": 0.0, "idle_exit": self.idle_exit,
            "device_budget": None if None in budgets else sum(budgets), "device_in_use": total("device_in_use"),
            "gpus": gpus, "versions": self.capabilities.versions, "processes": len(self.children),
            "array_cache": {name: sum(cache.get(name) or 0 for cache in caches)
                            for name in ("entries", "bytes", "max_bytes")},
        }

    # ------------------------------------------------------------ the front's own requests to its children

    def _ask(self, child, header, then=None):
        """Send the front's own request to ``child``; ``then(reply header or None)`` once it answers (or ends)."""
        header["id"] = new_id()
        child.socket.send_multipart(self.inner.pack(header))
        self.pending[header["id"]] = Pending(child, _brief(header), then=then)

    def _tell_all(self, header):
        for child in self.children:
            if child.gone is None:
                self._ask(child, dict(header))

    def _gather(self, identity, header, ask, merge):
        """Ask every serving child ``ask``; answer the client's ``header`` with ``merge({GPU: reply})`` once all
        have answered (a child that ends meanwhile is left out)."""
        serving = [child for child in self.children if child.gone is None]
        parts, waiting = {}, {child.gpu for child in serving}

        def then(child, reply):
            waiting.discard(child.gpu)
            if reply is not None and reply.get("op") != "error":
                parts[child.gpu] = reply
            if not waiting:
                try:
                    self._answer(identity, header, merge(parts))
                except Exception as exc:  # noqa: BLE001 - the client gets an error, never silence
                    self._send(identity, self._error(header, exc))

        if not serving:
            then(self.children[0], None)
        for child in serving:
            self._ask(child, dict(ask), then=lambda reply, child=child: then(child, reply))

    # ------------------------------------------------------------ the children's replies

    def _read_child(self, child):
        while message_waits(child.socket):
            frames = child.socket.recv_multipart(copy=False)
            try:
                header, _ = self.inner.unpack(frames, check_buffers=False)
            except ProtocolError as exc:
                log.error("a reply of the worker process of GPU %d was dropped: %s", child.gpu, exc)
                continue
            pending = self.pending.pop(header.get("parent"), None)
            if pending is None:
                continue
            if pending.identity is not None:
                child.inflight -= 1
                self._send(pending.identity, frames)
            elif pending.then is not None:
                pending.then(header)

    def _look_at_children(self):
        """Children that ended since the last look: their requests fail, their GPUs serve no more; returns them.
        Once none serves, the front stops."""
        ended = []
        for child in self.children:
            if child.gone is None and child.process.poll() is not None:
                child.gone = f"its worker process ended with code {child.process.returncode}"
                log.error("GPU %d: %s; its models are lost, the other GPUs carry on", child.gpu, child.gone)
                ended.append(child)
                for request_id, pending in list(self.pending.items()):
                    if pending.child is child:
                        del self.pending[request_id]
                        if pending.identity is not None:
                            self._send(pending.identity, self._error(pending.header, self._lost(child)))
                        elif pending.then is not None:
                            pending.then(None)
        if ended and all(child.gone is not None for child in self.children):
            log.error("no GPU serves any more; stopping")
            self._stopping.set()
        return ended

    @staticmethod
    def _lost(child):
        return DeviceUnusable(f"GPU {child.gpu} of this worker is unusable ({child.gone}); the models fitted on it "
                              "are lost: fit them again (new fits go to the worker's other GPUs)")

    # ------------------------------------------------------------ replying

    def _answer(self, identity, header, fields):
        self._send(identity, self.session.pack({"op": "reply", "id": new_id(), "parent": header.get("id"),
                                                **fields}))

    def _error(self, header, exc):
        return self._pack_error({"op": "error", "id": new_id(), "parent": header.get("id"),
                                 **describe(exc, to_plain)})

    def _send(self, identity, frames):
        if not self.router.closed:
            self.router.send_multipart([identity, *frames], copy=False)


def _brief(header):
    """What an error reply to a request needs of its header."""
    return {"op": header.get("op"), "id": header.get("id"), "client": header.get("client")}


def _visible_id(gpu):
    """What ``CUDA_VISIBLE_DEVICES`` names GPU ``gpu`` of this process by (its own list, where it has one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        names = [name.strip() for name in visible.split(",")]
        if gpu < len(names):
            return names[gpu]
    return str(gpu)

