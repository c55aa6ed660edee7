"""The client: a connection to one worker, and the process's own connection.

A :class:`Connection` places what the estimators ask for: it casts and
encodes their arrays (into pool blocks, inline, or as frames), sizes room for
the reply's arrays, signs, sends, waits, and decodes. Each thread gets its own
DEALER socket; the connection has one shared-memory pool and one list of
handles waiting to be released. A forked or spawned child (joblib's workers)
opens its own connection to the SAME worker: it finds it through the
environment variable that names the connection file.

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
import logging
import os
import socket
import stat
import subprocess
import threading
import time
import warnings
import weakref
from collections import Counter, deque
from dataclasses import dataclass, replace

import cloudpickle
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from ..config import DEFAULTS, ENV_CONNECTION_FILE, get_config, get_setting
from ..runtime.connection_file import default_connection_file, read_connection_file
from ..transport.inprocess import execution_mode
from ..errors import CacheMiss, ConfigurationError, ProtocolError, VersionMismatch, WorkerLost, WorkerUnavailable, rebuild, warning_class
from ..runtime.keys import secure
from ..manage.local_worker import ensure_local_worker, is_local_connection_file
from ..protocol import (
    POOL_INLINE_MAX,
    PROTOCOL_VERSION,
    AsDtype,
    Capabilities,
    Decoder,
    Encoder,
    KnownArrays,
    Session,
    new_id,
    to_plain,
)
from ..transport import rehearsal
from ..transport import reply_slot
from ..protocol.arrays import is_sparse
from ..protocol.session import message_waits
from ..shm import Pool
from ..manage.transport_select import client_transport

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
POLL_SECONDS = 0.5  # a waiting call wakes up at least this often, and pings the worker this often
ARRAY_CACHE_MODES = ("auto", "on", "off")
ALIGN = 64  # reply arrays start on this boundary inside the output block
SPIN_SECONDS = 0.01  # a call watches its reply slot this long, then sleeps on the socket
SPIN_MIN_CPUS = 4  # "auto" spins only on hosts with at least this many cores (the worker's threads need some)
REPLY_WAITS = ("auto", "spin", "sleep")
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


def start_hint(path="PATH"):
    return f"start one with:  sklearn-gpu-bridge worker --connection-file {path}"


def _dealer(info, connect=True):
    """A DEALER to the worker with the credentials its address asks for (keys.secure), on the process's context.

    The context is the process-wide ``zmq.Context.instance()``, never one per
    connection: a connection dropped with sockets still open (a thread that
    never noticed the loss) then costs those sockets, never a ``term()`` that
    blocks forever inside the garbage collector.
    """
    sock = secure(zmq.Context.instance().socket(zmq.DEALER), info, get_setting("curve_secret_key"))
    sock.linger = 0
    if connect:
        sock.connect(info.address)
    return sock


class _Link:
    """One thread's sockets: requests, a monitor of the connection, and (when needed) pings; and the block of
    the pool where the worker may watch for this thread's next request (protocol.reply_slot)."""

    def __init__(self, info, retire_slot):
        self.info = info
        self.retire_slot = retire_slot  # where the request slot goes when the link does (never back to the pool)
        self.socket = _dealer(info, connect=False)
        # its own name, kept when ZeroMQ connects it again (the worker hands the name over to the new
        # connection): a request the worker read from this thread's request slot is answered to it, not to a
        # connection that is gone. Random, never sent to anyone, and not starting with 0 (ZeroMQ's own)
        self.socket.routing_id = b"\x01" + os.urandom(15)
        self.events = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        self.socket.connect(info.address)  # after the monitor: no event is missed
        self.pinger = None
        self.copies = 0  # ZeroMQ copies of replies already read from the pool, not yet dropped
        # the blocks of this thread's requests interrupted while they waited (Ctrl-C), by request id: the worker
        # may still write into them, so they go back to the pool when the reply to that request has come here
        # (answered_late); until then each reply dropped unread is checked for it
        self.unanswered = {}
        self.request_slot = None  # a pool block this thread keeps (allocated at its first announcement)
        self.next_token = None  # what the worker watches the request slot for after the last reply, if it does
        self.ring = None  # the doorbell's datagram that names the request slot (reply_slot.ring_of)
        self.watch = None  # the request slot's watch word (reply_slot.watch_word), read before each ring
        self.rehearse_reply = False  # this call rang a heads-up (the worker was idle): rehearse before its reply
        self.rehearsal = None  # its protocol.rehearsal.Rehearsal, made at its first
        self.closed = False
        self._close_lock = threading.Lock()
        self.pid = os.getpid()

    def send(self, frames, doorbell=None, hold=False):
        """Send a request: into the request slot too where the worker watches for it, or looks when its
        ``doorbell`` rings, which is rung unless a worker thread watches the slot for this very request.

        ZeroMQ carries the request as well (the worker may not look; whichever copy comes second is
        dropped), unless held: with ``hold`` and a doorbell, that copy is returned as a :class:`_HeldCopy`,
        sent only where the worker does not mark the request taken (:meth:`Connection._watch`); else None.
        """
        token, self.next_token = self.next_token, None
        if token is not None and len(frames) == 2:  # a request whose arrays lie in the pool
            memory = self.request_slot.buffer()
            if reply_slot.write(reply_slot.request_room(memory), token, frames) and doorbell is not None:
                if self.watch[0] != token:
                    _ring(doorbell, self.ring)
                if hold:
                    return _HeldCopy(self, frames, token, memory)
        self.socket.send_multipart(frames, copy=False)
        return None

    def drop_copies(self, unpack):
        """Drop, unread, the ZeroMQ copies of replies taken from the pool that have come (between two
        requests of this thread nothing else can be waiting: a late reply of a request given up on is dropped
        with them, as :meth:`Connection._await` would). While an interrupted request's blocks wait for its
        reply, each is read (``unpack``: the session's) for :meth:`answered_late` first."""
        while self.copies and message_waits(self.socket):
            frames = self.socket.recv_multipart(copy=False)
            if self.unanswered:
                try:
                    self.answered_late(unpack(frames))
                except ProtocolError:
                    pass
            self.copies -= 1

    def answered_late(self, reply):
        """``reply`` (header, buffers, or None) came after its request stopped waiting: if that request was
        interrupted, the worker has written all it will into its blocks by now (the reply goes into its reply
        slot before it is sent), and they go back to the pool."""
        if reply is not None and self.unanswered:
            for block in self.unanswered.pop(reply[0].get("parent"), ()):
                block.release()

    def disconnected(self):
        """Whether, since the last look, the connection dropped or a reconnect found nobody listening.

        ZeroMQ retries a refused connect every 100 ms, so a worker that died
        between two requests is known within that, not after a heartbeat timeout.
        """
        dropped = False
        while message_waits(self.events):
            event = recv_monitor_message(self.events)
            dropped |= event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED)
        return dropped

    def ping_socket(self):
        if self.pinger is None:
            self.pinger = _dealer(self.info)
        return self.pinger

    def close(self):
        with self._close_lock:  # the thread that ends and one that closes the connection may both try
            if self.closed:
                return
            self.closed = True
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        for sock in (self.events, self.socket, self.pinger):
            if sock is not None:
                sock.close(linger=0)
        if self.request_slot is not None:  # the worker may still write its marks there: never an array's
            self.retire_slot(self.request_slot)

    def __del__(self):
        """A thread's link goes when the thread ends (the connection holds links weakly), and with it its
        sockets and its request slot: a program that starts thread after thread keeps no descriptors or pool
        slots of the threads that are gone. Not in a forked child, which drops the other threads' links
        of its parent: their sockets are the parent's."""
        if getattr(self, "pid", None) != os.getpid():
            return
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit ZeroMQ may be gone first
            pass


