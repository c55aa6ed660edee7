"""Handles: the worker's table of live estimators, each owned by one client."""

import itertools
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Entry:
    estimator: object
    name: str
    client: str
    last_used: float = field(default_factory=time.monotonic)


class Registry:
    """handle (int) -> Entry, safe to use from the server and executor threads."""

    def __init__(self):
        self._entries = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def add(self, estimator, name, client):
        with self._lock:
            handle = next(self._ids)
            self._entries[handle] = Entry(estimator, name, client)
            return handle

    def get(self, handle):
        with self._lock:
            entry = self._entries.get(handle)
        if entry is None:
            raise KeyError(f"no estimator with handle {handle!r} on this worker (released or evicted)")
        entry.last_used = time.monotonic()
        return entry

    def release(self, handles):
        with self._lock:
            return sum(self._entries.pop(h, None) is not None for h in handles)

    def release_client(self, client):
        with self._lock:
            mine = [h for h, e in self._entries.items() if e.client == client]
            for h in mine:
                del self._entries[h]
            return len(mine)

    def __len__(self):
        with self._lock:
            return len(self._entries)
