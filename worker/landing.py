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
    """

    def __init__(self, keep_bytes=KEEP_BYTES, min_bytes=LANDING_MIN):
        if not getattr(sys, "_is_gil_enabled", lambda: True)():
            keep_bytes = 0  # reference counts are not this exact without the GIL: nothing is reused
        self.keep_bytes, self.min_bytes = keep_bytes, min_bytes
        self.heap_kept = False  # whether keep_frames_in_heap took effect (the worker sets it)
        self._kept = []  # np.uint8 arrays: what is handed out (and derived from it) refers to one of these
        self._lock = threading.Lock()
        self.reused = self.made = 0

    def _free(self):
        """Indexes of the kept buffers nothing else refers to (only this list and getrefcount's argument)."""
        return [i for i in range(len(self._kept)) if sys.getrefcount(self._kept[i]) == 2]

    def take(self, nbytes):
        if nbytes < self.min_bytes or not self.keep_bytes:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            free = self._free()
            fits = [i for i in free if nbytes <= self._kept[i].nbytes <= 2 * nbytes]
            if fits:
                self.reused += 1
                return self._kept[min(fits, key=lambda i: self._kept[i].nbytes)][:nbytes]
            free_bytes = sum(self._kept[i].nbytes for i in free)
            for i in sorted(free, key=lambda i: self._kept[i].nbytes, reverse=True):
                if free_bytes + nbytes <= self.keep_bytes:
                    break
                free_bytes -= self._kept[i].nbytes
                self._kept[i] = None
            self._kept = [b for b in self._kept if b is not None]
            buffer = np.empty(nbytes, np.uint8)
            self.made += 1
            if free_bytes + nbytes <= self.keep_bytes and self.kept_bytes() + nbytes <= 2 * self.keep_bytes:
                self._kept.append(buffer)
            return buffer[:nbytes]

    def kept_bytes(self):
        return sum(b.nbytes for b in self._kept)

    def status(self):
        with self._lock:
            return {"kept": self.kept_bytes(), "reused": self.reused, "made": self.made, "heap": self.heap_kept}
