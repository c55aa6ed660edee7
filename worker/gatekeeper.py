"""Who may open a connection to the worker at all: the ZAP handler, and the handshakes in flight.

ZeroMQ asks the ZAP handler about every new connection on a PLAIN or CURVE
socket, during the handshake, before the peer can deliver a single message:
a peer without the credentials (:mod:`sklearn_gpu_bridge.runtime.keys`)
costs the worker a refused handshake, never a parsed message. pyzmq's own
authenticator does the protocol; this one compares passwords in constant
time, allows the CurveZMQ keys it is given, and counts refusals.

Before the ZAP handler hears of it, a connection costs what ZeroMQ buffers
of its handshake: at most one frame (the socket's ``maxmsgsize``, small on
TCP) and its buffers. :class:`Handshakes` bounds how many connections may
be at that stage at once, so that what a peer without the key can make the
worker hold is bounded too: beyond ``limit`` connections that have not
finished their handshake, the oldest are closed.
"""

import hmac
import logging
import socket
import struct
import threading
import time
from collections import Counter

import zmq
from zmq.auth.thread import ThreadAuthenticator

from sklearn_gpu_bridge.protocol.session import message_waits
from sklearn_gpu_bridge.runtime.keys import PLAIN_USER

log = logging.getLogger("sklearn_gpu_bridge.worker")
DOMAIN = "sklearn-gpu-bridge"  # the ZAP domain of the worker's socket


class _AllowList:
    """pyzmq's CURVE credentials provider: is this client key allowed?"""

    def __init__(self, keys):
        self.keys = frozenset(keys)

    def callback(self, domain, key):
        return key in self.keys


class Gatekeeper(ThreadAuthenticator):
    """ZAP in a thread of the worker's context: PLAIN with one password, or CURVE with an allow-list."""

    def __init__(self, context, *, password=None, curve_keys=()):
        super().__init__(context, log=log.getChild("zap"))
        self.password = password
        self.curve_keys = curve_keys
        self.refused = Counter()

    def start(self):
        super().start()
        if self.curve_keys:
            self.configure_curve_callback(domain=DOMAIN, credentials_provider=_AllowList(self.curve_keys))
        return self

    def _authenticate_plain(self, domain, username, password):
        ok = username == PLAIN_USER.decode() and hmac.compare_digest(password.encode(), self.password)
        return ok, b"OK" if ok else b"Invalid credentials"

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
        if status_code != b"200":
            self.refused["handshake"] += 1
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


#: bytes a server sends in a handshake before the peer has proven it holds the credentials (ZMTP 3: the 64-byte
#: greeting; in CURVE also the 170-byte WELCOME, which PLAIN sends only once the password was accepted); once it has
#: sent more, the peer is in (or refused, and the connection closes)
BEFORE_PROOF = {"plain": 64, "curve": 64 + 170}
#: bytes an honest peer sends before its handshake ends (greeting, HELLO, INITIATE: under 1 KiB); a connection that
#: has sent more without finishing it holds a frame in the worker's memory and is closed at once
HONEST_HANDSHAKE_BYTES = 4096
LOOK_SECONDS = 0.05  # how often the connections in handshake are looked at
EVENTS_IN_TURN = 1024  # events read before the connections are looked at again (a flood of connections)


