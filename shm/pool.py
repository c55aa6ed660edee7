"""A slotted, file-backed shared-memory pool for bulk arrays.

The client owns the pool: it creates segment files (sparse, owner-only) and
hands out *blocks* (runs of 1 MiB slots) to requests, which hold them until
the reply has been read (or, for a result, until the array dies). The worker
attaches the same files by name and reads or writes byte ranges that it
validates against the segment's size. Nothing here knows about arrays: the
protocol turns byte ranges into arrays.

Files are named ``sgb-pool-<pid>-<token>-<segment>``: the pid lets a new
client remove the files of clients that died without cleaning up.
"""

import mmap
import os
import re
import secrets
import stat
import sys
import tempfile
import threading
import weakref

from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.host import pid_alive

SLOT_SIZE = 1 << 20  # 1 MiB: the unit a block is made of
SEGMENT_SLOTS = 64  # a new segment holds at least 64 slots (64 MiB, sparse)
PREFIX = "sgb-pool"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{16}})$")
_FILE_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{16}})-(\d+)$")


class PoolError(ProtocolError):
    """A pool could not be attached, or a byte range lies outside it."""


def default_directory():
    """/dev/shm on Linux (memory-backed), else the temp folder."""
    shm = "/dev/shm"
    if sys.platform.startswith("linux") and os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def remove_orphans(directory):
    """Remove pool files left by clients that died; returns how many."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        match = _FILE_RE.match(name)
        if match and not pid_alive(int(match.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
    return removed


def _unlink_all(paths, owner_pid):
    if os.getpid() != owner_pid:
        return  # a forked child inherited this finalizer: the files are not its own
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class Block:
    """A run of slots held by one request (or one result array) until released."""

    __slots__ = ("_pool", "segment", "start", "count", "__weakref__")

    def __init__(self, pool, segment, start, count):
        self._pool, self.segment, self.start, self.count = pool, segment, start, count

    @property
    def offset(self):
        return self.start * self._pool.slot_size

    @property
    def nbytes(self):
        return self.count * self._pool.slot_size

    def buffer(self):
        """A writable memoryview of the whole block (no copy)."""
        return self._pool._segments[self.segment].view[self.offset : self.offset + self.nbytes]

    def shrink(self, nbytes):
        """Give back the slots past the first ``nbytes`` bytes."""
        keep = -(-nbytes // self._pool.slot_size)
        if keep < self.count:
            self._pool._free_slots(self.segment, self.start + keep, self.count - keep)
            self.count = keep

    def release(self):
        """Return the slots to the pool; safe to call twice."""
        if self.count:
            self._pool._free_slots(self.segment, self.start, self.count)
            self.count = 0


class _Segment:
    def __init__(self, path, nbytes):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)  # sparse: no page is touched until written
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.view = memoryview(self.map)


class Pool:
    """The client's pool: segments of slots, handed out as blocks under a lock."""

    def __init__(self, directory=None, slot_size=SLOT_SIZE, segment_slots=SEGMENT_SLOTS):
        self.directory = directory or default_directory()
        self.slot_size = slot_size
        self.segment_slots = segment_slots
        self.name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(8)}"
        self._segments = []
        self._used = []  # one bytearray per segment: 1 = slot in a block
        self._paths = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _unlink_all, self._paths, os.getpid())
        remove_orphans(self.directory)

    def allocate(self, nbytes):
        """A block of enough contiguous slots for ``nbytes``; grows the pool if needed."""
        count = max(1, -(-nbytes // self.slot_size))
        with self._lock:
            for index, used in enumerate(self._used):
                start = _find_run(used, count)
                if start is not None:
                    used[start : start + count] = b"\x01" * count
                    return Block(self, index, start, count)
            index = self._add_segment(max(count, self.segment_slots))
            self._used[index][:count] = b"\x01" * count
            return Block(self, index, 0, count)

    def _add_segment(self, slots):
        index = len(self._segments)
        path = os.path.join(self.directory, f"{self.name}-{index}")
        self._paths.append(path)
        self._segments.append(_Segment(path, slots * self.slot_size))
        self._used.append(bytearray(slots))
        return index

    def _free_slots(self, segment, start, count):
        with self._lock:
            self._used[segment][start : start + count] = bytes(count)

    @property
    def slots_in_use(self):
        """How many slots blocks hold now (0 when every request has finished)."""
        with self._lock:
            return sum(sum(used) for used in self._used)

    @property
    def paths(self):
        return list(self._paths)

    def close(self):
        """Remove the pool's files; mappings still used by live arrays stay valid."""
        self._finalizer()


def _find_run(used, count):
    """First index of ``count`` consecutive free slots, or None."""
    target = bytes(count)
    at = used.find(target)
    return None if at < 0 else at


class PoolAttachment:
    """The worker's view of one client's pool: validated byte ranges only."""

    def __init__(self, directory, name):
        if not _NAME_RE.fullmatch(name or ""):  # fullmatch: "$" alone would accept a trailing newline
            raise PoolError(f"not a pool name: {name!r}")
        self.directory = directory
        self.name = name
        self._maps = {}
        self._lock = threading.Lock()

    def _segment(self, index):
        with self._lock:
            view = self._maps.get(index)
            if view is None:
                path = os.path.join(self.directory, f"{self.name}-{index}")
                try:
                    fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
                except OSError as exc:
                    raise PoolError(f"pool segment {index} cannot be opened: {exc}") from None
                try:
                    info = os.fstat(fd)
                    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                        raise PoolError(f"pool segment {index} is not a file of this user")
                    if info.st_size == 0:
                        raise PoolError(f"pool segment {index} is empty")
                    view = memoryview(mmap.mmap(fd, info.st_size))
                finally:
                    os.close(fd)
                self._maps[index] = view
            return view

    def buffer(self, segment, offset, nbytes):
        """A writable memoryview of [offset, offset+nbytes) in a segment, bounds-checked."""
        if not all(type(v) is int for v in (segment, offset, nbytes)):
            raise PoolError("pool range must be three integers")
        if segment < 0 or offset < 0 or nbytes < 0:
            raise PoolError("pool range must not be negative")
        view = self._segment(segment)
        if offset + nbytes > len(view):
            raise PoolError(
                f"pool range {offset}+{nbytes} lies outside segment {segment} of {len(view)} bytes"
            )
        return view[offset : offset + nbytes]

    def close(self):
        with self._lock:
            for view in self._maps.values():
                try:
                    view.obj.close()
                except BufferError:
                    pass  # an array still uses it; unmapped when that array dies
            self._maps.clear()
