"""What every worker process that clients reach has: its address and who may reach it, its connection file, and
when it stops by itself.

:class:`~.server.Worker` (a backend in this process) and :class:`~.front.Front` (a worker process per GPU behind
one address) are both Listeners. A peer without the credentials of the address
(:mod:`sklearn_gpu_bridge.runtime.keys`) is refused during ZeroMQ's handshake (:mod:`.gatekeeper`); a frame
longer than the socket's largest closes the connection (on TCP, where peers without the key connect, 1 MiB:
what one handshake may make the worker hold, and a bounded number of handshakes are in flight at once).
"""

import ipaddress
import logging
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import zmq

from sklearn_gpu_bridge.config import WORKER_DEFAULTS
from sklearn_gpu_bridge.errors import ConfigurationError
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Session, new_id
from sklearn_gpu_bridge.protocol.session import MAX_FRAMES
from sklearn_gpu_bridge.runtime.connection_file import (
    ConnectionInfo,
    new_key,
    prepare_folder_of,
    read_key_file,
    signing_key,
    start_lock_path,
    write_connection_file,
)
from sklearn_gpu_bridge.runtime.keys import bind_hint, derived_client_pair, load_public, load_secret, plain_password
from sklearn_gpu_bridge.runtime.private_files import ExclusiveLock, pid_alive, socket_path

from .gatekeeper import DOMAIN, Gatekeeper, Handshakes

log = logging.getLogger("sklearn_gpu_bridge.worker")

SWEEP_SECONDS = 1.0
HWM = 16  # messages queued per peer socket, each way (an honest client has one request in flight per socket)
HANDSHAKE_SECONDS = 5  # a connection that has not authenticated by then is closed
#: the largest frame on TCP, where peers without the key may connect: what ZeroMQ buffers of one handshake, at most
#: (clients split longer arrays and blobs into frames of this size; max_frame_mb may only lower it)
TCP_FRAME_BYTES = 1 << 20
FRAME_ENVELOPE = 256  # bytes a frame may exceed max_frame_bytes by on the wire: CurveZMQ's box around a message
HANDSHAKES = 32  # TCP connections in handshake at once, at most: beyond it the oldest are closed (gatekeeper)
MAX_WATCH_MS = 60_000.0  # a longer watch of a request slot is refused (see config.WORKER_DEFAULTS["watch_ms"])


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_settings(*, bind=WORKER_DEFAULTS["bind"], key=None, key_file=None, curve_secret_key=None,
                   curve_allow=None, watch_ms=WORKER_DEFAULTS["watch_ms"], threads=WORKER_DEFAULTS["threads"]):
    """(hex key, CurveZMQ keys or None, allowed client keys), or ConfigurationError saying what to change.

    Called before the backend warms up, so that a refusal comes at once.
    """
    if not 0 <= float(watch_ms) <= MAX_WATCH_MS:  # NaN too: a watch that never ends keeps a core busy
        raise ConfigurationError(f"watch_ms must be a number of milliseconds from 0 to {MAX_WATCH_MS:g}, "
                                 f"not {watch_ms!r}")
    if int(threads) < 0:
        raise ConfigurationError(f"threads must be 0 (4 calls at once on one GPU, 8 on each of several) or more, "
                                 f"not {threads!r}")
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


def read_message(sock, refused):
    """The next message's frames on ``sock``, read one by one; None when it has more than ``MAX_FRAMES`` (the rest
    is dropped unread, and counted in ``refused``)."""
    frames = [sock.recv(copy=False)]
    while frames[-1].more:
        if len(frames) > MAX_FRAMES:
            while sock.getsockopt(zmq.RCVMORE):
                sock.recv(copy=False)
            refused["too_many_frames"] += 1
            return None
        frames.append(sock.recv(copy=False))
    return frames


