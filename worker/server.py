"""The worker: a ZeroMQ ROUTER socket in front of a backend.

Its executor threads take turns reading the ROUTER socket (leader/followers,
:mod:`.scheduler`): the thread that reads answers quick operations (hello,
ping, status, release, goodbye, shutdown, attach) itself and queues
estimator work (fit, call, get_state, set_state), one client's request after
another's; when another thread is idle, that one takes over the reading and
the reader runs the request it read, so a request never waits for a sleeping
thread to be woken (on a GPU VM the dearest part of a small call:
``benchmarks/hops.py``). Each thread sends its replies on the same socket
itself: the socket is used under a lock only, and the reader waits on its
file descriptor, never inside the socket, so the socket moves between
threads with a full memory barrier, as ZeroMQ allows. So the worker still
answers ``ping`` while a long fit runs: that is how a client tells "busy"
from "dead". The reader also sweeps silent clients; the thread that called
:meth:`Worker.serve_forever` watches the parent. A thread that has answered a
request of a client on this host then watches that client's request slot for
a moment, while it has nothing else to do (:meth:`Worker._follow`): the next
request may come that way, past the sleeping reader. After the watch the slot
stays armed, and a client that writes its next request there later rings the
worker's doorbell, a datagram socket that the reader polls beside the ZeroMQ
one (:meth:`Worker._answer_bell`): one thread is woken, where ZeroMQ wakes
three. The worker marks each request it reads from a slot (taken or not), and
the client sends the same request through ZeroMQ only where it was not taken
(:mod:`sklearn_gpu_bridge.transport.reply_slot`). Which op is which is the protocol's
catalogue (:data:`sklearn_gpu_bridge.protocol.OPS`); each has a method
``_op_<name>`` here.

What reaches the reading thread at all is decided first: a peer without the
credentials of the address (:mod:`sklearn_gpu_bridge.runtime.keys`) is refused
during ZeroMQ's handshake (:mod:`.gatekeeper`); a frame longer than
``max_frame_mb`` closes the connection; a message of too many frames is
dropped as it is read. A message that fails its signature, or is malformed in
any way, is dropped and counted; it never reaches pickle and never stops the
loop.
"""

import contextlib
import cProfile
import gc
import ipaddress
import logging
import math
import os
import pstats
import select
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import cloudpickle
import numpy as np
import zmq

from sklearn_gpu_bridge import __version__
from sklearn_gpu_bridge.config import WORKER_DEFAULTS
from sklearn_gpu_bridge.runtime.connection_file import ConnectionInfo, new_key, read_key_file, signing_key, write_connection_file
from sklearn_gpu_bridge.errors import ConfigurationError, ProtocolError, VersionMismatch, describe
from sklearn_gpu_bridge.runtime.private_files import doorbell_path, pid_alive, socket_path
from sklearn_gpu_bridge.runtime.keys import bind_hint, derived_client_pair, load_public, load_secret, plain_password
from sklearn_gpu_bridge.protocol import (
    PROTOCOL_VERSION,
    QUICK_OPS,
    WORK_OPS,
    Capabilities,
    Decoder,
    Encoder,
    Session,
    new_id,
    to_plain,
)
from sklearn_gpu_bridge.transport import rehearsal, reply_slot
from sklearn_gpu_bridge.protocol.session import Duplicate, StaleMessage, message_waits
from sklearn_gpu_bridge.shm import default_directory

from .backends import checked_finite
from .cache import ArrayCache
from .caught_warnings import caught_warnings
from .clients import Clients
from .gatekeeper import DOMAIN, Gatekeeper
from .handles import HandleTable
from .scheduler import FairQueue

log = logging.getLogger("sklearn_gpu_bridge.worker")

#: device memory a request may need, as a multiple of its input: admission waits while it does not fit
DEVICE_MEMORY_FACTOR = 4
ALIGN = 64
SWEEP_SECONDS = 1.0
MAX_FRAMES = 1024  # frames in one message: a longer one is dropped as it is read
HWM = 16  # messages queued per peer socket, each way (an honest client has one request in flight per socket)
HANDSHAKE_SECONDS = 5  # a connection that has not authenticated by then is closed
MAX_READ_IN_TURN = 64  # messages the reading thread reads before it looks at its clock (sweeps)
MAX_ARMED = 1024  # request slots armed for the doorbell at once (a client has one per thread); the oldest go
ARMED_SECONDS = 600.0  # an armed slot that no ring has named for this long goes (its thread is idle or gone)
RINGS_IN_TURN = 256  # rings the reading thread takes in one turn before it looks at its socket again
MAX_WATCH_MS = 60_000.0  # a longer watch of a request slot is refused (see config.WORKER_DEFAULTS["watch_ms"])
#: a file name: the work of every request is profiled and the stats written there at exit (diagnosis)
PROFILE_ENV = "SKLEARN_GPU_BRIDGE_WORKER_PROFILE"
#: set: each reply carries ``worker_steps``, when each step of its request ended on the worker (diagnosis)
STEPS_ENV = "SKLEARN_GPU_BRIDGE_WORKER_STEPS"