class _HeldCopy:
    """The ZeroMQ copy of a request written into its request slot, held back until the worker marks the
    request there (protocol.reply_slot): sent where it was not taken, or no mark came in time."""

    def __init__(self, link, frames, token, memory):
        self.link, self.frames = link, frames
        self.state = reply_slot.state_word(memory)
        self.taken, self.refused = reply_slot.taken(token), -token
        self.limit = time.monotonic() + reply_slot.COPY_AFTER

    def settled(self, now, last=False):
        """True once nothing more is to be done: the request was taken, or its copy is sent (``last``: the
        client stops looking, so the copy is sent now unless the request was taken)."""
        state = self.state[0]
        if state == self.taken:
            return True
        if last or state == self.refused or now > self.limit:
            self.send()
            return True
        return False

    def send(self):
        self.link.socket.send_multipart(self.frames, copy=False)


def _ring(doorbell, ring):
    """Ring the worker's doorbell (a Unix datagram socket) for a request slot: never waits, never signals (a
    worker gone, a full queue: the ZeroMQ copy counts)."""
    try:
        doorbell.send(ring, _RING_FLAGS)
    except OSError:
        pass


# an int: flags' | is Python code; neither flag is on Windows (where no doorbell is rung), which imports this too
_RING_FLAGS = int(getattr(socket, "MSG_DONTWAIT", 0) | getattr(socket, "MSG_NOSIGNAL", 0))


