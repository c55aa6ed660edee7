"""The worker's clients: who they are, what each holds, and freeing what a gone client left.

A client is one connection of one process (its random id). It may hold
handles (fitted estimators), arrays the worker keeps for it, queued work, and
an attachment of its shared-memory pool. A pool is attached only once the
client proved it is its own: at hello the worker writes a random nonce into
the pool's handshake area, and only a process that maps the pool can read it
back (op ``attach``). That also proves the client's pid (the pool is open in
that process), so its death is seen at once. Once a second the worker frees
what a gone client left behind: a watched client when its process is gone,
any other after ``client_timeout`` seconds without a message or an answer
(the client pings while it is idle, to stay). Work waiting in the queue does
not keep a client: one that sent nothing for ``client_timeout`` seconds (a
live client pings while it waits for a reply) has its queued work dropped,
and is freed once its running request is answered.

The worker also counts the bytes of each client's replies that ZeroMQ still
holds (sent, not yet written to the client's connection): a client that does
not read its replies gets no more work run until it does (:meth:`Clients.ready`).
"""

import hmac
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.runtime.private_files import process_start
from sklearn_gpu_bridge.shm import PoolAttachment, PoolError

log = logging.getLogger("sklearn_gpu_bridge.worker")
CHALLENGE_SECONDS = 30.0  # a pool challenge not answered by then is dropped
#: bytes of a client's replies the worker may hold unread before that client's next request waits
UNREAD_REPLY_BYTES = 64 << 20


@dataclass
class ClientState:
    """What the worker knows of one client."""

    last_seen: float  # its last message, or the last answer to it
    last_message: float  # its last message
    pid: int | None = None
    started: bytes | None = None  # the pid's start time, once the client proved its pid
    pool: str | None = None  # the name of the pool it attached
    challenge: tuple | None = None  # (attachment, nonce, pid, when) between hello and attach
    inflight: int = 0  # work requests submitted and not yet answered
    freed: bool = False  # its handles were freed (again later for results of requests then in flight)
    replies: list = field(default_factory=list)  # (tracker, bytes) of its large replies ZeroMQ may still hold