def _open_doorbell(worker_socket):
    """(path, socket) of a Unix datagram socket beside the worker's own socket, in this user's private folder (mode
    0600), where clients on this host ring after writing a request into an armed request slot; None where
    there are none. A ring is a datagram naming the slot; nothing in it is trusted (see ``_answer_bell``)."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        path = doorbell_path(worker_socket)
        bell.bind(str(path))
        os.chmod(path, 0o600)
        bell.setblocking(False)
        return path, bell
    except OSError as exc:  # requests come through ZeroMQ alone, as they always may
        bell.close()
        log.warning("no doorbell for request slots: %s", exc)
        return None


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rss_bytes():
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def page_faults():
    """This process's page faults so far, [minor, major] (POSIX), or None. A benchmark reads their growth over a
    case: a first touch of memory mapped anew costs a fault per page."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return [usage.ru_minflt, usage.ru_majflt]


def check_settings(*, bind=WORKER_DEFAULTS["bind"], key=None, key_file=None, curve_secret_key=None,
                   curve_allow=None, watch_ms=WORKER_DEFAULTS["watch_ms"]):
    """(hex key, CurveZMQ keys or None, allowed client keys), or ConfigurationError saying what to change.

    Called before the backend warms up, so that a refusal comes at once.
    """
    if not 0 <= float(watch_ms) <= MAX_WATCH_MS:  # NaN too: a watch that never ends keeps a core busy
        raise ConfigurationError(f"watch_ms must be a number of milliseconds from 0 to {MAX_WATCH_MS:g}, "
                                 f"not {watch_ms!r}")
    if key_file is not None:
        key = read_key_file(key_file)
    key = new_key() if key is None else signing_key(key, "the --key-file").hex()
    curve = load_secret(curve_secret_key) if curve_secret_key else None
    if curve is None and bind != "ipc" and not is_loopback(bind):
        raise ConfigurationError(bind_hint(bind))
    allowed = {derived_client_pair(bytes.fromhex(key))[0]}
    if curve_allow is not None:
        folder = Path(curve_allow)
        if not folder.is_dir():
            raise ConfigurationError(f"--curve-allow {folder}: not a folder of public keys")
        allowed |= {load_public(path) for path in sorted(folder.glob("*.key"))}
    return key, curve, allowed


