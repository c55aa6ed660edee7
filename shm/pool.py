"""A slotted shared-memory pool for bulk arrays.

The client owns the pool: it makes segments (sparse, owner-only) and hands
out *blocks* (runs of 1 MiB slots) to requests, which hold them until the
reply has been read (or, for a result, until the array dies). The worker
attaches the pool and reads or writes byte ranges that it validates first.
Nothing here knows about arrays: the protocol turns byte ranges into arrays.

Two kinds of segment:

- ``memfd`` (Linux, the default): anonymous memory files, sealed so that
  they can never shrink or grow (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``).
  The worker opens them as ``/proc/<client pid>/fd/<fd>`` and maps them: no
  file to clean up, and no way for a client to truncate memory the worker
  has mapped (which would kill the worker with SIGBUS).
- ``file`` (a pool folder: macOS, WSL2 folders shared with Windows): files
  named ``sgb-pool-<pid>-<token>-<index>``. The worker never maps them: it
  reads and writes them with ``pread``/``pwrite``, so a client that truncates
  its file gets an error, not a dead worker.

The first 4 KiB of segment 0 are the handshake area, never handed out: the
worker proves that a client owns the pool it names by writing a random
nonce there, which only a process that maps the pool can read back
(:meth:`PoolAttachment.challenge`).
"""

import ctypes
import fcntl
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
from sklearn_gpu_bridge.runtime.private_files import pid_alive

SLOT_SIZE = 1 << 20  # 1 MiB: the unit a block is made of
SEGMENT_SLOTS = 64  # a new segment holds at least 64 slots (64 MiB, sparse)
HANDSHAKE_BYTES = 4096  # the start of segment 0: nonce slots, never part of a block
NONCE_BYTES = 32
PIN_MIN_BYTES = 8 << 20  # a request that moves this much through a mapped segment gets it pinned (see pinning)
PREFIX = "sgb-pool"
MEMFD = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
SEALS = (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL) if MEMFD else 0
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{16}})$")
_FILE_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{16}})-(\d+)$")


class PoolError(ProtocolError):
    """A pool could not be attached, or a byte range lies outside it."""


def default_directory():
    """Where file pools go by default: /dev/shm on Linux (memory-backed), else the temp folder."""
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