def _open_doorbell(path):
    """A datagram socket connected to the worker's doorbell (``attach``'s reply names it), or None: not a socket
    of this user's, or gone. The worker looks only at the armed slot a ring names, and checks what it finds."""
    if not path or not hasattr(socket, "AF_UNIX"):
        return None
    bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
            raise OSError(f"{path} is not a socket of this user's")
        bell.connect(path)
        bell.setblocking(False)
        return bell
    except OSError as exc:
        bell.close()
        log.debug("no doorbell: %s", exc)
        return None


@dataclass
class Fitted:
    """What a fit request gives back."""

    handle: int
    result: object  #: the method's result (fit_transform's X', fit_predict's labels), None for fit
    dropped: list  #: parameters the worker's class does not take


class Connection:
    """A process's link to one worker: sockets per thread, one pool, pending releases.

    ``array_cache`` (auto | on | off): arrays of at least ``cache_min_bytes``
    are named by a fingerprint of their content, and one the worker already
    keeps is sent as its key alone (see :class:`protocol.KnownArrays`). ``auto``
    turns it on only when arrays travel as frames. Measured on a 2-core x86 VM, 50 MB::

        python -c "import timeit,numpy as np; from sklearn_gpu_bridge.protocol.session import buffer_digest; \
          a=np.ones(50_000_000,np.uint8); b=a.copy(); \
          print(timeit.timeit(lambda: buffer_digest(a),number=5)/5, timeit.timeit(lambda: np.copyto(b,a),number=5)/5)"

    BLAKE3 on both cores 10.6 ms (4.7 GB/s), np.copyto 5.8 ms. With the pool
    (one memcpy into a block) hashing costs twice what it saves. A frame is
    hashed for the signed header anyway, and the cache key is made from that
    digest, so on the frames path the cache costs almost nothing. A frame
    crosses a network stack on each side: over TCP loopback on that VM, a
    repeated 50 MB fit took the same with and without the cache (100-120 ms);
    over a real network or WSL's forwarding, each repeat saves its transfer.
    """

    def __init__(self, info, *, connection_file=None, pool=DEFAULTS["pool"], pool_directory=None,
                 heartbeat_timeout=DEFAULTS["heartbeat_timeout"], process=None,
                 array_cache=DEFAULTS["array_cache"], cache_min_bytes=DEFAULTS["cache_min_bytes"]):
        if array_cache not in ARRAY_CACHE_MODES:
            raise ValueError(f"array_cache must be one of {', '.join(ARRAY_CACHE_MODES)}, not {array_cache!r}")
        self.info = info
        self.connection_file = connection_file or "PATH"
        self.pid = os.getpid()
        self.client_id = new_id()
        self.process = process  # the local worker's Popen, to notice its death at once
        self.heartbeat_timeout = heartbeat_timeout
        self.session = Session(info.key_bytes, peer=info.worker_id)
        self.stats = Counter()  # arrays sent/received per path (inline, pool, frame, cached); cache_hits ...
        self._stats_lock = threading.Lock()
        self.closed = False
        self._local = threading.local()
        self._links = weakref.WeakSet()  # every thread's link; each lives as long as its thread (_link)
        self._sockets_lock = threading.Lock()
        self._releases = deque()
        self._keepalive = None
        self._stop_keepalive = threading.Event()
        self.pool = Pool(pool_directory) if pool != "off" else None
        self._doorbell = None  # the worker's doorbell socket, where it attached the pool (_open_doorbell)
        # request slots of links that are gone: the worker may still write into one (its watch word, a late
        # mark), so each is kept for another thread's requests, never given back to the pool for arrays
        self._spare_request_slots = deque()
        self._rehearsals_on = rehearsal.wanted()
        self._cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        try:
            self.capabilities = self._hello()
        except BaseException:
            self._close_sockets()
            raise
        if self.capabilities.client_timeout:
            self._start_keepalive(float(self.capabilities.client_timeout))
        capacity = self.capabilities.array_cache
        wanted = array_cache == "on" or (array_cache == "auto" and self.pool is None)
        self.cache = KnownArrays(capacity, cache_min_bytes) if wanted and capacity else None

    # ------------------------------------------------------------ sockets

    def _link(self):
        link = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = _Link(self.info, self._spare_request_slots.append)
            with self._sockets_lock:
                self._links.add(link)
        return link

    def _drop_link(self):
        """Close this thread's sockets (after its worker was lost); a thread closes only its own."""
        link = getattr(self._local, "link", None)
        if link is not None:
            self._local.link = None
            with self._sockets_lock:
                self._links.discard(link)
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
        """The worker's Capabilities; with a pool, proven to be this client's (the nonce) and attached."""
        header = {"op": "hello", "protocol_version": PROTOCOL_VERSION, "pid": os.getpid()}
        if self.pool is not None:
            header["pool"] = self.pool.describe()
        try:
            reply, _ = self._roundtrip(header, timeout=HELLO_TIMEOUT)
        except WorkerLost as exc:
            why = (f"within {HELLO_TIMEOUT:.0f} s (not running, or a different key)" if "within" in str(exc)
                   else "(nothing listens there, or it closed the connection: stopped, or credentials that "
                        "do not match)")
            raise WorkerUnavailable(
                f"no worker answered at {self.info.address} {why}; {start_hint(self.connection_file)}"
            ) from exc
        if reply.get("protocol_version") != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"worker speaks protocol {reply.get('protocol_version')}, this client {PROTOCOL_VERSION}"
            )
        capabilities = Capabilities.from_reply(reply)
        if self.pool is not None and capabilities.pool_challenge is not None:
            nonce = self.pool.read_nonce(capabilities.pool_challenge)
            attached, _ = self._roundtrip({"op": "attach", "nonce": nonce}, timeout=HELLO_TIMEOUT)
            if attached.get("pool"):
                self._doorbell = _open_doorbell(attached.get("doorbell"))
            capabilities = replace(capabilities, pool=bool(attached.get("pool")),
                                   client_timeout=attached.get("client_timeout"))
        if not capabilities.pool and self.pool is not None:
            self.pool.close()
            self.pool = None
        return capabilities

    def _roundtrip(self, header, buffers=(), timeout=None, digests=None, slot=None):
        """Send one signed request and wait for its reply (or an error); ``digests``: see Session.pack.

        ``slot``: (block, seconds): the pool block the request names as its ``reply_slot``, watched for that
        long before the socket (see :meth:`_watch`).
        """
        header["id"] = new_id()
        header["client"] = self.client_id
        releases = self._drain_releases()
        if releases:
            header["release"] = releases
        link = self._link()
        rehearse, link.rehearse_reply = link.rehearse_reply, False  # this call's heads-up's, never a later call's
        if slot is None:
            link.disconnected()  # forget drops that happened before this request (a reconnected link keeps its name)
            link.drop_copies(self.session.unpack)
        else:  # a worker on this host: it may watch for this thread's next request; copies and drops go in _watch
            header["next_slot"] = self._request_slot(link)
        frames = self.session.pack(header, buffers, digests)
        sent = time.monotonic()  # before the send: a send can return after the worker has the message
        held = link.send(frames, self._doorbell, hold=slot is not None)
        reply = (self._watch(*slot, header["reply_slot"]["token"], header["id"], held, link, rehearse)
                 if slot is not None else None)
        if reply is not None:
            link.copies += 1  # its ZeroMQ copy is on its way: dropped unread before the next request
            reply, reply_buffers = reply
        else:
            reply, reply_buffers = self._await(link, header["id"], timeout, header["op"])
        link.next_token = header["next_slot"]["token"] if slot is not None else None  # answered: it watches now
        self._local.timing = (sent, time.monotonic(), reply.get("worker_span"), reply.get("worker_steps"))
        if reply["op"] == "error":
            raise rebuild(reply)
        for module, category, message in reply.get("warnings", ()):
            warnings.warn(message, warning_class(module, category), stacklevel=4)
        return reply, reply_buffers

    def _request_slot(self, link):
        """``next_slot`` of a request: this thread's request slot and a fresh token for its next request."""
        if link.request_slot is None:
            try:
                link.request_slot = self._spare_request_slots.pop()
            except IndexError:
                link.request_slot = self.pool.allocate(1)
            link.ring = reply_slot.ring_of(self.client_id, {"segment": link.request_slot.segment,
                                                            "offset": link.request_slot.offset})
            link.watch = reply_slot.watch_word(link.request_slot.buffer())
        block = link.request_slot
        return {"segment": block.segment, "offset": block.offset, "nbytes": block.nbytes,
                "token": reply_slot.new_token()}

    def _watch(self, block, seconds, token, msg_id, held=None, link=None, rehearse=False):
        """The reply from the request's reply slot, spinning on its first word for at most ``seconds``;
        None to wait on the socket instead (time up, it did not fit, it does not verify).

        Spinning keeps this thread's core awake, as CUDA does while it waits for a kernel, so the reply is
        read within microseconds of its writing; ``os.sched_yield`` between looks gives the core to any
        thread that has work (the worker's, on a busy host). ``held``: the request's ZeroMQ copy, held back
        (:meth:`_Link.send`); sent meanwhile unless the worker marks the request taken, and before this
        returns without a reply (a request that comes back with its reply in the slot was taken). ``link``:
        whose ZeroMQ copies of earlier replies are dropped meanwhile (:meth:`_Link.drop_copies`), in the time
        that waiting has to spare; a ZeroMQ socket keeps the order of messages, so they come before this
        reply's own copy, which is never dropped here. ``rehearse``: the call rang a heads-up (the worker had
        been idle, and so had this thread's reply steps): a rehearsal of those steps comes first, while the
        worker runs the request (protocol.rehearsal); one that fails turns them off (said once).
        """
        if link is not None:  # drops from before this request are forgotten while the worker runs it, not before
            # sending. One in the microseconds since the send is forgotten too; ZeroMQ's reconnects, every 100 ms,
            # then tell of a worker that is gone, but not of one replaced at the same address meanwhile, whose pings
            # answer while this request waits (when the look came before sending, no drop after the send was lost)
            link.disconnected()
        if rehearse and link is not None and self._rehearsals_on:
            try:
                link.rehearsal = link.rehearsal or rehearsal.Rehearsal()
                link.rehearsal.client()
            except Exception:  # noqa: BLE001 - it only warms the caches: the reply is read all the same
                self._rehearsals_on = False
                log.exception("a rehearsal failed; this connection rehearses no more")
        memory = block.buffer()
        state = reply_slot.state_word(memory)
        deadline = time.monotonic() + seconds
        while state[0] != token:
            now = time.monotonic()
            if state[0] == -token:  # the reply did not fit: the request was taken
                return None
            if now > deadline:
                if held is not None:
                    held.settled(now, last=True)
                return None
            if held is not None and held.settled(now):
                held = None
            elif link is not None and link.copies:
                link.drop_copies(self.session.unpack)
            os.sched_yield()
        frames = reply_slot.read(memory)
        try:
            reply = self.session.unpack(frames) if frames is not None else None
        except ProtocolError as exc:
            log.debug("a reply in the pool did not verify (its ZeroMQ copy is used): %s", exc)
            reply = None
        if reply is None or reply[0].get("parent") != msg_id:
            return None
        self._count("replies_", {"from_pool": 1})
        return reply

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
                # otherwise the late reply of a request given up on, or the ZeroMQ copy of one read from the
                # pool that came after this request was sent: read on
                link.answered_late(reply)
                link.copies = max(0, link.copies - 1)
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
                ping_id = self._send_ping(pinger)

    def _send_ping(self, sock):
        ping_id = new_id()
        sock.send_multipart(self.session.pack({"op": "ping", "id": ping_id, "client": self.client_id}))
        return ping_id

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
        sock = _dealer(self.info)
        try:
            ping_id = self._send_ping(sock)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(left * 1000):
                    return False
                pong = self._receive(sock)
                if pong is not None and pong[0].get("parent") == ping_id:
                    return True
            return False
        finally:
            sock.close(linger=0)

    def request(self, header, payload=None, *, blobs=None, out_nbytes=0):
        """A round trip carrying arrays: pool blocks are held for the request's lifetime.

        ``out_nbytes`` reserves a block for the reply's arrays; the part that
        results occupy stays held until those arrays are freed. Returns
        (reply header, decoded payload, reply buffers).

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
        blocks = []
        if self.pool is None:
            place = None
        else:
            header["pool"] = self.pool.name

            def place(nbytes):
                block = self.pool.allocate(nbytes)
                blocks.append(block)
                return block.segment, block.offset, block.buffer()

        out = slot = None
        waiting = False  # sent, or being sent: the worker may write into the reply slot and ``out``
        try:
            spin = self.spin_seconds()
            if spin:
                block = self.pool.allocate(1)  # one slot of the pool (1 MiB): a reply's header, inline arrays
                blocks.append(block)
                reply_slot.state_word(block.buffer())[0] = 0  # a block used before may hold an old state
                header["reply_slot"] = {"segment": block.segment, "offset": block.offset, "nbytes": block.nbytes,
                                        "token": reply_slot.new_token()}
                slot = (block, spin)
            encoder = Encoder(place, cache=self.cache, reuse=reuse, max_frame=self.capabilities.max_frame_bytes)
            if payload is not None:
                header["payload"] = encoder.encode(payload)
            for name, blob in (blobs or {}).items():
                header[name] = encoder.blob(blob)
            header["arrays"] = encoder.arrays
            if self.pool is not None and out_nbytes > POOL_INLINE_MAX:
                out = self.pool.allocate(out_nbytes)
                header["out"] = {"segment": out.segment, "offset": out.offset, "nbytes": out.nbytes}
            self._count("sent_", encoder.counts)
            waiting = True
            reply, buffers = self._roundtrip(header, encoder.buffers, digests=encoder.digests, slot=slot)
        except BaseException as exc:
            held = blocks + ([out] if out is not None else [])
            if waiting and (isinstance(exc, WorkerLost) or not isinstance(exc, Exception)):
                # no reply came (the worker is lost, or a Ctrl-C interrupted the wait): the worker may still
                # run the request and write into these blocks, so they are not reused until its reply has come
                # (a lost worker's go with the pool); an error is a reply
                link = getattr(self._local, "link", None)  # the thread's: its socket gets the late reply
                if held and link is not None and not isinstance(exc, WorkerLost) and "id" in header:
                    link.unanswered[header["id"]] = held
                raise
            for block in held:
                block.release()
            if isinstance(exc, CacheMiss) and encoder.reused:
                for key, _ in encoder.reused:
                    self.cache.pop(key)
            raise
        for block in blocks:
            block.release()
        if encoder.reused or encoder.offered:
            kept = set(reply.get("cache_kept") or ())
            for key, nbytes in encoder.offered:
                if key in kept:
                    self.cache.put(key, True, nbytes)
            self._count("cache_", {"hits": len(encoder.reused),
                                   "bytes_saved": sum(nbytes for _, nbytes in encoder.reused)})
        decoder = Decoder(reply, buffers, read_pool=_OutputBlock(out), writeable=True)
        value = decoder.decode(reply.get("payload"))
        self._count("received_", decoder.counts)
        return reply, value, buffers

    def _count(self, prefix, counts):
        with self._stats_lock:
            for where, n in counts.items():
                self.stats[prefix + where] += n

    # ------------------------------------------------------------ what is sent

    def spin_seconds(self):
        """How long a call watches its reply slot before it sleeps on the socket (the ``reply_wait`` setting).

        ``auto`` watches where a thread woken from sleep costs most and spinning costs least: a worker that
        computes on a GPU (its threads wait on the device, not on the cores), on a host of at least
        ``SPIN_MIN_CPUS`` cores; ``spin`` everywhere a memfd pool is shared; ``sleep`` never.
        """
        wait = get_setting("reply_wait")
        if wait not in REPLY_WAITS:
            raise ConfigurationError(f"reply_wait={wait!r}: choose one of {REPLY_WAITS}")
        if wait == "sleep" or self.pool is None or self.pool.kind != "memfd":
            return 0.0
        if wait == "auto" and (self.capabilities.backend != "cuml" or self._cpus < SPIN_MIN_CPUS):
            return 0.0
        return SPIN_SECONDS

    def _features(self, args):
        return features_as_sent(args, self.capabilities.float_dtype)

    def _out_nbytes(self, args, n_classes):
        """Room for the reply's arrays: one row per sample, as wide as X or the class scores."""
        X = args[0] if args else None
        if not hasattr(X, "shape") or not hasattr(X, "ndim") or X.ndim == 0:
            return 0
        width = max(X.shape[1] if X.ndim > 1 else 1, n_classes * max(n_classes - 1, 1) // 2, n_classes, 2)
        return X.shape[0] * width * 8

    # ------------------------------------------------------------ operations

    def fit(self, estimator, params, method, args, kwargs, changed=(), params_from=None, finite=False):
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
        _, value, _ = self.request(header, {"args": self._features(args), "kwargs": kwargs}, blobs=blobs,
                                   out_nbytes=out_nbytes)
        return Fitted(value["handle"], value["result"], value.get("dropped") or [])

    def call(self, handle, method, args, kwargs, *, n_classes=0, finite=False):
        """``method(*args, **kwargs)`` on the fitted estimator ``handle``; its result (``finite``: see fit)."""
        header = {"op": "call", "handle": handle, "method": method}
        if finite:
            header["finite"] = True
        payload = {"args": self._features(args), "kwargs": kwargs}
        _, value, _ = self.request(header, payload, out_nbytes=self._out_nbytes(args, n_classes))
        return value["result"]

    def attribute(self, handle, name):
        """A public fitted attribute (``coef_`` ...) of a remote estimator."""
        _, value, _ = self.request({"op": "attribute", "handle": handle, "name": name})
        return value["result"]

    def echo(self, *arrays, out_nbytes=None):
        """Send arrays to the worker and get them back (tests and benchmarks of the transport)."""
        if out_nbytes is None:
            out_nbytes = sum(a.nbytes for a in arrays) + ALIGN * len(arrays)
        _, value, _ = self.request({"op": "echo"}, {"args": list(arrays), "kwargs": {}}, out_nbytes=out_nbytes)
        return value["result"]

    def get_state(self, handle):
        """(backend, portable bytes or None, native bytes or None) of a fitted estimator."""
        reply, buffers = self._roundtrip({"op": "get_state", "handle": handle})
        blobs = [frame.bytes for frame in buffers]
        forms = [form for form in ("portable", "native") if reply.get(form)]
        if len(blobs) != len(forms) or not forms:
            raise ProtocolError("a state reply carries one blob per form it names")
        state = dict(zip(forms, blobs))
        return reply["backend"], state.get("portable"), state.get("native")

    def set_state(self, estimator, form, blob):
        """A handle to a fitted ``estimator`` rebuilt on the worker from a form of its state."""
        header = {"op": "set_state", "estimator": estimator, "form": form}
        reply, _, _ = self.request(header, blobs={"state": blob})
        return reply["handle"]

    def status(self):
        reply, _ = self._roundtrip({"op": "status"}, timeout=HELLO_TIMEOUT)
        return {k: v for k, v in reply.items() if k not in ("op", "id", "parent", "worker_span")}

    @property
    def last_stamps(self):
        """This thread's last request as CLOCK_MONOTONIC stamps: (sent, received, worker's [arrived, replied])."""
        timing = getattr(self._local, "timing", None)
        return timing[:3] if timing is not None else None

    @property
    def last_worker_steps(self):
        """The worker's steps of this thread's last request, [(step, CLOCK_MONOTONIC seconds)], where the
        worker runs with ``SKLEARN_GPU_BRIDGE_WORKER_STEPS`` set (else None)."""
        timing = getattr(self._local, "timing", None)
        return timing[3] if timing is not None else None

    @property
    def last_timing(self):
        """This thread's last request, in seconds: (to the worker, on the worker, back), or None.

        From CLOCK_MONOTONIC stamps that the client and a worker on the same
        host share (profiles; across hosts only the middle one means anything).
        """
        timing = self.last_stamps
        if timing is None or not timing[2]:
            return None
        sent, received, (arrived, replied) = timing
        return arrived - sent, replied - arrived, received - replied

    def heads_up(self):
        """Ring now for this thread's request slot if no worker thread watches it: a call that is about to
        validate and encode its request then finds a worker thread awake, not one that the ring sent with
        the request must wake first (``Worker._answer_bell``; a ring for an empty slot starts a watch)."""
        link, doorbell = getattr(self._local, "link", None), self._doorbell  # read once: close() may clear it
        if link is None:
            return
        link.rehearse_reply = False  # an earlier call's heads-up (its request never sent) is not this one's
        if (link.next_token is not None and doorbell is not None and not self.closed
                and link.watch[0] != link.next_token and self.pid == os.getpid()):
            _ring(doorbell, link.ring)
            link.rehearse_reply = self._rehearsals_on

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
            self._close_doorbell()
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
            for link in list(self._links):
                link.close()
            self._links.clear()
        if self.pool is not None:
            self.pool.close()
        self._close_doorbell()

    def _close_doorbell(self):
        doorbell, self._doorbell = self._doorbell, None
        if doorbell is not None:
            doorbell.close()


class _OutputBlock:
    """Reads reply arrays from the request's output block; the block lives as long as they do."""

    def __init__(self, block):
        self.block = block
        if block is not None:
            self.whole = np.frombuffer(block.buffer(), np.uint8)
            weakref.finalize(self.whole, block.release)

    def __call__(self, segment, offset, nbytes):
        block = self.block
        if block is None:
            raise ProtocolError("reply names the pool, but no output block was given")
        start = offset - block.offset if type(offset) is int else -1
        if segment != block.segment or start < 0 or start + nbytes > block.nbytes:
            raise ProtocolError("reply array lies outside the output block")
        return self.whole[start : start + nbytes].data


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
            _connection = _connect_in_process() if execution_mode()["mode"] == "in_process" else _connect()
            if _exit_hook != os.getpid():
                _exit_hook = os.getpid()
                atexit.register(_close_at_exit)
        return _connection


def heads_up():
    """Tell this process's worker, if it has one already, that a request is on its way
    (:meth:`Connection.heads_up`); connects to nothing."""
    conn = _connection
    if isinstance(conn, Connection):
        conn.heads_up()


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


def _connect_in_process():
    """cuML in this process (a dask-cuda worker, or execution="in_process"); said once in the log."""
    from ..transport.inprocess import InProcess

    mode = execution_mode()
    try:
        conn = InProcess()
    except Exception as exc:  # noqa: BLE001 - any import failure means "no cuML here"
        raise ConfigurationError(f"cuML in this process ({mode['reason']}) is not usable: "
                                 f"{type(exc).__name__}: {exc}; set execution='worker' to use a bridge worker") from exc
    log.info("sklearn-gpu-bridge: cuML %s in this process (pid %d, GPU %s): %s", conn.capabilities.versions.get("cuml"),
             conn.pid, mode["gpu"] or "default", mode["reason"])
    return conn


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
    pool, pool_directory, _ = client_transport(path)
    conn = Connection(
        info, connection_file=path, pool=pool, pool_directory=pool_directory,
        heartbeat_timeout=config["heartbeat_timeout"], process=process,
        array_cache=config["array_cache"], cache_min_bytes=config["cache_min_bytes"],
    )
    reason = conn.capabilities.fallback_reason
    if reason and not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"sklearn-gpu-bridge: running on scikit-learn (CPU): {reason}", RuntimeWarning, stacklevel=4)
    return conn
