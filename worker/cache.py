"""Arrays the worker keeps for its clients, so that a repeated array travels once.

A client names an array by a fingerprint of its content (protocol.fingerprint)
and asks the worker to keep it; later requests of that client send only the
key. Entries are private, read-only copies: pool slots and frames belong to the
request, and the client reuses its slots as soon as the reply is read. Keys
live in each client's own namespace (no client can read another's arrays),
and one byte bound, least recently used first out, holds for all clients
together, so many clients cannot multiply the worker's memory.
"""

import threading
from collections import OrderedDict


class ArrayCache:
    def __init__(self, max_bytes):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._entries = OrderedDict()  # (client, key) -> read-only array, least recently used first
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def get(self, client, key):
        with self._lock:
            arr = self._entries.get((client, key))
            if arr is not None:
                self._entries.move_to_end((client, key))
            return arr

    def put(self, client, key, arr):
        """Keep a private read-only copy of ``arr``; returns it, or ``arr`` if it is too large to keep."""
        if not 0 < arr.nbytes <= self.max_bytes:
            return arr
        kept = arr.copy(order="K")
        kept.flags.writeable = False
        with self._lock:
            old = self._entries.pop((client, key), None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._entries[(client, key)] = kept
            self.nbytes += kept.nbytes
            while self.nbytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes
        return kept

    def holds(self, client):
        with self._lock:
            return any(owner == client for owner, _ in self._entries)

    def drop_client(self, client):
        """Free every array of ``client`` (it said goodbye, died or was swept); returns how many."""
        with self._lock:
            keys = [entry for entry in self._entries if entry[0] == client]
            for entry in keys:
                self.nbytes -= self._entries.pop(entry).nbytes
        return len(keys)

    def for_client(self, client, kept):
        """The Decoder's view of one request: this client's keys; ``kept`` collects the keys stored."""
        return _ClientView(self, client, kept)


class _ClientView:
    def __init__(self, cache, client, kept):
        self.cache, self.client, self.kept = cache, client, kept

    def get(self, key):
        return self.cache.get(self.client, key)

    def put(self, key, arr):
        kept = self.cache.put(self.client, key, arr)
        if kept is not arr:
            self.kept.append(key)
        return kept