class Handshakes(threading.Thread):
    """Watch a bound TCP socket's connections (monitor events), and close those that hold memory before their
    handshake: beyond ``limit`` connections in handshake the oldest, and any that has sent more than an honest
    handshake does.

    A connection is known by its descriptor (``ACCEPTED``, ``DISCONNECTED``) and checked with TCP_INFO: what the
    worker has sent it says whether its peer has proven itself (:data:`BEFORE_PROOF`), what it has received how
    much it holds. Only a descriptor that still is the connection seen accepted (its two addresses), and still
    has not proven itself, is ever shut down (looked at again just before);
    ZeroMQ then closes it as it closes any connection its peer dropped. ``seconds``: ZeroMQ's own limit on a
    handshake; a connection older than that has finished it, or is gone.
    """

    def __init__(self, router, mechanism, *, limit, seconds):
        super().__init__(name="sgb-handshakes", daemon=True)
        address = f"inproc://handshakes-{id(self)}"
        router.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.events = router.context.socket(zmq.PAIR)
        self.events.rcvhwm = 0  # before connect: a busy watch must never make ZeroMQ's thread wait for it
        self.events.connect(address)
        self.before_proof = BEFORE_PROOF[mechanism]
        self.limit, self.seconds = limit, seconds
        # connections closed, by reason (status: refused); every key there from the start: read from other threads
        self.closed = Counter({"handshakes_in_flight": 0, "handshake_too_long": 0})
        self._open = {}  # fd -> (accepted at, its two addresses) of connections in handshake, in the order accepted
        self._stopping = threading.Event()

    @staticmethod
    def available():
        return hasattr(socket, "TCP_INFO")

    def stop(self):
        self._stopping.set()
        if self.is_alive():  # never started where the bind failed
            self.join(timeout=5)

    def run(self):
        try:
            while not self._stopping.is_set():
                if self.events.poll(LOOK_SECONDS * 1000 if self._open else 1000):
                    for _ in range(EVENTS_IN_TURN):
                        if not message_waits(self.events):
                            break
                        self._event(self.events.recv_multipart())
                if self._open:
                    self._look()
        except zmq.ZMQError:  # the context went away under the watch: the worker is stopping
            pass
        except Exception:  # noqa: BLE001 - the gate's limit must not die silently
            log.exception("the watch of connections in handshake failed")
        finally:
            self.events.close(linger=0)

    def _event(self, frames):
        event, fd = struct.unpack("=hi", frames[0])
        self._open.pop(fd, None)
        if event == zmq.EVENT_ACCEPTED:
            names = _addresses(fd)
            if names is not None:  # gone already: its DISCONNECTED follows
                self._open[fd] = (time.monotonic(), names)

    def _look(self):
        now = time.monotonic()
        waiting = []
        for fd, (accepted, names) in list(self._open.items()):
            sent, received = _tcp_bytes(fd, names)
            # not that connection any more; or done: its peer is in, or it is older than ZeroMQ lets a handshake be
            if sent is None or sent > self.before_proof or now - accepted > self.seconds + 1:
                self._open.pop(fd, None)
            elif received > HONEST_HANDSHAKE_BYTES:
                self._close(fd, names, "handshake_too_long")
            else:
                waiting.append(fd)
        for fd in waiting[: max(0, len(waiting) - self.limit)]:
            self._close(fd, self._open[fd][1], "handshakes_in_flight")

    def _close(self, fd, names, reason):
        if _shutdown(fd, names, self.before_proof):
            self.closed[reason] += 1
        self._open.pop(fd, None)


def _with_socket(fd, use):
    """``use(sock)`` on a socket object over ``fd`` that never closes it; None where ``fd`` is no socket now."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        return use(sock)
    except OSError:
        return None
    finally:
        sock.detach()


def _addresses(fd):
    return _with_socket(fd, lambda sock: (sock.getsockname(), sock.getpeername()))


def _tcp_bytes(fd, names):
    """(bytes sent, bytes received) of connection ``fd`` from TCP_INFO; (None, None) where ``fd`` is not the
    connection of those ``names`` any more."""

    def read(sock):
        if (sock.getsockname(), sock.getpeername()) != names:
            return None
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        if len(info) < 136:  # a kernel before 4.1: no byte counts
            return None
        acked, received = struct.unpack_from("=QQ", info, 120)  # tcpi_bytes_acked, tcpi_bytes_received
        sent = struct.unpack_from("=Q", info, 200)[0] if len(info) >= 208 else acked  # tcpi_bytes_sent (4.19)
        return max(sent, acked), received

    return _with_socket(fd, read) or (None, None)


def _shutdown(fd, names, before_proof):
    """Shut the connection down (ZeroMQ sees its peer go, and closes it) if ``fd`` still is that connection, and
    its peer still has not proven itself (it may have, since it was looked at)."""
    sent, _ = _tcp_bytes(fd, names)
    if sent is None or sent > before_proof:
        return False
    return bool(_with_socket(fd, lambda sock: sock.shutdown(socket.SHUT_RDWR) or True))
