"""Arrays the worker keeps for its clients, so that a repeated array travels once.

A client names an array by a fingerprint of its content (protocol.fingerprint)
and asks the worker to keep it; later requests of that client send only the
key. Entries are private, read-only copies: pool slots and frames belong to the
request, and the client reuses its slots as soon as the reply is read. Keys
live in each client's own namespace (no client can read another's arrays),
and one byte bound, least recently used first out, holds for all clients
together, so many clients cannot multiply the worker's memory.
"""

from sklearn_gpu_bridge.protocol import BoundedLRU


class ArrayCache(BoundedLRU):
    """Arrays by (client, key)."""

    def get_array(self, client, key):
        return self.get((client, key))

    def put_array(self, client, key, arr):
        """Keep a private read-only copy of ``arr``; returns it, or ``arr`` if it is too large to keep."""
        if not 0 < arr.nbytes <= self.max_bytes:
            return arr
        kept = arr.copy(order="K")
        kept.flags.writeable = False
        self.put((client, key), kept, kept.nbytes)
        return kept

    def holds_arrays_of(self, client):
        return any(owner == client for owner, _ in self.keys())

    def drop_client(self, client):
        """Free every array of ``client`` (it said goodbye, died or was swept); returns how many."""
        mine = [entry for entry in self.keys() if entry[0] == client]
        for entry in mine:
            self.pop(entry)
        return len(mine)

    def for_client(self, client, kept):
        """The Decoder's view of one request: this client's keys; ``kept`` collects the keys stored."""
        return _ClientView(self, client, kept)


class _ClientView:
    def __init__(self, cache, client, kept):
        self.cache, self.client, self.kept = cache, client, kept

    def get(self, key):
        return self.cache.get_array(self.client, key)

    def put(self, key, arr):
        kept = self.cache.put_array(self.client, key, arr)
        if kept is not arr:
            self.kept.append(key)
        return kept