def raise_file_limit():
    """Open files up to the hard limit: connections are files, and a flood of them must not starve honest ones."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ImportError, ValueError, OSError):
        log.debug("could not raise the open-file limit", exc_info=True)


class Listener:
    """The ROUTER socket clients reach, its gate, the connection file, and the watch of the parent and of idleness.

    A subclass calls :meth:`_listen` in its ``__init__``, :meth:`_open_router` and :meth:`_announce` in its
    ``start``, :meth:`_catch_signals` and then :meth:`_should_stop` about once a second in its ``serve_forever``,
    :meth:`_close_gates` in its ``close``, and says whether it is busy (:meth:`_busy`).
    """

    def _listen(self, *, connection_file, parent_pid, key, bind, port, key_file, curve_secret_key, curve_allow,
                watch_ms, threads, max_frame_mb, idle_exit, worker_id=None):
        self.key, self.curve, self.curve_allowed = check_settings(
            bind=bind, key=key, key_file=key_file, curve_secret_key=curve_secret_key, curve_allow=curve_allow,
            watch_ms=watch_ms, threads=threads)
        self.host, self.port = bind, port
        self.connection_file = connection_file
        self.parent_pid = parent_pid
        self.idle_exit = float(idle_exit or 0)
        self.last_message = time.monotonic()
        self.worker_id = worker_id or new_id()
        self.session = Session(bytes.fromhex(self.key), me=self.worker_id)
        self.max_frame_bytes = int(max_frame_mb * (1 << 20))
        if bind != "ipc":  # peers without the key reach TCP: what a handshake may hold stays small
            self.max_frame_bytes = min(self.max_frame_bytes, TCP_FRAME_BYTES)
        if connection_file:  # refused now, before the backend warms up, if others may write where it goes
            prepare_folder_of(connection_file)
        self.started = time.time()
        self.refused = Counter()  # messages dropped before their signature: too many frames
        self._dropped_logged_at, self._dropped_unlogged = -1e9, 0
        self._stopping = threading.Event()
        self.context = zmq.Context()
        self.gatekeeper = self.handshakes = self.address = self.curve_public = self.socket_path = None

    def _open_router(self, hwm=HWM):
        """The ROUTER socket clients reach, bound (:meth:`_bind`); ``hwm``: messages queued per peer, each way."""
        raise_file_limit()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.router_handover = 1  # a client link connected again keeps its name (client._Link)
        self.router.maxmsgsize = self.max_frame_bytes + FRAME_ENVELOPE
        self.router.sndhwm = self.router.rcvhwm = hwm
        self.router.handshake_ivl = HANDSHAKE_SECONDS * 1000
        self._bind()

    def _bind(self):
        """ipc in this user's private folder; TCP behind PLAIN (loopback) or CurveZMQ with an allow-list."""
        if self.host == "ipc":
            self.socket_path = socket_path(f"worker-{new_id()[:16]}.sock")
            self.address = f"ipc://{self.socket_path}"
            self.router.bind(self.address)
            return
        self.gatekeeper = Gatekeeper(self.context, password=plain_password(bytes.fromhex(self.key), self.worker_id),
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
        if Handshakes.available():  # before bind: no connection is accepted unseen
            self.handshakes = Handshakes(self.router, "plain" if self.curve is None else "curve",
                                         limit=HANDSHAKES, seconds=HANDSHAKE_SECONDS)
        if self.port:
            self.router.bind(f"tcp://{host}:{self.port}")
        else:
            self.port = self.router.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{self.port}"
        if self.handshakes is not None:
            self.handshakes.start()

    def _announce(self, backend_name, pid):
        """Write the connection file (which means: ready)."""
        self.info = ConnectionInfo(
            address=self.address, key=self.key, protocol_version=PROTOCOL_VERSION, pid=pid,
            backend=backend_name, worker_id=self.worker_id, curve_server_key=self.curve_public,
        )
        if self.connection_file:
            write_connection_file(self.connection_file, self.info)
        log.info("worker ready on %s (backend %s, pid %d)", self.address, backend_name, pid)

    def _catch_signals(self):
        """SIGINT and SIGTERM stop this worker cleanly (where this is the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self._stopping.set())

    def _should_stop(self):
        """Whether the parent is gone or ``idle_exit`` seconds passed without clients (then the connection file
        is removed already); asked about once a second."""
        if self.parent_pid and not pid_alive(self.parent_pid):
            log.info("parent process %d is gone; stopping", self.parent_pid)
            return True
        return bool(self.idle_exit) and self._stopped_for_idleness()

    def _pack_error(self, reply):
        """An error reply's frames (``reply``: its fields); args too odd to send go as the message alone."""
        try:
            return self.session.pack(reply)
        except Exception:  # noqa: BLE001 - e.g. args too odd to pickle: send the text alone
            reply.update(args=(reply["message"],), mro=[("builtins", "Exception")])
            return self.session.pack(reply)

    def _refusals(self):
        """Messages refused so far, by reason: by the session, the reader, the gate and the handshake watch."""
        return dict(self.session.refused + self.refused
                    + (self.gatekeeper.refused if self.gatekeeper else Counter())
                    + (self.handshakes.closed if self.handshakes else Counter()))

    def _log_dropped(self, exc):
        """One warning per second at most: a flood of bad messages must not flood the log too."""
        now = time.monotonic()
        self._dropped_unlogged += 1
        if now - self._dropped_logged_at >= 1.0:
            more = self._dropped_unlogged - 1
            log.warning("dropped a message: %s%s", exc, f" (and {more} more since the last report)" if more else "")
            self._dropped_logged_at, self._dropped_unlogged = now, 0

    def _busy(self):
        """Whether a client or its work keeps this worker (idle_exit waits while it does)."""
        raise NotImplementedError

    def _idle(self):
        return not self._busy() and time.monotonic() - self.last_message > self.idle_exit

    def _stopped_for_idleness(self):
        """After ``idle_exit`` s with no client and no message: stop, under the connection file's start lock
        (a client holds it from finding this worker until it has connected), the file removed first."""
        if not self._idle():
            return False
        if not self.connection_file:
            log.info("no client for %.0f s; stopping", self.idle_exit)
            return True
        try:
            with ExclusiveLock(start_lock_path(self.connection_file), 0, "the start lock"):
                if not self._idle():
                    return False  # a client came while the lock was taken
                log.info("no client for %.0f s; stopping", self.idle_exit)
                Path(self.connection_file).unlink(missing_ok=True)
                return True
        except TimeoutError:
            return False  # a client is finding this worker: look again in a second

    def _close_gates(self, *paths):
        """Stop the gate's threads; remove the connection file, the ipc socket's file and ``paths``."""
        if self.handshakes is not None:
            self.handshakes.stop()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
        for path in (self.connection_file, self.socket_path, *paths):
            if path:
                Path(path).unlink(missing_ok=True)
