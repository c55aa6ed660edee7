"""Handles: the worker's table of live estimators, each owned by one client.

A handle is a random 63-bit number, so it can be neither guessed nor mistaken
for one of an earlier worker run; and it is only ever found for the client
that made it: another client asking for it (to call, read, pull the state
of, or release it) is told there is no such handle, exactly as if it did not
exist.
"""

import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Entry:
    estimator: object
    name: str
    client: str
    last_used: float = field(default_factory=time.monotonic)


class HandleTable:
    """handle (int) -> Entry, safe to use from the server and executor threads."""

    def __init__(self):
        self._entries = {}
        self._lock = threading.Lock()

    def add(self, estimator, name, client):
        with self._lock:
            handle = secrets.randbits(63)
            while handle in self._entries:
                handle = secrets.randbits(63)
            self._entries[handle] = Entry(estimator, name, client)
            return handle

    def get(self, handle, client):
        """The entry of ``handle`` if ``client`` owns it; KeyError otherwise (the same for both cases)."""
        if type(handle) is not int:
            raise TypeError(f"a handle is an int, not {type(handle).__name__}")
        with self._lock:
            entry = self._entries.get(handle)
        if entry is None or entry.client != client:
            shown = handle if abs(handle) < 2**64 else "(a huge number)"
            raise KeyError(f"this client has no estimator with handle {shown} on this worker (released, "
                           "evicted, or made by another worker)")
        entry.last_used = time.monotonic()
        return entry

    def release(self, handles, client):
        """Take those of ``handles`` that ``client`` owns out of the table; returns their entries.

        The models are freed when the caller drops that list, not under the table's lock: freeing a large
        model takes milliseconds, and other threads look their handles up meanwhile.
        """
        with self._lock:
            return [self._entries.pop(h) for h in handles
                    if type(h) is int and getattr(self._entries.get(h), "client", None) == client]

    def release_client(self, client):
        with self._lock:
            mine = [h for h, e in self._entries.items() if e.client == client]
            gone = [self._entries.pop(h) for h in mine]
        return len(gone)  # the models are freed here, out of the lock

    def owners(self):
        """How many handles each client owns."""
        with self._lock:
            return Counter(e.client for e in self._entries.values())

    def __len__(self):
        with self._lock:
            return len(self._entries)