class Clients:
    """client id -> ClientState, and the pools they attached; safe from the loop and executor threads."""

    def __init__(self, handles, array_cache, pool_dirs, client_timeout, on_free=None, pinning=None):
        self.handles = handles
        self.array_cache = array_cache
        self.on_free = on_free  # called with a client id when it is freed (its queued work is dropped)
        self.pool_dirs = pool_dirs  # where clients' pool files may be found (never a folder a request names)
        self.client_timeout = client_timeout
        self.pinning = pinning  # pools' segments are page-locked with it (pinning.py), or None
        self.pools = {}  # pool name -> PoolAttachment
        self.swept = Counter()  # clients freed by the sweep, by reason: gone, idle
        self._states = {}
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._states)

    def get(self, client):
        with self._lock:
            return self._states.get(client)

    def seen(self, client, working):
        """Note a message of ``client``; returns its state (None for a message without a client)."""
        if client is None:
            return None
        with self._lock:
            state = self._states.get(client)
            if state is None:
                state = self._states[client] = ClientState(time.monotonic(), time.monotonic())
            state.last_seen = state.last_message = time.monotonic()
            if working:
                state.inflight += 1
            return state

    def answered(self, state):
        """A work request of this client was answered (or dropped): its silence counts from now, not from the
        question (for its handles; its queued work goes after a silence of its own messages, :meth:`sweep`)."""
        if state is not None:
            with self._lock:
                state.inflight -= 1
                state.last_seen = time.monotonic()

    def replied(self, state, tracker, nbytes):
        """A reply of ``nbytes`` went to this client's connection; ``tracker`` is done once ZeroMQ let it go."""
        if state is not None:
            with self._lock:
                state.replies.append((tracker, nbytes))

    def ready(self, client):
        """Whether ``client``'s next request may start: the worker holds less than :data:`UNREAD_REPLY_BYTES` of
        its replies (a client that reads them never waits here)."""
        with self._lock:
            state = self._states.get(client)
            return state is None or _unread(state) < UNREAD_REPLY_BYTES

    # ------------------------------------------------------------ pools

    def challenge(self, client, described, pid):
        """The handshake slot of the client's pool that now holds a nonce, or None if no pool is found.

        The pool is looked for where the client says it is (a memfd of its pid,
        or a file in the worker's own pool folders: never a path a request
        names); it is attached only when :meth:`attach` gets the nonce back.
        """
        try:
            attachment = PoolAttachment(described, self.pool_dirs, pinning=self.pinning)
            slot, nonce = attachment.challenge()
        except PoolError as exc:
            log.info("client %s: %s; arrays go as frames", client, exc)
            return None
        with self._lock:
            self._states[client].challenge = (attachment, nonce, pid, time.monotonic())
        return slot

    def attach(self, client, nonce):
        """(attached, watched): attach the pool whose nonce ``client`` read back; watch its pid if proven."""
        with self._lock:
            state = self._states.get(client)
            pending, state.challenge = (state.challenge, None) if state is not None else (None, None)
        if pending is None:
            raise ProtocolError("attach: no pool challenge is pending for this client")
        attachment, expected, pid, _ = pending
        if not isinstance(nonce, bytes) or not hmac.compare_digest(nonce, expected):
            attachment.close()
            log.warning("client %s: wrong pool nonce (a pool that is not its own?); arrays go as frames", client)
            return False, False
        self._keep(state, attachment, pid)
        return True, state.started is not None

    def adopt(self, client, described, pid):
        """Attach the pool of ``client`` that its front already proved (:mod:`.front`); watch ``pid`` where the pool
        proves it here too. True if attached."""
        state = self.seen(client, working=False) if isinstance(client, str) else None
        if state is None:
            raise ProtocolError("adopt: a client id is needed")
        try:
            attachment = PoolAttachment(described, self.pool_dirs, pinning=self.pinning)
        except PoolError as exc:
            log.warning("client %s: its front attached a pool that this process cannot: %s", client, exc)
            return False
        self._keep(state, attachment, pid if type(pid) is int else None)
        return True

    def _keep(self, state, attachment, pid):
        """The client of ``state`` has attached ``attachment``; its pid is watched where the pool proves it."""
        started = process_start(pid) if pid is not None else None
        proven = pid is not None and (attachment.kind == "memfd" and attachment.pid == pid
                                      or attachment.maps_handshake(pid))
        with self._lock:
            old = self.pools.get(attachment.name)
            self.pools[attachment.name] = attachment
            state.pool = attachment.name
            if started is not None and proven:
                state.pid, state.started = pid, started
        if old is not None and old is not attachment:
            old.close()

    def attachment(self, client, name):
        """The pool a request names, which must be the one its client attached (None: no pool)."""
        if not name:
            return None
        with self._lock:
            state = self._states.get(client)
            attachment = self.pools.get(name) if state is not None and state.pool == name else None
        if attachment is None:
            raise ProtocolError("request names a pool that its client did not attach")
        return attachment

    # ------------------------------------------------------------ freeing

    def sweep(self):
        """Free what clients that are gone left behind; drop the queued work of those silent too long; forget
        clients that hold nothing."""
        now = time.monotonic()
        owners = self.handles.owners()
        with self._lock:
            states = list(self._states.items())
        for client, state in states:
            if state.started is not None:  # watched: freed when its process is gone, however long it is silent
                if process_start(state.pid) != state.started:
                    self.free(client, state, "gone", f"its process {state.pid} is gone")
                continue
            if (self.client_timeout and state.inflight and now - state.last_message > self.client_timeout
                    and self.on_free is not None):
                # work queued keeps no client: a live one pings while it waits; a dead one's queue never runs
                self.on_free(client)
            if not owners.get(client) and state.pool is None and not (
                    self.array_cache is not None and self.array_cache.holds_arrays_of(client)):
                with self._lock:  # holds nothing (a challenge it never answered, at most): forget it
                    pending = state.challenge
                    if state.inflight == 0 and not _unread(state) and (
                            pending is None or now - pending[3] > CHALLENGE_SECONDS):
                        self._states.pop(client, None)
                        state.challenge = None
                    else:
                        pending = None
                if pending is not None:
                    pending[0].close()
            elif self.client_timeout and state.inflight == 0 and now - state.last_seen > self.client_timeout:
                self.free(client, state, "idle", f"no message for {now - state.last_seen:.0f} s")

    def free(self, client, state, reason, why):
        """Release the client's handles, arrays and pool; returns how many handles."""
        if self.on_free is not None:
            self.on_free(client)
        released = self.handles.release_client(client)
        cached = self.array_cache.drop_client(client) if self.array_cache is not None else 0
        name, state.pool = state.pool, None
        removed = self._detach(name, remove_files=reason == "gone") if name else 0
        with self._lock:
            if state.inflight == 0 and not _unread(state):  # else kept: its unread replies still count
                self._states.pop(client, None)
        first, state.freed = not state.freed, True
        if reason != "goodbye" and (first or released or removed or cached):
            self.swept[reason] += first
            log.info("client %s: %s; released %d handle(s) and %d cached array(s), removed %d pool file(s)",
                     client, why, released, cached, removed)
        return released

    def _detach(self, name, remove_files=False):
        """Forget a pool no client uses any more; remove its files (file pools) if its owner is dead."""
        with self._lock:
            if any(state.pool == name for state in self._states.values()):
                return 0
            attachment = self.pools.pop(name, None)
        if attachment is None:
            return 0
        attachment.close()
        if not remove_files or attachment.directory is None:
            return 0
        removed = 0
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

    def close(self):
        for pool in self.pools.values():
            pool.close()


def _unread(state):
    """Bytes of ``state``'s replies that ZeroMQ still holds (under the lock); forgets those it let go."""
    if not state.replies:
        return 0
    state.replies = [(tracker, nbytes) for tracker, nbytes in state.replies if not tracker.done]
    return sum(nbytes for _, nbytes in state.replies)
