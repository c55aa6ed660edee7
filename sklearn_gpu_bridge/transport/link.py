"""One thread's ZeroMQ sockets to a worker: requests, a monitor of the connection, and pings.

Each thread of a client has its own DEALER (ZeroMQ sockets are not thread-safe); the link also keeps
the pool block where the worker may watch for this thread's next request (:mod:`.fastpath`).
"""

import os
import threading

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..config import get_setting
from ..errors import ProtocolError
from ..protocol.session import message_waits
from ..runtime.keys import secure
from . import reply_slot
from .fastpath import HeldCopy, ring_doorbell


def dealer(info, connect=True):
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


def _event_name(event):
    try:
        return zmq.Event(event).name
    except ValueError:
        return f"event {event}"


class Link:
    """One thread's sockets: requests, a monitor of the connection, and (when needed) pings; and the block of
    the pool where the worker may watch for this thread's next request (transport.reply_slot)."""

    def __init__(self, info, retire_slot):
        self.info = info
        self.retire_slot = retire_slot  # where the request slot goes when the link does (never back to the pool)
        self.socket = dealer(info, connect=False)
        # its own name, kept when ZeroMQ connects it again (the worker hands the name over to the new
        # connection): a request the worker read from this thread's request slot is answered to it, not to a
        # connection that is gone. Random, never sent to anyone, and not starting with 0 (ZeroMQ's own)
        self.socket.routing_id = b"\x01" + os.urandom(15)
        self.events = self.socket.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        self._proven = False  # the current connection finished its handshake: it may carry messages
        self.drop_event = None  # the monitor event by which the last look found the connection dropped
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
        dropped), unless held: with ``hold`` and a doorbell, that copy is returned as a :class:`~.fastpath.HeldCopy`,
        sent only where the worker does not mark the request taken (:meth:`.fastpath.FastPath._watch`); else None.
        """
        token, self.next_token = self.next_token, None
        if token is not None and len(frames) == 2:  # a request whose arrays lie in the pool
            memory = self.request_slot.buffer()
            if reply_slot.write(reply_slot.request_room(memory), token, frames) and doorbell is not None:
                if self.watch[0] != token:
                    ring_doorbell(doorbell, self.ring)
                if hold:
                    return HeldCopy(self, frames, token, memory)
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
        A connection closed before its handshake finished (a TCP worker closes the
        oldest when too many are in flight: a flood) carried no message: what waits
        is sent on the next connection, which ZeroMQ makes at once; not a loss. A
        handshake the worker refused (credentials that do not match) is one.
        """
        dropped, self.drop_event = False, None
        while message_waits(self.events):
            event = recv_monitor_message(self.events)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._proven = True
            elif event == zmq.EVENT_DISCONNECTED:
                dropped |= self._proven
                self._proven = False
            else:  # a refused connect, refused credentials
                dropped = True
            if dropped and self.drop_event is None:
                self.drop_event = _event_name(event)  # what the error names
        return dropped

    def ping_socket(self):
        if self.pinger is None:
            self.pinger = dealer(self.info)
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
