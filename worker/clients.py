"""The worker's clients: who they are, what each holds, and freeing what a gone client left.

A client is one connection of one process (its random id). It may hold
handles (fitted estimators), arrays the worker keeps for it, and a mapping of
its shared-memory pool. Once a second the worker frees what a client left
behind when that client is gone: a client on this host proves its pid at
hello (the pool file it names is mapped in that process), so its death is
seen at once; any other client is freed after ``client_timeout`` seconds
without a message (the client pings while it is idle, to stay).
"""

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.host import process_start
from sklearn_gpu_bridge.shm import PoolAttachment, PoolError

log = logging.getLogger("sklearn_gpu_bridge.worker")


@dataclass
class ClientState:
    """What the worker knows of one client."""

    last_seen: float
    pid: int | None = None
    started: bytes | None = None  # the pid's start time, once the client proved its pid
    pool: str | None = None  # the name of the pool it attached
    inflight: int = 0  # work requests submitted and not yet answered
    freed: bool = False  # its handles were freed (again later for results of requests then in flight)


def maps_file(pid, name):
    """Whether process ``pid`` has a file whose name contains ``name`` mapped (Linux)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return name.encode() in f.read()
    except OSError:
        return False


class Clients:
    """client id -> ClientState, and the pools they attached; safe from the loop and executor threads."""

    def __init__(self, handles, array_cache, pool_dirs, client_timeout):
        self.handles = handles
        self.array_cache = array_cache
        self.pool_dirs = pool_dirs  # where clients' pool files may be found (never a folder a request names)
        self.client_timeout = client_timeout
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
                state = self._states[client] = ClientState(time.monotonic())
            state.last_seen = time.monotonic()
            if working:
                state.inflight += 1
            return state

    def answered(self, state):
        """A work request of this client was answered: silence counts from now, not from the question."""
        if state is not None:
            with self._lock:
                state.inflight -= 1
                state.last_seen = time.monotonic()

    # ------------------------------------------------------------ pools

    def attach_pool(self, client, pool, pid):
        """(attached, watched): map the client's pool if this host sees it; prove its pid if it can.

        The client names its pool, never a path: the worker looks for that name
        in its own pool folders (``--pool-dir``) only. The probe bytes it wrote
        prove that the pool found is the one it means; a process that maps the
        pool's first file is the client's own, so its pid is watched.
        """
        name, probe = pool.get("name"), pool.get("probe")
        if not isinstance(name, str) or not isinstance(probe, dict):
            return False, False
        attachment = self.pools.get(name)
        candidates = [attachment] if attachment else []
        for directory in self.pool_dirs:
            try:
                candidates.append(PoolAttachment(directory, name))
            except PoolError as exc:
                log.info("client %s: %s", client, exc)
                return False, False
        for candidate in candidates:
            try:
                found = bytes(candidate.buffer(probe.get("segment"), probe.get("offset"), 16))
            except (PoolError, AttributeError, TypeError):
                continue
            if found == pool.get("probe_bytes"):
                self.pools.setdefault(candidate.name, candidate)
                with self._lock:
                    state = self._states[client]
                    state.pool = candidate.name
                    started = process_start(pid)
                    if started is not None and maps_file(pid, f"{name}-0"):
                        state.pid, state.started = pid, started
                    return True, state.started is not None
        log.info("client %s: pool %r is not in %s; arrays go as frames", client, name, self.pool_dirs)
        return False, False

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
        """Free what clients that are gone left behind; forget clients that hold nothing."""
        now = time.monotonic()
        owners = self.handles.owners()
        with self._lock:
            states = list(self._states.items())
        for client, state in states:
            if state.started is not None:  # watched: freed when its process is gone, however long it is silent
                if process_start(state.pid) != state.started:
                    self.free(client, state, "gone", f"its process {state.pid} is gone")
            elif not owners.get(client) and state.pool is None and not (
                    self.array_cache is not None and self.array_cache.holds_arrays_of(client)):
                with self._lock:  # holds nothing: forget it
                    if state.inflight == 0:
                        self._states.pop(client, None)
            elif self.client_timeout and state.inflight == 0 and now - state.last_seen > self.client_timeout:
                self.free(client, state, "idle", f"no message for {now - state.last_seen:.0f} s")

    def free(self, client, state, reason, why):
        """Release the client's handles, arrays and pool; returns how many handles."""
        released = self.handles.release_client(client)
        cached = self.array_cache.drop_client(client) if self.array_cache is not None else 0
        name, state.pool = state.pool, None
        removed = self._detach(name, remove_files=reason == "gone") if name else 0
        with self._lock:
            if state.inflight == 0:
                self._states.pop(client, None)
        first, state.freed = not state.freed, True
        if reason != "goodbye" and (first or released or removed or cached):
            self.swept[reason] += first
            log.info("client %s: %s; released %d handle(s) and %d cached array(s), removed %d pool file(s)",
                     client, why, released, cached, removed)
        return released

    def _detach(self, name, remove_files=False):
        """Unmap a pool no client uses any more; remove its files if its owner is dead."""
        with self._lock:
            if any(state.pool == name for state in self._states.values()):
                return 0
        attachment = self.pools.pop(name, None)
        if attachment is None:
            return 0
        attachment.close()
        if not remove_files:
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
