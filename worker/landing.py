"""Host memory that arrays sent as frames land in, kept warm from one request to the next.

A worker on TCP (the Windows and remote path) receives a large array as
frames of at most 1 MiB and joins them into one buffer. Fresh memory costs a
page fault per 4 KiB the first time it is written, and glibc returns freed
blocks of more than its mmap threshold to the kernel, so every request paid
for its memory twice: in ZeroMQ's frames and in the joined array (for 200 MB,
more than the copies themselves; docs/performance.md). So the worker

- tells glibc's malloc to keep frame-sized blocks in its heap
  (:func:`keep_frames_in_heap`), and
- joins frames into buffers it reuses (:class:`LandingBuffers`): a buffer is
  free again once nothing refers to it, so a fitted estimator that keeps a
  view of its input keeps its buffer, and the next request gets another one.

On a GPU worker a buffer is page-locked (``cudaHostRegister``, through the
pool's :class:`.pinning.HostPinning` and within its budget) the first time it
is reused, when its pages are written and registering is cheap: from then on
the array it holds reaches the device by DMA, as a pool segment's does.
"""

import ctypes
import ctypes.util
import logging
import os
import sys
import threading

import numpy as np

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap (glibc's largest allowed threshold on 64-bit hosts)
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top kept rather than returned to the kernel
TRIM_THRESHOLD = 512 << 20
#: free landing buffers kept, in bytes at most
KEEP_BYTES = 1 << 30
#: smaller joins get a fresh buffer: their page faults cost little
LANDING_MIN = 4 << 20
PAGE = 4096  # kept buffers start and end on a page, so that a registered range is theirs alone


def keep_frames_in_heap():
    """Keep ZeroMQ's frame buffers in malloc's heap; whether it was done (glibc only, and not where the user set
    ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` already)."""
    if not sys.platform.startswith("linux") or any(
            name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    log.debug("malloc keeps blocks of up to %d MiB in its heap: %s", MMAP_THRESHOLD >> 20, done)
    return done


class LandingBuffers:
    """Byte buffers to join frames into, reused once nothing else refers to them.

    ``take(nbytes)`` returns a writable uint8 array of ``nbytes``: a view of
    a free kept buffer of at least that size (and at most twice it), or a new
    one. Before a new one is made, free buffers go (the largest first) until
    the free ones and the new one fit in ``keep_bytes``; the new one is kept
    if they do and all kept buffers, busy ones too, stay within twice that.
    Free means referred to by nothing but this list: every numpy view, and
    every memoryview of one, refers to its buffer. That count is CPython's
    with the GIL; a free-threaded interpreter gets a new buffer every time.

    ``pinning`` (a :class:`.pinning.HostPinning`, or None) page-locks a kept
    buffer when it is first reused, and unlocks it before it goes;
    :meth:`is_pinned` tells whether a view lies in a locked one (its reader
    then waits for the device before it answers, as for a pool segment).
    """

    def __init__(self, keep_bytes=KEEP_BYTES, min_bytes=LANDING_MIN, pinning=None):
        if not getattr(sys, "_is_gil_enabled", lambda: True)():
            keep_bytes = 0  # reference counts are not this exact without the GIL: nothing is reused
        self.keep_bytes, self.min_bytes, self.pinning = keep_bytes, min_bytes, pinning
        self.heap_kept = False  # whether keep_frames_in_heap took effect (the worker sets it)
        self._kept = []  # np.uint8 arrays: what is handed out (and derived from it) refers to one of these
        self._pinned = {}  # id of a kept buffer -> its page-locked range (address, nbytes), or None: refused
        self._lock = threading.Lock()
        self.reused = self.made = 0

    def _free(self):
        """Indexes of the kept buffers nothing else refers to (only this list and getrefcount's argument)."""
        return [i for i in range(len(self._kept)) if sys.getrefcount(self._kept[i]) == 2]

    @staticmethod
    def _usable(buffer):
        """The page-aligned part of a kept buffer that is handed out: all of its pages are this buffer's."""
        start = -buffer.ctypes.data % PAGE
        return buffer[start : start + _size(buffer)]

    def take(self, nbytes):
        if nbytes < self.min_bytes or not self.keep_bytes:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            free = self._free()
            fits = [i for i in free if nbytes <= _size(self._kept[i]) <= 2 * nbytes]
            if fits:
                self.reused += 1
                buffer = self._kept[min(fits, key=lambda i: _size(self._kept[i]))]
                if self.pinning is not None and id(buffer) not in self._pinned:
                    self._pin(buffer)
                return self._usable(buffer)[:nbytes]
            free_bytes = sum(_size(self._kept[i]) for i in free)
            for i in sorted(free, key=lambda i: _size(self._kept[i]), reverse=True):
                if free_bytes + nbytes <= self.keep_bytes:
                    break
                free_bytes -= _size(self._kept[i])
                self._unpin(self._kept[i])
                self._kept[i] = None
            self._kept = [b for b in self._kept if b is not None]
            self.made += 1
            if not (free_bytes + nbytes <= self.keep_bytes and self.kept_bytes() + nbytes <= 2 * self.keep_bytes):
                return np.empty(nbytes, np.uint8)
            buffer = np.empty(-(-nbytes // PAGE) * PAGE + PAGE, np.uint8)  # a page more, to start on one
            self._kept.append(buffer)
            return self._usable(buffer)[:nbytes]

    def _pin(self, buffer):
        """Page-lock a kept buffer's pages (written by its first join, so registering does not fault them in)."""
        usable = self._usable(buffer)
        where = (usable.ctypes.data, usable.nbytes)
        self._pinned[id(buffer)] = where if self.pinning.pin(*where, self) else None

    def _unpin(self, buffer):
        where = self._pinned.pop(id(buffer), None)
        if where is not None:
            self.pinning.unpin(*where, self)

    def is_pinned(self, view):
        """Whether ``view`` (from :meth:`take`) lies in a page-locked buffer."""
        base = view.base
        return base is not None and self._pinned.get(id(base)) is not None and any(b is base for b in self._kept)

    def kept_bytes(self):
        return sum(_size(b) for b in self._kept)

    def status(self):
        with self._lock:
            pinned = sum(where[1] for where in self._pinned.values() if where is not None)
            return {"kept": self.kept_bytes(), "reused": self.reused, "made": self.made, "heap": self.heap_kept,
                    "pinned": pinned}


def _size(buffer):
    """The bytes a kept buffer hands out (it has a page more, to start on one)."""
    return buffer.nbytes - PAGE
