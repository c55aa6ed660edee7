"""Handles: the worker's table of live estimators, each owned by one client.

A handle is a random 63-bit number, so it can be neither guessed nor mistaken
for one of an earlier worker run; and it is only ever found for the client
that made it: another client asking for it (to call, read, pull the state
of, or release it) is told there is no such handle, exactly as if it did not
exist.

Each handle also remembers the GPU its model lives on (``device``: its index,
None where the worker drives the process's one device as it is), so that the
requests that read it run there, and the model is freed with that device
current.

Behind a front (:mod:`.front`), a worker process serves one GPU, and its handles carry that GPU's index in their
low :data:`TAG_BITS` bits (``tag``): the front sends a request that reads a model to the process that made it
without keeping a table of its own.
"""

import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
TAG_BITS = 6  # a handle's low bits that name the GPU of its process, behind a front: GPUs 0 to 63


def tag_of(handle):
    """The GPU index a tagged handle names (any int: the front routes what it cannot trust yet)."""
    return handle & ((1 << TAG_BITS) - 1)


@dataclass
class Entry:
    estimator: object
    name: str
    client: str
    device: int | None = None  # the GPU the model lives on
    last_used: float = field(default_factory=time.monotonic)


class HandleTable:
    """handle (int) -> Entry, safe to use from the server and executor threads.

    ``on_device(index)``: the context that makes a GPU current, under which :meth:`drop` frees a model of that
    GPU (None: models are freed wherever their last reference goes). ``tag``: the GPU index each handle carries
    (:data:`TAG_BITS`), behind a front; None: none.
    """

    def __init__(self, on_device=None, tag=None):
        if tag is not None and not 0 <= tag < 1 << TAG_BITS:
            raise ValueError(f"a handle tag is a GPU index from 0 to {(1 << TAG_BITS) - 1}, not {tag!r}")
        self._entries = {}
        self._lock = threading.Lock()
        self._on_device = on_device
        self._tag = tag

    def _new_handle(self):
        if self._tag is None:
            return secrets.randbits(63)
        return secrets.randbits(63 - TAG_BITS) << TAG_BITS | self._tag

    def add(self, estimator, name, client, device=None):
        with self._lock:
            handle = self._new_handle()
            while handle in self._entries:
                handle = self._new_handle()
            self._entries[handle] = Entry(estimator, name, client, device)
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

    def device_of(self, handle, client):
        """The device of ``client``'s model ``handle``; None where there is no such model (or no device)."""
        with self._lock:
            entry = self._entries.get(handle) if type(handle) is int else None
        return entry.device if entry is not None and entry.client == client else None

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
        released = len(gone)
        self.drop(gone)  # the models are freed here, out of the lock
        return released

    def drop(self, entries):
        """Free the models of ``entries`` (taken out of the table; the list is emptied), each one with its own GPU
        current, as when it was made: what frees device memory on the current device's stream frees it there."""
        if self._on_device is None:
            entries.clear()
            return
        while entries:
            entry = entries.pop()
            device = entry.device
            try:
                if device is None:
                    del entry
                else:
                    with self._on_device(device):  # a GPU given up may refuse: the others are freed still
                        del entry
            except Exception:  # noqa: BLE001 - said; the model goes with the entry anyway
                log.warning("freeing a model on GPU %s failed", device, exc_info=True)

    def owners(self):
        """How many handles each client owns."""
        with self._lock:
            return Counter(e.client for e in self._entries.values())

    def per_device(self):
        """How many models each device holds."""
        with self._lock:
            return Counter(e.device for e in self._entries.values())

    def __len__(self):
        with self._lock:
            return len(self._entries)
