"""The same-host fast path: requests and replies through the client's own memfd pool.

A client on this host names, in each request, a block of its pool for the
reply (``reply_slot``) and one for its next request (``next_slot``), see
:mod:`sklearn_gpu_bridge.transport.reply_slot`. The worker writes each reply
into its reply slot as well as sending it through ZeroMQ (:meth:`FastPath._publish`).
A thread that has answered then watches the client's request slot for a
moment while it has nothing else to do (:meth:`FastPath._follow`): the next
request may come that way, past the sleeping reader. After the watch the slot
stays armed, and a client that writes its next request there later rings the
worker's doorbell, a datagram socket that the reader polls beside the ZeroMQ
one (:meth:`FastPath._answer_bell`): one thread is woken, where ZeroMQ wakes
three. The worker marks each request it reads from a slot (taken or not), and
the client sends the same request through ZeroMQ only where it was not taken.
While it waits for a request announced by a heads-up, a thread walks a
made-up request's steps (:mod:`sklearn_gpu_bridge.transport.rehearsal`), so
that the real one finds them warm.

Nothing read from a slot or the doorbell is trusted: a ring only names a slot
among the armed ones, and what a slot holds is read as any message
(:meth:`Worker._accept`: signature, time, replay, and it must be the slot's
client's request).
"""

import contextlib
import logging
import os
import socket
import threading
import time

from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.protocol.session import message_waits
from sklearn_gpu_bridge.runtime.private_files import doorbell_path
from sklearn_gpu_bridge.transport import rehearsal, reply_slot

from .backends import checked_finite
from .caught_warnings import caught_warnings

log = logging.getLogger("sklearn_gpu_bridge.worker")

MAX_ARMED = 1024  # request slots armed for the doorbell at once (a client has one per thread); the oldest go
ARMED_SECONDS = 600.0  # an armed slot that no ring has named for this long goes (its thread is idle or gone)
RINGS_IN_TURN = 256  # rings the reading thread takes in one turn before it looks at its socket again


def open_doorbell(worker_socket):
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


class FastPath:
    """The fast path's part of :class:`.server.Worker` (a mixin: it uses the worker's clients, queue, counts,
    socket lock and :meth:`_accept`)."""

    def _init_fast_path(self):
        self.doorbell = None  # (path, socket): the datagram socket clients on this host ring (_answer_bell)
        self._armed = {}  # ring -> (identity, slot, armed at, heads-up watched): slots a ring may name (_arm)
        self._armed_lock = threading.Lock()
        self._rehearsal = rehearsal.Rehearsal()  # the reading thread's; None once one has failed

    # ------------------------------------------------------------ replies

    def _publish(self, header, frames):
        """Write the reply into the block of its client's memfd pool that the request names (``reply_slot``),
        where that client may be watching for it; ZeroMQ carries it as well.

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

    # ------------------------------------------------------------ watching a request slot

    def _follow(self, item):
        """After a reply: watch the block its request named as ``next_slot`` for the client's next request,
        while no other request runs or waits, for up to ``watch_ms``.

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

    # ------------------------------------------------------------ armed slots and the doorbell

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

    def _disarm_client(self, client):
        """Forget every slot of a freed client."""
        with self._armed_lock:
            for ring in [ring for ring, (_, slot, *_) in self._armed.items() if slot["client"] == client]:
                del self._armed[ring]

    def _answer_bell(self):
        """Rings came: take the requests that the slots they name hold now; True if one was queued as work.

        A ring is a datagram that names a slot (``reply_slot.ring_of``), from anyone who may write to the
        socket: it is only looked up among the armed slots, and what such a slot holds is read as any message
        is (:meth:`_accept`). A ring for an armed slot that holds nothing yet is a heads-up
        (``Connection.heads_up``): this thread watches the slot as :meth:`_follow` does, for ``watch_ms`` at
        most, and gives way to any message or ring.
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

    def _reader_gives_way(self):
        """A heads-up's watch, on the reader's thread, gives way to any other request and to any input."""
        return self.queue.busy() or self._input_waiting()

    def _input_waiting(self):
        """Whether a message or a ring waits for the reader: a watch on the reader's thread gives way to it."""
        with self._router_lock:
            if self.router.closed or message_waits(self.router):
                return True
        return bool(self._bell_waiting.poll(0))

    # ------------------------------------------------------------ rehearsals

    def _rehearse(self, stop):
        """Walk a request's steps on a made-up one (transport.rehearsal), in the context a request runs in,
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
