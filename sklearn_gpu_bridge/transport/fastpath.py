"""The fast path to a worker on this host: replies read from the pool, requests rung in.

Through ZeroMQ a reply wakes three sleeping threads on its way. A client on the worker's host that
shares a memfd pool with it can do better: the worker writes each reply into a *reply slot* of the
pool, which the calling thread watches for a moment (:meth:`FastPath._watch`), and after a reply the
worker watches the thread's *request slot* for its next request, or waits for a ring of its
*doorbell*, a Unix datagram socket (:func:`ring_doorbell`). The ZeroMQ copy of each message still
goes, and whichever comes second is dropped. :mod:`.reply_slot` is the layout of the slots;
docs/performance.md gives the figures behind these choices.
"""

import logging
import os
import socket
import stat
import time

from ..config import get_setting
from ..errors import ConfigurationError, ProtocolError
from . import rehearsal, reply_slot

log = logging.getLogger(__name__)

SPIN_SECONDS = 0.01  # a call watches its reply slot this long, then sleeps on the socket
SPIN_MIN_CPUS = 4  # "auto" spins only on hosts with at least this many cores (the worker's threads need some)
REPLY_WAITS = ("auto", "spin", "sleep")



class HeldCopy:
    """The ZeroMQ copy of a request written into its request slot, held back until the worker marks the
    request there (transport.reply_slot): sent where it was not taken, or no mark came in time."""

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


def ring_doorbell(doorbell, ring):
    """Ring the worker's doorbell (a Unix datagram socket) for a request slot: never waits, never signals (a
    worker gone, a full queue: the ZeroMQ copy counts)."""
    try:
        doorbell.send(ring, RING_FLAGS)
    except OSError:
        pass


# an int: flags' | is Python code; neither flag is on Windows (where no doorbell is rung), which imports this too
RING_FLAGS = int(getattr(socket, "MSG_DONTWAIT", 0) | getattr(socket, "MSG_NOSIGNAL", 0))


def open_doorbell(path):
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


class FastPath:
    """The fast path's part of :class:`~.remote.RemoteTransport`: request slots, watching reply slots,
    heads-ups. Uses the transport's ``pool``, ``capabilities``, ``session``, ``client_id``, ``_local``."""

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
        (:meth:`.link.Link.send`); sent meanwhile unless the worker marks the request taken, and before this
        returns without a reply (a request that comes back with its reply in the slot was taken). ``link``:
        whose ZeroMQ copies of earlier replies are dropped meanwhile (:meth:`.link.Link.drop_copies`), in the time
        that waiting has to spare; a ZeroMQ socket keeps the order of messages, so they come before this
        reply's own copy, which is never dropped here. ``rehearse``: the call rang a heads-up (the worker had
        been idle, and so had this thread's reply steps): a rehearsal of those steps comes first, while the
        worker runs the request (transport.rehearsal); one that fails turns them off (said once).
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

    def heads_up(self):
        """Ring now for this thread's request slot if no worker thread watches it: a call that is about to
        validate and encode its request then finds a worker thread awake, not one that the ring sent with
        the request must wake first (the worker's ``_answer_bell``; a ring for an empty slot starts a watch)."""
        link, doorbell = getattr(self._local, "link", None), self._doorbell  # read once: close() may clear it
        if link is None:
            return
        link.rehearse_reply = False  # an earlier call's heads-up (its request never sent) is not this one's
        if (link.next_token is not None and doorbell is not None and not self.closed
                and link.watch[0] != link.next_token and self.pid == os.getpid()):
            ring_doorbell(doorbell, link.ring)
            link.rehearse_reply = self._rehearsals_on