def raise_file_limit():
    """Open files up to the hard limit: connections are files, and a flood of them must not starve honest ones."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ImportError, ValueError, OSError):
        log.debug("could not raise the open-file limit", exc_info=True)


class Worker:
    """Serves one backend on one address until shut down; keyword arguments as :data:`config.WORKER_DEFAULTS`."""

    def __init__(self, backend, *, connection_file=None, parent_pid=None, fallback_reason=None, key=None,
                 bind=WORKER_DEFAULTS["bind"], port=WORKER_DEFAULTS["port"], threads=WORKER_DEFAULTS["threads"],
                 pool_dirs=WORKER_DEFAULTS["pool_dirs"], key_file=WORKER_DEFAULTS["key_file"],
                 curve_secret_key=WORKER_DEFAULTS["curve_secret_key"], curve_allow=WORKER_DEFAULTS["curve_allow"],
                 client_timeout=WORKER_DEFAULTS["client_timeout"], max_queued=WORKER_DEFAULTS["max_queued"],
                 max_frame_mb=WORKER_DEFAULTS["max_frame_mb"], array_cache_mb=WORKER_DEFAULTS["array_cache_mb"],
                 watch_ms=WORKER_DEFAULTS["watch_ms"]):
        self.key, self.curve, self.curve_allowed = check_settings(
            bind=bind, key=key, key_file=key_file, curve_secret_key=curve_secret_key, curve_allow=curve_allow,
            watch_ms=watch_ms)
        self.backend = backend
        self.versions = {"sklearn-gpu-bridge": __version__, **backend.versions()}  # asked once
        self.fallback_reason = fallback_reason
        self.host, self.port = bind, port
        self.connection_file = connection_file
        self.parent_pid = parent_pid
        self.worker_id = new_id()
        self.session = Session(bytes.fromhex(self.key), me=self.worker_id)
        self.max_frame_bytes = int(max_frame_mb * (1 << 20))
        self.watch_ms = float(watch_ms)
        self.handles = HandleTable()
        cache_bytes = int(array_cache_mb * (1 << 20))
        self.array_cache = ArrayCache(cache_bytes) if cache_bytes > 0 else None
        self.queue = FairQueue(self._work, threads=threads, max_queued=max_queued,
                               cost=lambda item: DEVICE_MEMORY_FACTOR * _input_bytes(item[1]),
                               budget=backend.memory_budget(), after=self._follow)
        pool_dirs = list(dict.fromkeys([*pool_dirs, default_directory(), tempfile.gettempdir()]))
        self.pinning = backend.host_pinning()
        self.clients = Clients(self.handles, self.array_cache, pool_dirs, float(client_timeout or 0),
                               on_free=self._cancel, pinning=self.pinning)
        self.counts = Counter()
        self.refused = Counter()  # messages dropped before their signature: too many frames
        self._dropped_logged_at, self._dropped_unlogged = -1e9, 0
        self.started = time.time()
        self._profile = [] if os.environ.get(PROFILE_ENV) else None
        self._profile_lock = threading.Lock()
        self._steps = bool(os.environ.get(STEPS_ENV))
        self._rehearsal = rehearsal.Rehearsal() if rehearsal.wanted() else None  # the reading thread's
        self._local = threading.local()
        self.wakeup = None  # inproc PULL socket: wakes the thread that reads (_lead) from its poll
        self.doorbell = None  # (path, socket): the datagram socket clients on this host ring (_answer_bell)
        self._armed = {}  # ring -> (identity, slot, armed at): request slots a ring may name (_arm)
        self._armed_lock = threading.Lock()
        self._router_lock = threading.RLock()  # whoever uses the ROUTER socket holds it (the reader, the others)
        self._stopping = threading.Event()
        self._close_lock, self._closed = threading.Lock(), False
        self.context = zmq.Context()
        self.gatekeeper = None
        self.address = None
        self.curve_public = None

    # ------------------------------------------------------------ lifecycle

    def start(self):
        """Warm up, bind, and write the connection file (which means: ready)."""
        self.backend.warm_up()
        raise_file_limit()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.router_handover = 1  # a client link connected again keeps its name (client._Link)
        self.router.maxmsgsize = self.max_frame_bytes
        self.router.sndhwm = self.router.rcvhwm = HWM
        self.router.handshake_ivl = HANDSHAKE_SECONDS * 1000
        self._bind()
        # the socket's descriptor is edge-triggered: after each use of the socket, its EVENTS must be read
        # again, since the use may have taken the descriptor's signal. A thread that sends a reply and then
        # finds a message waiting wakes the reading thread through this inproc socket.
        self.wakeup = self.context.socket(zmq.PULL)
        self.wakeup.bind(f"inproc://wakeup-{self.worker_id}")
        self.doorbell = _open_doorbell(self.socket_path) if self.socket_path is not None else None
        self.info = ConnectionInfo(
            address=self.address, key=self.key, protocol_version=PROTOCOL_VERSION, pid=os.getpid(),
            backend=self.backend.name, worker_id=self.worker_id, curve_server_key=self.curve_public,
        )
        if self.connection_file:
            write_connection_file(self.connection_file, self.info)
        log.info("worker ready on %s (backend %s, pid %d)", self.address, self.backend.name, os.getpid())
        return self

    def _bind(self):
        """ipc in this user's private folder; TCP behind PLAIN (loopback) or CurveZMQ with an allow-list."""
        if self.host == "ipc":
            self.socket_path = socket_path(f"worker-{self.worker_id[:16]}.sock")
            self.address = f"ipc://{self.socket_path}"
            self.router.bind(self.address)
            return
        self.socket_path = None
        self.gatekeeper = Gatekeeper(self.context, password=plain_password(bytes.fromhex(self.key)),
                                     curve_keys=self.curve_allowed if self.curve is not None else ()).start()
        if self.curve is not None:
            public, secret = self.curve
            self.router.curve_server = True
            self.router.curve_publickey = public
            self.router.curve_secretkey = secret
            self.curve_public = public.decode()
            log.info("binding %s: CurveZMQ encryption, %d client key(s) allowed", self.host, len(self.curve_allowed))
        else:
            self.router.plain_server = True
        self.router.zap_domain = DOMAIN.encode()
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port:
            self.router.bind(f"tcp://{host}:{self.port}")
        else:
            self.port = self.router.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{self.port}"

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM, a shutdown request, or the parent's death.

        The executor threads take turns reading the socket (:meth:`_lead`, see :mod:`.scheduler`); this
        thread watches the parent.
        """
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self._stopping.set())
        self._poller = zmq.Poller()
        self._poller.register(self.router.getsockopt(zmq.FD), zmq.POLLIN)
        self._poller.register(self.wakeup, zmq.POLLIN)
        if self.doorbell is not None:
            self._poller.register(self.doorbell[1].fileno(), zmq.POLLIN)
            self._bell_waiting = select.poll()  # the doorbell alone: _input_waiting
            self._bell_waiting.register(self.doorbell[1].fileno(), select.POLLIN)
        self._last_sweep = time.monotonic()
        self.queue.lead_with(self._lead)
        try:
            while not self._stopping.wait(SWEEP_SECONDS):
                if self.parent_pid and not pid_alive(self.parent_pid):
                    log.info("parent process %d is gone; stopping", self.parent_pid)
                    break
        finally:
            self.close()

    def _lead(self):
        """Read messages until one is work queued for a thread (True), or the worker stops (False).

        Quick operations are answered here, and silent clients swept (by the reader alone: a sweep may forget
        a client between two of its messages). Messages already waiting are read before the socket's descriptor
        is polled: it signals only what arrives after the last look.
        """
        self._local.leading = True
        try:
            while not self._stopping.is_set():
                if time.monotonic() - self._last_sweep > SWEEP_SECONDS:  # first: a reader may return at once
                    self._last_sweep = time.monotonic()
                    self.clients.sweep()
                drained = True
                for _ in range(MAX_READ_IN_TURN):
                    with self._router_lock:
                        if self.router.closed or not message_waits(self.router):
                            break
                        try:
                            if self._receive():
                                return True
                        except Exception:  # noqa: BLE001 - a message must never stop the reading; say so loudly
                            self.counts["failed"] += 1
                            log.exception("a message could not be handled; dropped it")
                else:
                    drained = False  # more are waiting: read on after a look at the clock, not at the descriptor
                if not drained:
                    continue
                events = dict(self._poller.poll(200))
                if self.doorbell is not None and events.get(self.doorbell[1].fileno()) and self._answer_bell():
                    return True
                if events.get(self.wakeup):
                    while self.wakeup.poll(0):
                        self.wakeup.recv(zmq.NOBLOCK)
            return False
        finally:
            self._local.leading = False

    def close(self):
        with self._close_lock:
            if self._closed:
                return  # serve_forever's own close after another thread's
            self._closed = True
        self._stopping.set()
        if self.wakeup is not None:
            self._wake()  # the reading thread returns from its poll at once
        self.queue.close()  # waits (a moment) until no thread reads: the sockets are closed below
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
        if self._profile:
            with self._profile_lock:
                pstats.Stats(*self._profile).dump_stats(os.environ[PROFILE_ENV])
        self.clients.close()
        if self.doorbell is not None:
            self.doorbell[1].close()
        for path in (self.connection_file, getattr(self, "socket_path", None), self.doorbell and self.doorbell[0]):
            if path:
                Path(path).unlink(missing_ok=True)
        with self._router_lock:  # no executor thread is inside the socket
            self.context.destroy(linger=0)
        log.info("worker stopped")

    # ------------------------------------------------------------ reading

    def _read_message(self):
        """The next message's frames, read one by one; None when it has too many (the rest is dropped unread)."""
        frames = [self.router.recv(copy=False)]
        while frames[-1].more:
            if len(frames) > MAX_FRAMES:
                while self.router.getsockopt(zmq.RCVMORE):
                    self.router.recv(copy=False)
                self.refused["too_many_frames"] += 1
                return None
            frames.append(self.router.recv(copy=False))
        return frames

    def _receive(self):
        """Read one message: answer it, drop it, or queue it as work (True)."""
        frames = self._read_message()
        arrived = time.monotonic()
        if frames is None:
            self._log_dropped(ProtocolError(f"a message of more than {MAX_FRAMES} frames"))
            return
        return self._accept(frames[0], frames[1:], arrived)

    def _accept(self, identity, frames, arrived, owner=None):
        """Answer, drop, or queue as work (True) a message's frames; ``owner``: they were read from that
        client's request slot (:meth:`_follow`), and must be that client's request."""
        stamps = [("arrived", arrived)]
        try:  # digests: on the work thread
            header, buffers = self.session.unpack(frames, check_buffers=False, slot_of=owner)
        except StaleMessage as exc:  # signed, but not for now: say why (clocks that differ are a setup error)
            self._log_dropped(exc)
            if owner is None:  # from a slot: its ZeroMQ copy is as stale, and says so
                self._reply(identity, self._error_reply({}, exc))
            return
        except Duplicate:  # the second of a request's two copies (ZeroMQ, its request slot)
            self.counts["second_copies"] += 1
            return
        except ProtocolError as exc:
            self._log_dropped(exc)
            return
        if owner is not None:
            self.counts["from_slot"] += 1
        op = header["op"]
        self.counts[op if op in WORK_OPS or op in QUICK_OPS else "unknown"] += 1
        client = header.get("client")
        if not isinstance(client, str):
            client = header["client"] = None
        if op in WORK_OPS and client is None:
            self._reply(identity, self._error_reply(header, ProtocolError(f"a {op!r} request must name its client")))
        elif op in WORK_OPS:
            if owner is None:
                self._disarm(client, header.get("next_slot"))
            state = self.clients.seen(client, working=True)
            if self._steps:
                stamps.append(("unpacked", time.monotonic()))
            if self.queue.submit(client, (identity, header, buffers, state, stamps)):
                return True
            self.clients.answered(state)
            self.refused["queue_full"] += 1
            error = ProtocolError(f"this client already has {self.queue.max_queued} requests waiting; "
                                  "wait for their replies")
            self._reply(identity, self._error_reply(header, error))
        elif op in QUICK_OPS:
            self.clients.seen(client, working=False)
            try:
                self.session.check_buffers(header, buffers)  # quick ops carry none: nothing to hash
            except ProtocolError as exc:
                self._log_dropped(exc)
                return
            self._reply(identity, self._handle(header, buffers))
        else:
            self._reply(identity, self._error_reply(header, ProtocolError(f"unknown operation {op!r}")))

    def _follow(self, item):
        """After a reply: watch the block its request named as ``next_slot`` for the client's next request,
        while no other request runs or waits, for up to ``watch_ms`` (protocol.reply_slot).

        The block must lie in the pool its client attached. Its last word says that a thread watches it for
        that token (the client then does not ring); the request is marked when taken (:meth:`_take_request`).
        What is found there is read as any message (:meth:`_accept`), and anything wrong with it costs that
        client the wait for the ZeroMQ copy it holds back, nothing more.
        """
        identity, header = item[0], item[1]
        nbytes = header["next_slot"].get("nbytes") if isinstance(header.get("next_slot"), dict) else None
        if type(nbytes) is not int or not 2 * reply_slot.WORD <= nbytes <= reply_slot.REQUEST_SLOT_MAX:
            return
        try:
            found = self._slot_block(header, "next_slot")
        except ProtocolError:  # PoolError included; the client was freed meanwhile
            return
        if found is None:
            return
        self._watch_slot(identity, header, *found, give_way=self.queue.busy)

    def _watch_slot(self, identity, header, token, memory, give_way, heads_up=False):
        """Watch the request slot that ``header`` names as ``next_slot`` for ``token`` for up to ``watch_ms``,
        or until ``give_way()``; take the request written there (True if it was queued as work). A watch that
        times out or gives way arms the slot (the client rings from then on), marked as watched for a heads-up
        if this watch was one: a slot gets one such watch per reply. A heads-up's watch starts with a rehearsal
        (:meth:`_rehearse`), within its ``watch_ms``."""
        state, watch = reply_slot.state_word(memory), reply_slot.watch_word(memory)
        watch[0] = token  # the client need not ring
        deadline = time.monotonic() + self.watch_ms / 1000
        if heads_up and self._rehearsal is not None:  # the client checks its input: walk a request's steps
            self._rehearse(lambda: state[0] in (token, -token) or give_way())
        while state[0] not in (token, -token) and not self._stopping.is_set():
            if time.monotonic() > deadline or give_way():
                watch[0] = 0  # the client rings from now on, and the doorbell says when to look: armed
                self._arm(identity, header, heads_up)  # after the store (its lock is a barrier); a request written
                if state[0] != token:  # before the client read the watch word is taken here
                    return False
                self._disarm(header["client"], header["next_slot"])
                break
            os.sched_yield()
        watch[0] = 0
        return state[0] == token and self._take_request(identity, memory, header["client"], token)

    def _take_request(self, identity, memory, client, token):
        """The request a request slot of ``client`` holds, read as any message (:meth:`_accept`, as that
        client's only); True if it was queued as work. The slot is marked either way (``reply_slot.taken``,
        or ``-token``: the client sends the ZeroMQ copy it holds back)."""
        arrived = time.monotonic()
        frames = reply_slot.read(memory)
        queued = frames is not None and bool(self._accept(identity, frames, arrived, owner=client))
        reply_slot.state_word(memory)[0] = reply_slot.taken(token) if queued else -token
        return queued

    def _slot_block(self, header, name):
        """(token, memory) of the block that ``header[name]`` (a reply or request slot) names in the memfd pool
        its client attached; None where it names none that way. A range outside the pool: ProtocolError."""
        slot = header.get(name)
        if not isinstance(slot, dict) or header.get("pool") is None or not reply_slot.is_token(slot.get("token")):
            return None
        attachment = self.clients.attachment(header["client"], header["pool"])
        if attachment is None or attachment.kind != "memfd":
            return None
        return slot["token"], attachment.output(slot.get("segment"), slot.get("offset"), slot.get("nbytes")).memory

    def _arm(self, identity, header, heads_up_watched=False):
        """Have a ring that names the request slot of ``header``'s ``next_slot`` read it (``ring_of``);
        ``heads_up_watched``: a heads-up's watch of it has ended, and a ring for it empty starts no other."""
        slot = {"client": header["client"], "pool": header["pool"], "next_slot": header["next_slot"]}
        key = reply_slot.ring_of(header["client"], header["next_slot"])
        now = time.monotonic()
        with self._armed_lock:
            self._armed.pop(key, None)  # re-armed: it goes to the end, the freshest
            self._armed[key] = (identity, slot, now, heads_up_watched)
            while self._armed and (len(self._armed) > MAX_ARMED
                                   or next(iter(self._armed.values()))[2] < now - ARMED_SECONDS):
                del self._armed[next(iter(self._armed))]

    def _disarm(self, client, slot):
        """A request came through ZeroMQ, or was taken by the thread that armed the slot: the slot is armed
        again (with its new token) after it."""
        if self._armed and isinstance(slot, dict):
            with self._armed_lock:
                self._armed.pop(reply_slot.ring_of(client, slot), None)

    def _answer_bell(self):
        """Rings came: take the requests that the slots they name hold now; True if one was queued as work.

        A ring is a datagram that names a slot (``reply_slot.ring_of``), from anyone who may write to the
        socket: it is only looked up among the armed slots, and what such a slot holds is read as any message
        is (:meth:`_accept`: signature, time, replay, and the request must be the slot's client's). A ring for
        an armed slot that holds nothing yet is a heads-up (``Connection.heads_up``): this thread watches the
        slot as :meth:`_follow` does, for ``watch_ms`` at most, and gives way to any message or ring.
        """
        queued = False
        for _ in range(RINGS_IN_TURN):
            try:
                ring = self.doorbell[1].recv(reply_slot.RING_MAX)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the socket is closing
                break
            self.counts["rings"] += 1
            with self._armed_lock:
                armed = self._armed.get(ring)
                if armed is not None and armed[2] < time.monotonic() - ARMED_SECONDS:
                    del self._armed[ring]  # armed too long ago: its thread is idle or gone
                    armed = None
            if armed is None:
                continue  # not armed (watched, taken, too old, or never): the ZeroMQ copy counts
            identity, slot, _, heads_up_watched = armed
            try:
                found = self._slot_block(slot, "next_slot")
            except ProtocolError:  # the client was freed meanwhile
                found = None
            if found is not None:
                token, memory = found
                state = reply_slot.state_word(memory)[0]
                if heads_up_watched and state not in (token, -token):
                    continue  # nothing written, and a heads-up was watched for since the reply: it stays armed
            with self._armed_lock:
                if self._armed.get(ring) is not armed:
                    continue  # taken or armed again meanwhile
                del self._armed[ring]
            if found is None:
                continue
            try:
                if state == token:
                    self.counts["rung"] += 1
                    queued |= self._take_request(identity, memory, slot["client"], token)
                elif state != -token:  # nothing there yet: a heads-up (Connection.heads_up); watch for it while
                    self.counts["heads_up"] += 1  # nothing else runs, waits or arrives (as _follow does)
                    queued |= self._watch_slot(identity, slot, token, memory, heads_up=True,
                                               give_way=self._reader_gives_way)
            except Exception:  # noqa: BLE001 - as in _lead: a message must never stop the reading
                self.counts["failed"] += 1
                log.exception("a request read from a request slot could not be handled; dropped it")
        return queued

    def _rehearse(self, stop):
        """Walk a request's steps on a made-up one (protocol.rehearsal), in the context a request runs in,
        until ``stop()``: the request has come, or other work has. One that fails turns rehearsals off (said
        once): they only warm the caches."""
        try:
            self._rehearsal.worker(self._rehearsal_context, stop)
            self.counts["rehearsals"] += 1  # begun: one may stop at its first step
        except Exception:  # noqa: BLE001 - the request runs all the same
            self._rehearsal = None
            log.exception("a rehearsal failed; this worker rehearses no more")

    @contextlib.contextmanager
    def _rehearsal_context(self):
        """The contexts a request's operation runs in (``_handle``'s caught warnings, the backend's output type
        and finite check), entered as one: none stays entered if another fails to."""
        with caught_warnings(), self.backend.output_context("transform"), checked_finite(True):
            yield

    def _reader_gives_way(self):
        """A heads-up's watch, on the reader's thread, gives way to any other request and to any input."""
        return self.queue.busy() or self._input_waiting()

    def _input_waiting(self):
        """Whether a message or a ring waits for the reader: a watch on the reader's thread gives way to it."""
        with self._router_lock:
            if self.router.closed or message_waits(self.router):
                return True
        return bool(self._bell_waiting.poll(0))

    def _cancel(self, client):
        """Drop the work a freed client still has waiting: it never runs, and its replies would reach no one."""
        with self._armed_lock:
            for ring in [ring for ring, (_, slot, *_) in self._armed.items() if slot["client"] == client]:
                del self._armed[ring]
        dropped = self.queue.cancel(client)
        for _, _, _, state, _ in dropped:
            self.clients.answered(state)
        self.counts["cancelled"] += len(dropped)

    def _reply(self, identity, frames):
        """Send a reply, from whichever thread has it (under the socket's lock); wake the reading thread if the
        send took the signal of a message that has arrived meanwhile."""
        with self._router_lock:
            if self.router.closed:
                return  # stopped while this request ran: the client is told by the closed connection
            self.router.send_multipart([identity, *frames], copy=False)
            waiting = message_waits(self.router)
        if waiting and not getattr(self._local, "leading", False):
            self._wake()

    def _wake(self):
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.context.socket(zmq.PUSH)
            push.linger = 0
            push.connect(f"inproc://wakeup-{self.worker_id}")
        try:
            push.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # a thousand wakeups are waiting already: the reader is coming
            pass

    def _log_dropped(self, exc):
        """One warning per second at most: a flood of bad messages must not flood the log too."""
        now = time.monotonic()
        self._dropped_unlogged += 1
        if now - self._dropped_logged_at >= 1.0:
            more = self._dropped_unlogged - 1
            log.warning("dropped a message: %s%s", exc, f" (and {more} more since the last report)" if more else "")
            self._dropped_logged_at, self._dropped_unlogged = now, 0

    def _work(self, item):
        identity, header, buffers, state, stamps = item
        self._local.stamps = stamps
        self._stamp("taken")
        try:
            self.session.check_buffers(header, buffers)
        except ProtocolError as exc:  # a frame that is not what was signed: dropped, like a bad signature
            self.clients.answered(state)
            self._log_dropped(exc)
            return
        self._stamp("checked")
        try:
            if self._profile is None:
                frames = self._handle(header, buffers, stamps)
            else:
                profiler = cProfile.Profile()
                frames = profiler.runcall(self._handle, header, buffers, stamps)
                with self._profile_lock:
                    self._profile.append(profiler)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer, or the client waits forever
            log.exception("a request failed outside its operation")
            frames = self._error_reply(header, exc)
        try:
            self._publish(header, frames)
        finally:
            self.clients.answered(state)
        self._reply(identity, frames)
        # Only now drop the models the request released: freeing one takes milliseconds (a forest of 100
        # trees: 10-14 ms on the H200 machine), which the reply need not wait for. Peak memory is what cuML
        # in process has too, where rebinding a name frees the old model after the new one is fitted.
        self._local.freed = None

    def _stamp(self, step):
        """Note when ``step`` of this thread's request ended (``STEPS_ENV`` set; else nothing)."""
        if self._steps:
            self._local.stamps.append((step, time.monotonic()))

    def _publish(self, header, frames):
        """Write the reply into the block of its client's memfd pool that the request names (``reply_slot``),
        where that client may be watching for it (see protocol.reply_slot); ZeroMQ carries it as well.

        The range is validated as any pool range; a slot this worker cannot use is passed over (the reply
        still goes through ZeroMQ): a client that names a bad one only waits longer for its own reply.
        """
        try:
            found = self._slot_block(header, "reply_slot")
            if found is not None:
                reply_slot.write(found[1], found[0], frames)
        except ProtocolError as exc:  # PoolError included; the client was freed meanwhile
            log.debug("a reply slot was passed over: %s", exc)
        except Exception:  # noqa: BLE001 - a bug here must not keep the reply from going through ZeroMQ
            log.exception("a reply slot could not be written; the reply goes through ZeroMQ only")

    def _handle(self, header, buffers, stamps=None):
        """Run one operation; always returns reply frames, never raises.

        ``stamps``: [(step, CLOCK_MONOTONIC seconds)], from the message's arrival on (see ``_stamp``).
        """
        stamps = self._local.stamps = stamps or [("arrived", time.monotonic())]
        self._local.kept = []  # keys of the arrays this request asked the worker to keep, and it kept
        self._local.pools, self._local.read_pinned = [], False  # see _pool_of
        try:
            started = stamps[0][1]
            freed = self.handles.release(self._releases(header), header.get("client"))
            if header["op"] in WORK_OPS:  # out of the table now; the models themselves go after the reply (_work)
                self._local.freed = freed
            with caught_warnings() as caught:  # this thread's alone: requests of other clients run beside it
                payload, reply_buffers = getattr(self, "_op_" + header["op"])(header, buffers)
            # when the message arrived and its reply was ready (CLOCK_MONOTONIC, which processes on one
            # host share): profiles tell the worker's share from the client's and the sockets'
            reply = {"op": "reply", "id": new_id(), "parent": header.get("id"), **payload,
                     "worker_span": [started, time.monotonic()]}
            if self._steps:
                reply["worker_steps"] = stamps
            if self._local.kept:
                reply["cache_kept"] = self._local.kept
            if caught:
                reply["warnings"] = caught
            return self.session.pack(reply, reply_buffers)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            return self._error_reply(header, exc)
        finally:
            self._let_go()

    def _pool_of(self, header):
        """The pool a request names (None: none); where pools are pinned, held by the request until it has
        settled (:meth:`_let_go`)."""
        attachment = self.clients.attachment(header["client"], header.get("pool"))
        if attachment is not None and self.pinning is not None and attachment not in self._local.pools:
            attachment.hold()
            self._local.pools.append(attachment)
        return attachment

    def _let_go(self):
        """Before the reply: wait for the device where a copy came from pinned memory (it runs in the
        background, and the client reuses the block once answered); then let the request's pools go."""
        pools, self._local.pools = self._local.pools, []
        try:
            if self._local.read_pinned:
                self._local.read_pinned = False
                self.backend.settle()
        finally:
            for attachment in pools:
                attachment.let_go()

    def _error_reply(self, header, exc):
        reply = {"op": "error", "id": new_id(), "parent": header.get("id"), **describe(exc, to_plain)}
        if isinstance(exc, MemoryError):
            reply["message"] += self._memory_note(header)
            reply["args"] = (reply["message"],)
        try:
            return self.session.pack(reply)
        except Exception:  # noqa: BLE001 - e.g. args too odd to pickle: send the text alone
            reply.update(args=(reply["message"],), mro=[("builtins", "Exception")])
            return self.session.pack(reply)

    def _memory_note(self, header):
        """What a MemoryError needs to be understood: the request's size and the device's memory."""
        sent = _input_bytes(header)
        what = ".".join(str(header[k]) for k in ("estimator", "method") if header.get(k))
        note = f" [worker: {header.get('op')} {what} on {_size(sent)} of input"
        if self.backend.device_resident:
            try:
                import cupy

                free, total = cupy.cuda.Device().mem_info
                note += f"; GPU memory: {_size(free)} free of {_size(total)}"
            except Exception:  # noqa: BLE001 - informative only
                log.debug("could not read the GPU's memory", exc_info=True)
        return note + "; the worker carries on]"

    @staticmethod
    def _releases(header):
        """The handles a request asks the worker to free (``release``), checked."""
        handles = header.get("release") or []
        if not isinstance(handles, list):
            raise ProtocolError("'release' must be a list of handles")
        return handles

    # ------------------------------------------------------------ quick ops

    def _op_hello(self, header, buffers):
        version = header.get("protocol_version")
        if version != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"client speaks protocol {version}, this worker speaks {PROTOCOL_VERSION}: "
                "install the same sklearn-gpu-bridge version on both sides"
            )
        pool, client = header.get("pool"), header.get("client")
        slot = None
        if isinstance(pool, dict) and client is not None:
            slot = self.clients.challenge(client, pool, header.get("pid"))
        capabilities = Capabilities(
            protocol_version=PROTOCOL_VERSION, worker_id=self.worker_id, backend=self.backend.name,
            fallback_reason=self.fallback_reason, float_dtype=self.backend.float_dtype, pool=False,
            pool_challenge=slot, max_frame_bytes=self.max_frame_bytes, versions=self.versions,
            array_cache=self.array_cache.max_bytes if self.array_cache is not None else 0,
            client_timeout=self._client_timeout(watched=False),
        )
        return capabilities.to_reply(), []

    def _client_timeout(self, watched):
        return None if watched or not self.clients.client_timeout else self.clients.client_timeout

    def _op_attach(self, header, buffers):
        attached, watched = self.clients.attach(header.get("client"), header.get("nonce"))
        doorbell = str(self.doorbell[0]) if attached and self.doorbell is not None else None
        return {"pool": attached, "client_timeout": self._client_timeout(watched), "doorbell": doorbell}, []

    def _op_ping(self, header, buffers):
        return {"busy": self.queue.waiting()}, []

    def _op_status(self, header, buffers):
        cache = self.array_cache
        return {
            "backend": self.backend.name, "pid": os.getpid(), "address": self.address,
            "uptime": time.time() - self.started, "handles": len(self.handles),
            "pools": len(self.clients.pools), "clients": len(self.clients), "requests": dict(self.counts),
            "refused": dict(self.session.refused + self.refused
                            + (self.gatekeeper.refused if self.gatekeeper else Counter())),
            "swept": dict(self.clients.swept), "rss": rss_bytes(), "page_faults": page_faults(),
            "queued": self.queue.waiting(),
            "threads": self.queue.threads, "running": self.queue.running, "peak_running": self.queue.peak,
            "watch_ms": self.watch_ms, "collections": [g["collections"] for g in gc.get_stats()],
            "device_budget": self.queue.budget, "device_in_use": self.queue.in_use,
            "pinned": self.pinning.status() if self.pinning is not None else None,
            "labels_on_host": self.backend.host_labels.taken if self.backend.host_labels is not None else None,
            "versions": self.versions,
            "array_cache": {"entries": len(cache) if cache else 0, "bytes": cache.nbytes if cache else 0,
                            "max_bytes": cache.max_bytes if cache else 0},
        }, []

    def _op_release(self, header, buffers):
        return {}, []  # the handles were released by _handle

    def _op_goodbye(self, header, buffers):
        client = header.get("client")
        state = self.clients.get(client)
        released = self.clients.free(client, state, "goodbye", "said goodbye") if state is not None else 0
        return {"released": released}, []

    def _op_shutdown(self, header, buffers):
        self._stopping.set()
        return {}, []

    # ------------------------------------------------------------ work ops

    def _decoder(self, header, buffers):
        attachment = self._pool_of(header)
        read_pool = None
        if attachment is not None:
            retains = header["op"] == "fit" or header.get("method") == "partial_fit"
            if not (self.backend.device_resident or not retains or attachment.kind == "file"):
                # a fitted CPU estimator may keep a view of its input: never of a block the client reuses
                read_pool = lambda s, o, n: bytearray(attachment.read(s, o, n))  # noqa: E731
            elif self.pinning is None:
                read_pool = attachment.read  # a view of a memfd; files are read as copies
            else:
                def read_pool(segment, offset, nbytes):
                    view = attachment.read(segment, offset, nbytes)
                    if attachment.is_pinned(segment):
                        self._local.read_pinned = True  # _let_go waits for the device before the reply
                    return view
        cache = None
        if self.array_cache is not None:
            cache = self.array_cache.for_client(header["client"], self._local.kept)
        return Decoder(header, buffers, read_pool=read_pool, cache=cache)

    def _encoder(self, header):
        """(encoder, output): results go into the output block the client gave, else as frames."""
        out = header.get("out")
        attachment = self._pool_of(header)
        if not out or attachment is None:
            return Encoder(), None
        segment, start, size = out.get("segment"), out.get("offset"), out.get("nbytes")
        output = attachment.output(segment, start, size)  # validates the range once
        block, used = output.memory, 0

        def place(nbytes):
            nonlocal used
            if used + nbytes > size:
                return None
            offset = used
            used = -(-(used + nbytes) // ALIGN) * ALIGN
            output.used = used
            return segment, start + offset, block[offset : offset + nbytes]

        output.used = 0
        return Encoder(place), output

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
        encoder, output = self._encoder(header)
        # a value that is not plain fails when the reply is packed, and the client gets that error instead
        payload = encoder.encode({"result": None if result is estimator else result, **extra})
        if output is not None:
            output.commit(output.used)
        self._stamp("encoded")
        return {"payload": payload, "arrays": encoder.arrays}, encoder.buffers

    def _op_fit(self, header, buffers):
        name, method = header.get("estimator"), header.get("method", "fit")
        self.backend.check_fit(name, method)
        changed = header.get("changed", [])
        if not isinstance(changed, list):
            raise ProtocolError("'changed' must be a list of parameter names")
        args, kwargs = self._args(header, buffers)
        self._stamp("decoded")
        estimator, result, dropped = self.backend.fit(name, self._params(header, buffers), method, args, kwargs,
                                                      changed, header.get("params_from"),
                                                      finite=header.get("finite") is True)
        self._stamp("ran")
        handle = self.handles.add(estimator, name, header["client"])
        return self._reply_result(header, result, estimator, handle=handle, dropped=dropped)

    def _op_call(self, header, buffers):
        entry = self.handles.get(header.get("handle"), header["client"])
        method = header.get("method")
        self.backend.check_call(entry.name, method)  # refused before anything is decoded
        args, kwargs = self._args(header, buffers)
        self._stamp("decoded")
        result = self.backend.call(entry.name, entry.estimator, method, args, kwargs,
                                   finite=header.get("finite") is True)
        self._stamp("ran")
        return self._reply_result(header, result, entry.estimator)

    def _op_attribute(self, header, buffers):
        entry = self.handles.get(header.get("handle"), header["client"])
        return self._reply_result(header, self.backend.attribute(entry.estimator, header.get("name")),
                                  entry.estimator)

    def _op_echo(self, header, buffers):
        """Send the payload's arrays straight back: measures and tests the transport alone."""
        args, _ = self._args(header, buffers)
        return self._reply_result(header, args, None)

    def _op_get_state(self, header, buffers):
        entry = self.handles.get(header.get("handle"), header["client"])
        portable, native = self.backend.export_state(entry.estimator)
        reply = {"backend": self.backend.name, "portable": portable is not None, "native": native is not None}
        return reply, [blob for blob in (portable, native) if blob is not None]

    def _op_set_state(self, header, buffers):
        name, form = header.get("estimator"), header.get("form")
        self.backend.estimator_class(name)  # refuse unknown names and forms before touching the blob
        if form not in ("portable", "native"):
            raise ValueError(f"unknown state form {form!r}")
        blob = self._decoder(header, buffers).decode(header.get("state"))
        estimator = self.backend.import_state(name, form, bytes(blob))
        return {"handle": self.handles.add(estimator, name, header["client"])}, []


def _input_bytes(header):
    """The bytes of the arrays a request carries (as its header describes them)."""
    arrays = header.get("arrays") if isinstance(header.get("arrays"), list) else []
    sent = 0
    for desc in arrays:
        try:
            sent += math.prod(desc["shape"]) * np.dtype(desc["dtype"]).itemsize
        except Exception:  # noqa: BLE001 - a malformed one is refused later, by the decoder
            continue
    return sent


def _size(nbytes):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
