"""A worker in another process, over ZeroMQ: arrays as frames, or in the shared-memory pool.

Each thread gets its own DEALER socket (:mod:`.link`); the transport has one pool and one list of
handles waiting to be released. A forked or spawned child (joblib's workers) opens its own transport
to the SAME worker: it finds it through the environment variable that names the connection file.

While a call waits, the transport watches three things and raises :class:`WorkerLost` on the first
that fails: the connection (a worker that dies, SIGKILL included, closes it, which a socket monitor
reports at once), the local worker's process (when this process started it), and the worker's
answers to a ping sent every half second on a socket of its own (a worker that hangs without dying
stops answering; ``heartbeat_timeout`` seconds after its last answer it is declared lost). A worker
busy with a long fit still answers pings, so it is never mistaken for a dead one.
"""

import logging
import os
import subprocess
import threading
import time
import warnings
import weakref
from collections import Counter, deque
from dataclasses import replace

import zmq

from ..config import DEFAULTS
from ..errors import (
    CacheMiss,
    ProtocolError,
    VersionMismatch,
    WorkerLost,
    WorkerUnavailable,
    caller_stacklevel,
    rebuild,
    warning_class,
)
from ..protocol import POOL_INLINE_MAX, PROTOCOL_VERSION, Capabilities, Decoder, Encoder, KnownArrays, Session, new_id
from ..protocol.session import MAX_FRAMES
from ..runtime.connection_file import start_hint
from ..shm import Pool
from . import reply_slot
from .base import Transport
from .fastpath import FastPath, open_doorbell
from .link import Link, dealer
from .pool import OutputBlock, placer

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
POLL_SECONDS = 0.5  # a waiting call wakes up at least this often, and pings the worker this often
ARRAY_CACHE_MODES = ("auto", "on", "off")



class RemoteTransport(FastPath, Transport):
    """A process's way to one worker over ZeroMQ: sockets per thread, one pool, pending releases.

    ``array_cache`` (auto | on | off): arrays of at least ``cache_min_bytes``
    are named by a fingerprint of their content, and one the worker already
    keeps is sent as its key alone (see :class:`protocol.KnownArrays`). ``auto``
    turns it on only when arrays travel as frames: with the pool, one memcpy
    costs less than hashing, while a frame is hashed for its signature anyway
    (docs/performance.md).
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
        self._doorbell = None  # the worker's doorbell socket, where it attached the pool (open_doorbell)
        # request slots of links that are gone: the worker may still write into one (its watch word, a late
        # mark), so each is kept for another thread's requests, never given back to the pool for arrays
        self._spare_request_slots = deque()
        self._rehearsals_on = True  # until one fails (FastPath._watch)
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
            link = self._local.link = Link(self.info, self._spare_request_slots.append)
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
        """Ping now and then, so that a worker that cannot watch this process does not free it; on one socket
        of its own, connected once (a new connection each time would cost a handshake each time)."""
        interval = max(0.05, client_timeout / 4)

        def run():
            sock = None
            try:
                while not self._stop_keepalive.wait(interval):
                    if self.closed or self.pid != os.getpid():
                        return
                    sock = sock or dealer(self.info)
                    if not self._ping_on(sock, timeout=min(5.0, interval)):
                        log.debug("keepalive ping to %s got no answer", self.info.address)
            finally:
                if sock is not None and self.pid == os.getpid():
                    sock.close(linger=0)

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
                self._doorbell = open_doorbell(attached.get("doorbell"))
            capabilities = replace(capabilities, pool=bool(attached.get("pool")),
                                   client_timeout=attached.get("client_timeout"))
        if not capabilities.pool and self.pool is not None:
            self.pool.close()
            self.pool = None
        return capabilities

    def roundtrip(self, header, *, timeout=None):
        """A request that carries no arrays: (reply header, its raw buffers)."""
        return self._roundtrip(header, timeout=timeout)

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
        self._check_size(header["op"], frames)
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
        self._local.timing = (sent, time.monotonic(), reply.get("worker_span"))
        if reply["op"] == "error":
            raise rebuild(reply)
        for module, category, message in reply.get("warnings", ()):
            # the user's line, past the bridge, scikit-learn and joblib
            warnings.warn(message, warning_class(module, category), stacklevel=caller_stacklevel())
        return reply, reply_buffers

    def _check_size(self, op, frames):
        """Refuse, before sending, a message the worker would drop: its header longer than the worker's largest
        frame (the worker closes the connection), or more frames than it reads (dropped unanswered)."""
        capabilities = getattr(self, "capabilities", None)  # None: the hello, which is small
        largest = capabilities.max_frame_bytes if capabilities is not None else None
        if largest is not None and len(frames[1]) > largest:
            raise ProtocolError(f"a {op!r} request's header of {len(frames[1])} bytes is longer than the worker's "
                                f"largest frame ({largest} bytes): pass large values as arrays")
        if len(frames) > MAX_FRAMES:
            raise ProtocolError(f"a {op!r} request of {len(frames)} frames is more than the worker reads "
                                f"({MAX_FRAMES}): send its arrays in several calls")

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
                                 f"request (the worker stopped or was killed; ZeroMQ's {link.drop_event})")
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
        sock = dealer(self.info)
        try:
            return self._ping_on(sock, timeout)
        finally:
            sock.close(linger=0)

    def _ping_on(self, sock, timeout):
        ping_id = self._send_ping(sock)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(left * 1000):
                return False
            pong = self._receive(sock)  # a late answer to an earlier ping is passed over
            if pong is not None and pong[0].get("parent") == ping_id:
                return True
        return False

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

            place = placer(self.pool, blocks)

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
        decoder = Decoder(reply, buffers, read_pool=OutputBlock(out), writeable=True)
        value = decoder.decode(reply.get("payload"))
        self._count("received_", decoder.counts)
        return reply, value, buffers

    def _count(self, prefix, counts):
        with self._stats_lock:
            for where, n in counts.items():
                self.stats[prefix + where] += n

    # ------------------------------------------------------------ what is sent

    @property
    def last_stamps(self):
        """This thread's last request as CLOCK_MONOTONIC stamps: (sent, received, worker's [arrived, replied])."""
        timing = getattr(self._local, "timing", None)
        return timing

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