def _address(view):
    """The address of a writable memoryview's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _unlink_all(paths, owner_pid):
    if os.getpid() != owner_pid:
        return  # a forked child inherited this finalizer: the files are not its own
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- the client's side


class Block:
    """A run of slots held by one request (or one result array) until released.

    ``segment`` (the segment's id on the wire: its fd, or its index for files), ``offset`` and ``nbytes`` are
    plain attributes, not properties: a request reads them a dozen times, and a property is a call each time.
    ``nbytes`` is 0 once the block is released."""

    __slots__ = ("_pool", "_index", "start", "count", "segment", "offset", "nbytes", "__weakref__")

    def __init__(self, pool, index, start, count):
        self._pool, self._index, self.start, self.count = pool, index, start, count
        self.segment = pool._segments[index].id
        self.offset, self.nbytes = start * pool.slot_size, count * pool.slot_size

    def buffer(self):
        """A writable memoryview of the whole block (no copy); empty once released."""
        return self._pool._segments[self._index].view[self.offset : self.offset + self.nbytes]

    def release(self):
        """Return the slots to the pool; safe to call twice."""
        if self.count:
            self._pool._free_slots(self._index, self.start, self.count)
            self.count = self.nbytes = 0


class _Segment:
    def __init__(self, name, index, nbytes, directory):
        if directory is None:  # memfd: sealed, kept open (the worker opens it through /proc)
            fd = os.memfd_create(f"{name}-{index}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            self.id, self.fd, self.path = fd, fd, None
        else:
            self.path = os.path.join(directory, f"{name}-{index}")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            os.ftruncate(fd, nbytes)  # sparse: no page is touched until written
            self.id, self.fd = index, None
        try:
            self.map = mmap.mmap(fd, nbytes)
        finally:
            if self.fd is None:
                os.close(fd)
        self.view = memoryview(self.map)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _close_segments(segments, paths, owner_pid):
    for segment in segments:
        segment.close()
    _unlink_all(paths, owner_pid)


class Pool:
    """The client's pool: segments of slots, handed out as blocks under a lock.

    ``directory=None`` makes memfd segments where Linux has them, else files in
    :func:`default_directory`; a folder makes files there.
    """

    def __init__(self, directory=None, slot_size=SLOT_SIZE, segment_slots=SEGMENT_SLOTS):
        self.kind = "memfd" if directory is None and MEMFD else "file"
        self.directory = None if self.kind == "memfd" else (directory or default_directory())
        self.slot_size = slot_size
        self.segment_slots = segment_slots
        self.name = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(8)}"
        self._segments = []
        self._used = []  # one bytearray per segment: 1 = slot in a block
        self._paths = []
        # reentrant: a block may be freed by a collection that runs while this thread holds the lock (a gone
        # thread's request slot, client._Link.__del__)
        self._lock = threading.RLock()
        self._finalizer = weakref.finalize(self, _close_segments, self._segments, self._paths, os.getpid())
        if self.directory is not None:
            remove_orphans(self.directory)
        self.handshake = self.allocate(HANDSHAKE_BYTES)  # slot 0 of segment 0, held for the pool's life

    def describe(self):
        """What the worker needs to find this pool (it proves ownership with a nonce, see challenge)."""
        return {"name": self.name, "kind": self.kind, "pid": os.getpid(), "segment": self.handshake.segment}

    def read_nonce(self, slot):
        """The nonce the worker wrote into handshake slot ``slot``."""
        if type(slot) is not int or not 0 <= slot < HANDSHAKE_BYTES // NONCE_BYTES:
            raise PoolError("the worker named a handshake slot outside the handshake area")
        return bytes(self.handshake.buffer()[slot * NONCE_BYTES : (slot + 1) * NONCE_BYTES])

    def allocate(self, nbytes):
        """A block of enough contiguous slots for ``nbytes``; grows the pool if needed."""
        count = max(1, -(-nbytes // self.slot_size))
        with self._lock:
            for index, used in enumerate(self._used):
                start = used.find(bytes(count))
                if start >= 0:
                    used[start : start + count] = b"\x01" * count
                    return Block(self, index, start, count)
            index = self._add_segment(max(count, self.segment_slots))
            self._used[index][:count] = b"\x01" * count
            return Block(self, index, 0, count)

    def _add_segment(self, slots):
        index = len(self._segments)
        segment = _Segment(self.name, index, slots * self.slot_size, self.directory)
        if segment.path is not None:
            self._paths.append(segment.path)
        self._segments.append(segment)
        self._used.append(bytearray(slots))
        return index

    def _free_slots(self, index, start, count):
        with self._lock:
            self._used[index][start : start + count] = bytes(count)

    @property
    def slots_in_use(self):
        """How many slots blocks hold now, besides the handshake's (0 when every request has finished)."""
        with self._lock:
            return sum(sum(used) for used in self._used) - 1

    @property
    def segment_bytes(self):
        """Each segment's size, in order (the pool only grows: a benchmark reads how far)."""
        with self._lock:
            return [len(used) * self.slot_size for used in self._used]

    @property
    def paths(self):
        return list(self._paths)

    def close(self):
        """Close the segments (remove the files); mappings still used by live arrays stay valid."""
        self._finalizer()


# ---------------------------------------------------------------- the worker's side


class _Output:
    """A writable range of a pool for a reply's arrays; ``commit`` makes what was written visible."""

    def __init__(self, memory, commit=None):
        self.memory, self._commit = memory, commit

    def commit(self, used):
        if self._commit is not None:
            self._commit(used)


class PoolAttachment:
    """The worker's view of one client's pool: validated byte ranges only.

    Found from what the client's hello names (:meth:`Pool.describe`): a
    memfd of that pid, whose name and seals are checked, or a file of that
    name in one of the worker's own pool folders (never a path a request
    names). Neither is trusted until :meth:`challenge` is answered.

    ``pinning`` (the worker's ``HostPinning``, or None): a mapped segment is
    registered with it the first time a read or an output range of at least
    ``PIN_MIN_BYTES`` lies in it, and unregistered by :meth:`close`, or, when
    requests still :meth:`hold` the attachment, when the last one lets go: the
    GPU may still be reading a registered range until its request settles.
    """

    def __init__(self, described, folders=(), pinning=None):
        if not isinstance(described, dict):
            raise PoolError("a pool is described by a dict")
        name, self.kind, self.pid = described.get("name"), described.get("kind"), described.get("pid")
        if not _NAME_RE.fullmatch(name or ""):  # fullmatch: "$" alone would accept a trailing newline
            raise PoolError(f"not a pool name: {name!r}")
        if self.kind not in ("memfd", "file") or (self.kind == "memfd" and (not MEMFD or type(self.pid) is not int)):
            raise PoolError(f"a pool of kind {self.kind!r} cannot be attached here")
        self.name = name
        self.directory = None
        if self.kind == "file":
            self.directory = next((d for d in folders if os.path.exists(os.path.join(d, f"{name}-0"))), None)
            if self.directory is None:
                raise PoolError(f"pool {name!r} is not in {list(folders)}")
        self._segments = {}  # id -> (fd or None, size, map or None)
        self._lock = threading.Lock()
        self.pinning = pinning
        self._pinned = {}  # id -> (address, nbytes, mapping) once registered; None while registering or refused
        self._closed = False
        self._holders = 0  # requests that use the pool now
        self.first_id = described.get("segment")
        self._segment(self.first_id, first=True)

    def _segment(self, segment, first=False):
        if type(segment) is not int or segment < 0:
            raise PoolError("a pool segment is a non-negative integer")
        with self._lock:
            found = self._segments.get(segment)
            if found is None:
                found = self._segments[segment] = self._open(segment, first)
            return found

    def _open(self, segment, first):
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        if self.kind == "memfd":
            path = f"/proc/{self.pid}/fd/{segment}"
            try:
                target = os.readlink(path)
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise PoolError(f"pool segment {segment} cannot be opened: {exc.strerror}") from None
            index = r"0" if first else r"\d+"
            if not re.fullmatch(rf"/memfd:{re.escape(self.name)}-{index} \(deleted\)", target) \
                    or fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
                os.close(fd)
                raise PoolError(f"fd {segment} of process {self.pid} is not a sealed segment of pool {self.name}")
        else:
            if first and segment != 0:
                raise PoolError("the handshake lies in segment 0")
            try:
                fd = os.open(os.path.join(self.directory, f"{self.name}-{segment}"), os.O_RDWR | nofollow)
            except OSError as exc:
                raise PoolError(f"pool segment {segment} cannot be opened: {exc.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size == 0:
            os.close(fd)
            raise PoolError(f"pool segment {segment} is not a non-empty file of this user")
        if self.kind == "file":
            return fd, info.st_size, None  # read and written with pread/pwrite: never mapped
        try:
            return None, info.st_size, memoryview(mmap.mmap(fd, info.st_size))
        finally:
            os.close(fd)

    def _check(self, segment, offset, nbytes):
        if not (type(segment) is int and type(offset) is int and type(nbytes) is int):
            raise PoolError("pool range must be three integers")
        if offset < 0 or nbytes < 0:
            raise PoolError("pool range must not be negative")
        fd, size, mapped = self._segment(segment)
        if offset + nbytes > size:
            raise PoolError(f"pool range {offset}+{nbytes} lies outside segment {segment} of {size} bytes")
        if mapped is not None and nbytes >= PIN_MIN_BYTES and self.pinning is not None:
            self._pin(segment, mapped)
        return fd, mapped

    def _pin(self, segment, mapped):
        """Register a whole mapped segment with the pinning, once (a refusal is not tried again)."""
        with self._lock:
            if self._closed or segment in self._pinned:
                return
            self._pinned[segment] = None  # claimed: another thread's request goes on pageable meanwhile
        address, nbytes = _address(mapped), len(mapped)
        if not self.pinning.pin(address, nbytes, self):
            return
        with self._lock:
            self._pinned[segment] = (address, nbytes, mapped)  # the mapping with it: never unmapped while registered
            if not self._closed or self._holders:
                return
            pinned = self._take_pinned()  # closed meanwhile, and no request holds the pool any more
        self._unpin(pinned)

    def is_pinned(self, segment):
        with self._lock:
            return bool(self._pinned.get(segment))

    @property
    def pinned_bytes(self):
        with self._lock:
            return sum(pinned[1] for pinned in self._pinned.values() if pinned)

    def hold(self):
        """A request uses this pool until :meth:`let_go`: its pinned segments stay registered meanwhile."""
        with self._lock:
            self._holders += 1

    def let_go(self):
        with self._lock:
            self._holders -= 1
            pinned = self._take_pinned() if self._closed and self._holders == 0 else []
        self._unpin(pinned)

    def _take_pinned(self):
        pinned = [p for p in self._pinned.values() if p]
        self._pinned.clear()
        return pinned

    def _unpin(self, pinned):
        for address, nbytes, _ in pinned:
            self.pinning.unpin(address, nbytes, self)

    def read(self, segment, offset, nbytes):
        """[offset, offset+nbytes) of a segment: a view of a memfd, a copy of a file (read with pread)."""
        fd, mapped = self._check(segment, offset, nbytes)
        if mapped is not None:
            return mapped[offset : offset + nbytes]
        data = bytearray(nbytes)
        done = os.preadv(fd, [data], offset) if nbytes else 0
        if done != nbytes:
            raise PoolError(f"pool segment {segment} is shorter than the range read (truncated by its client?)")
        return memoryview(data)

    def output(self, segment, offset, nbytes):
        """A writable range for a reply: the memfd's own memory, or a buffer written back with pwrite."""
        fd, mapped = self._check(segment, offset, nbytes)
        if mapped is not None:
            return _Output(mapped[offset : offset + nbytes])
        staging = bytearray(nbytes)

        def commit(used):
            if used and os.pwrite(fd, memoryview(staging)[:used], offset) != used:
                raise PoolError(f"pool segment {segment} could not be written (truncated by its client?)")

        return _Output(memoryview(staging), commit)

    def challenge(self):
        """(slot, nonce): a fresh nonce written into a random slot of the handshake area."""
        slot, nonce = secrets.randbelow(HANDSHAKE_BYTES // NONCE_BYTES), secrets.token_bytes(NONCE_BYTES)
        target = self.output(self.first_id, slot * NONCE_BYTES, NONCE_BYTES)
        target.memory[:] = nonce
        target.commit(NONCE_BYTES)
        return slot, nonce

    def maps_handshake(self, pid):
        """Whether process ``pid`` has this pool (its first segment) open or mapped: it is the client's own."""
        needle = f"{self.name}-0".encode()
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                return needle in f.read()
        except OSError:
            return False

    def close(self):
        """Unregister pinned segments (now, or when the last request that holds the pool lets go), and let
        the mappings go (each when no array uses it any more, and never while it is registered)."""
        with self._lock:
            self._closed = True
            pinned = self._take_pinned() if self._holders == 0 else []
        self._unpin(pinned)
        with self._lock:
            for fd, _, mapped in self._segments.values():
                if mapped is not None:
                    try:
                        mapped.obj.close()
                    except BufferError:
                        pass  # an array still uses it; unmapped when that array dies
                if fd is not None:
                    os.close(fd)
            self._segments.clear()
