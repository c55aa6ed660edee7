"""Framing and signing: a message is ``[signature, header, *buffers]``.

- ``header`` is msgpack of a dict made only of plain builtins (None, bool,
  int, float, str, bytes, tuple, list, dict), read only after its signature
  checks. msgpack names no class and no function, so even a signed message
  cannot make its reader build an object or run code; its reader's lengths
  are bounded by the header's own size, its nesting by msgpack's stack, and
  tuples (an extension type, so that a tuple parameter stays a tuple) by
  ``MAX_TUPLE_DEPTH``. Unlike a pickle, it needs no scan before it is read
  (docs/protocol.md).
- ``signature`` is the hex HMAC-SHA256 of the header bytes under the shared
  key, compared in constant time (as jupyter_client does).
- ``buffers`` are raw bytes: arrays as zero-copy frames, and opaque blobs
  that only the operation expecting one ever reads (see :mod:`.arrays`).
  The header carries a BLAKE3 digest of each (``digests``), so the
  signature covers every frame; an array or blob split into several frames
  (a worker on TCP takes frames of at most ``max_frame_bytes``) has one
  digest of its frames together, followed by ``None`` for each further frame.

Every header also carries ``time`` (seconds since the epoch) and, from a
client, ``to``: the id of the worker run it is meant for. A worker's session
(``me=`` its id) refuses a message for another run (a restart with the same
key, another worker), one whose time is more than ``max_skew`` seconds from
its clock, and one it has seen before (a replay); every header carries a
fresh random ``id``, so no honest message repeats one.

:meth:`Session.pack` writes this format and :meth:`Session.unpack` is its
exact inverse.
"""

import hmac
import os
import threading
import time
from collections import Counter, deque

import blake3
import msgpack
import numpy as np
import zmq

from ..errors import ProtocolError

MAX_SKEW = 300.0  # seconds a message's time may be from the worker's clock
REMEMBER = 1 << 20  # signatures a worker keeps to refuse replays (those older than 2 x MAX_SKEW go first)
MAX_HEADER = 16 << 20  # bytes: a longer header is refused before its signature is computed
#: frames in one message, at most (a longer one is dropped as it is read): 64 GiB in frames of 1 MiB
MAX_FRAMES = 1 << 16
DIGEST_THREADS_FROM = 256 << 10  # bytes: from this size a buffer is hashed on all cores (faster even on two)
SECOND_WAY_REMEMBERED = 4096  # messages taken from request slots whose ZeroMQ copies may come (most never do)
PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes})  # exact types only: a subclass is not plain
TUPLE_EXT = 1  # the msgpack extension type of a tuple (an array reads as a list)
MAX_TUPLE_DEPTH = 8  # tuples within tuples: each is read by a call of msgpack of its own, on the C stack
INT_RANGE = (-(1 << 63), 1 << 64)  # the ints msgpack writes: [-2**63, 2**64)
NOT_SCALARS = (np.datetime64, np.timedelta64, np.void)  # numpy values whose .item() is no plain value, or not one


# the option and the flag as plain ints: pyzmq's are enums, whose ``&`` is Python code (3.1 us a look at a socket
# with them, 1.7 us with ints; ``Socket.poll(0)`` builds a Poller)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def message_waits(sock):
    """Whether a message waits on ``sock``: its ZMQ_EVENTS, what ``Socket.poll(0)`` reads."""
    return sock.getsockopt(_EVENTS) & _POLLIN


def new_id():
    """A fresh random message (or client, or worker) id: 96 bits, hex."""
    return os.urandom(12).hex()


def to_plain(value):
    """``value`` made of exact plain builtins (numpy scalars made Python ones, subclasses of list, tuple and
    dict made those), or raise TypeError naming the first type that is not plain (an int outside msgpack's
    range included)."""
    kind = type(value)
    if kind is dict and _flat(value):  # an estimator's parameters, mostly: no call per value
        return dict(value)
    if kind is int:
        if not INT_RANGE[0] <= value < INT_RANGE[1]:
            raise TypeError("int of more than 64 bits")
        return value
    if kind in PLAIN_TYPES:
        return value
    if isinstance(value, np.generic) and not isinstance(value, NOT_SCALARS):
        return to_plain(value.item())
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(to_plain(v) for v in value)
    if isinstance(value, dict):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    raise TypeError(kind.__name__)


def _flat(mapping):
    """Whether a dict maps strings to plain scalars only (ints within msgpack's range): plain as it is."""
    values = mapping.values()
    if not (_STR.issuperset(map(type, mapping)) and PLAIN_TYPES.issuperset(map(type, values))):
        return False
    ints = [v for v in values if type(v) is int]
    return not ints or (INT_RANGE[0] <= min(ints) and max(ints) < INT_RANGE[1])


_STR = frozenset({str})


def _packable(value, depth=0):
    """What msgpack writes for a value it does not write itself (``strict_types``: it writes exact builtins only,
    and a tuple goes through here, as an extension); ``depth``: the tuples around ``value``."""
    if isinstance(value, tuple):
        if depth >= MAX_TUPLE_DEPTH:
            raise TypeError(f"tuples nested more than {MAX_TUPLE_DEPTH} deep cannot go in a message")
        # a small buffer: two of msgpack's default 256 KiB at once cost ~15 us in malloc for a tuple of two
        return msgpack.ExtType(TUPLE_EXT, msgpack.packb(list(value), use_bin_type=True, strict_types=True,
                                                        default=lambda inner: _packable(inner, depth + 1),
                                                        buf_size=1024))
    if isinstance(value, np.generic) and not isinstance(value, NOT_SCALARS):
        return value.item()
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, int):
        raise TypeError("an int of more than 64 bits cannot go in a message")
    raise TypeError(f"a value of type {type(value).__name__} cannot go in a message")


_PACK = {"use_bin_type": True, "strict_types": True, "default": _packable}


def dumps_header(header):
    """msgpack of a header of plain values (numpy scalars become Python ones); TypeError for anything else."""
    return msgpack.packb(header, **_PACK)


def loads_header(data):
    """A header that may hold plain builtins only; ProtocolError for anything else."""
    try:
        return _unpack(data, 0)
    except ProtocolError:
        raise
    except Exception as exc:
        hint = " (a pickle: a client or worker of protocol 2 or before)" if data[:1] == b"\x80" else ""
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}{hint}") from None


def _unpack(data, depth):
    """msgpack's reader with every length bounded by ``len(data)`` (its default), str as UTF-8, the timestamp
    extension as a float, and the tuple extension the one other extension read."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=1,
                           ext_hook=lambda code, inner: _tuple(code, inner, depth))


def _tuple(code, data, depth):
    if code != TUPLE_EXT:
        raise ProtocolError(f"header uses the msgpack extension type {code}; only tuples ({TUPLE_EXT}) are read")
    if depth >= MAX_TUPLE_DEPTH:
        raise ProtocolError(f"header nests tuples more than {MAX_TUPLE_DEPTH} deep")
    items = _unpack(data, depth + 1)
    if type(items) is not list:
        raise ProtocolError("a tuple in a header must hold an array")
    return tuple(items)


def raw_bytes(frame):
    """A received frame's bytes (a zmq.Frame or bytes)."""
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def frame_buffer(frame):
    """A received frame's memory, without a copy."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def buffer_digest(buffer):
    """BLAKE3 of a buffer (hex), hashed where it lies; large ones on all cores, without the GIL.

    BLAKE3 rather than SHA-256: it hashes a 51 MB frame in 9 to 11 ms against
    SHA-256's 17.5 ms on two cores, and each frame is hashed twice (sender,
    receiver); see docs/reliability.md.
    """
    memory = memoryview(buffer).cast("B")
    threads = blake3.blake3.AUTO if memory.nbytes >= DIGEST_THREADS_FROM else 1
    return blake3.blake3(memory, max_threads=threads).hexdigest()


def span_digest(buffers):
    """BLAKE3 of several buffers one after the other (hex): what :func:`buffer_digest` gives for them joined."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for buffer in buffers:
        hasher.update(memoryview(frame_buffer(buffer)).cast("B"))
    return hasher.hexdigest()


class Span(tuple):
    """``(digest, frames)``: the digest of an array or blob sent as ``frames`` frames, known to the sender."""

    __slots__ = ()

    def __new__(cls, digest, frames):
        return super().__new__(cls, (digest, frames))


def _listed_digests(buffers, known):
    """The header's ``digests``: one per buffer, a run of frames of one value under its first (then None)."""
    listed, at = [], 0
    while at < len(buffers):
        entry = known.get(at)
        digest, count = entry if isinstance(entry, Span) else (entry, 1)
        if count > 1:
            listed += [digest or span_digest(buffers[at : at + count])] + [None] * (count - 1)
        else:
            listed.append(digest or buffer_digest(buffers[at]))
        at += max(1, count)
    return listed


class StaleMessage(ProtocolError):
    """A signed message whose time is too far from the worker's clock: a replay, or clocks that differ."""


class Duplicate(ProtocolError):
    """A message already taken the other way (a request sent through its request slot and through ZeroMQ)."""


class Session:
    """Signs outgoing messages and checks incoming ones, as jupyter_client does.

    ``peer``: the worker run a client's messages are for (stamped as ``to``).
    ``me``: a worker's own run id; with it, incoming messages must name it,
    be recent, and be new.
    """

    def __init__(self, key, *, peer=None, me=None, max_skew=MAX_SKEW, remember=REMEMBER):
        if not key:
            raise ValueError("an empty key would turn message signing off; refusing it")
        self._key = key if isinstance(key, bytes) else key.encode()
        # keyed once; each message is signed by a copy: hmac.digest(key, data, "sha256") looks the digest up by
        # name and keys it again every time (82-91 us a cold signature against 50-61 us by a copy)
        self._hmac = hmac.new(self._key, digestmod="sha256")
        self.peer, self.me = peer, me
        self.max_skew = max_skew
        self._capacity = remember
        self._seen = set()
        self._order = deque()  # (signature, arrived, message time), in arrival order
        self._floor = float("-inf")  # messages older than this are refused: their signatures were forgotten
        self.refused = Counter()
        self._count_lock = threading.Lock()  # refusals are counted from the worker's loop and its threads
        self._seen_lock = threading.Lock()  # a request may be read twice at once (socket, request slot)
        self._second_way = {}  # signatures of messages taken from a request slot, whose ZeroMQ copy may come

    def sign(self, header_bytes):
        mac = self._hmac.copy()
        mac.update(header_bytes)
        return mac.hexdigest().encode()

    def pack(self, header, buffers=(), digests=None):
        """Stamp ``header`` (plain values: time, recipient, buffer digests) and sign it; buffers follow raw.

        ``digests`` maps a buffer's index to its digest where the caller has it already, or to a
        :class:`Span` where that buffer and the next ones are the frames of one array or blob.
        """
        header["time"] = time.time()
        if self.peer is not None:
            header["to"] = self.peer
        if buffers:
            header["digests"] = _listed_digests(buffers, digests or {})
        header_bytes = dumps_header(header)
        return [self.sign(header_bytes), header_bytes, *buffers]

    def unpack(self, frames, check_buffers=True, slot_of=None):
        """Inverse of :meth:`pack`: check the signature, THEN read the header, then the buffers' digests.

        ``check_buffers=False`` leaves the digests to :meth:`check_buffers` (the worker checks them on an
        executor thread, so that hashing a large frame never holds up its loop). ``slot_of``: the message
        was read from the request slot (transport/reply_slot.py) of this client, whose request it must be; its
        client may send it through ZeroMQ too, and whichever copy comes second is refused as :class:`Duplicate`,
        not counted as a replay.
        """
        if len(frames) < 2:
            self._refuse("truncated", "a message needs a signature and a header")
        signature, header_bytes = raw_bytes(frames[0]), frames[1]
        if len(signature) != 64 or len(header_bytes) > MAX_HEADER:
            self._refuse("bad_signature" if len(signature) != 64 else "oversized",
                         "a message needs a 64-digit signature and a header of at most 16 MiB")
        header_bytes = raw_bytes(header_bytes)
        if not hmac.compare_digest(signature, self.sign(header_bytes)):
            self._refuse("bad_signature", "message signature does not match the key")
        if slot_of is None and self._second_way and self._take_second_copy(signature):  # the ZeroMQ copy of
            raise Duplicate("message was taken already from its request slot")  # one read from a slot: unread
        try:
            header = loads_header(header_bytes)
        except ProtocolError as exc:
            self._refuse("malformed", str(exc))
        if not isinstance(header, dict) or not isinstance(header.get("op"), str):
            self._refuse("malformed", "header must be a dict with an 'op'")
        if slot_of is not None and header.get("client") != slot_of:  # refused before it is remembered: its
            self._refuse("slot_not_owner", "a request slot held another client's request")  # ZeroMQ copy is read
        if self.me is not None:
            self._check_fresh(header)
            self._remember(signature, header["time"], second_way=slot_of is not None)
        buffers = list(frames[2:])
        digests = header.get("digests", [])
        if not isinstance(digests, list) or len(digests) != len(buffers):
            self._refuse("bad_digest", "the header does not list one digest per buffer")
        if check_buffers:
            self.check_buffers(header, buffers)
        return header, buffers

    def check_buffers(self, header, buffers):
        """Each buffer, or each run of buffers under one digest, against its digest in the (already verified)
        header."""
        digests = header.get("digests", [])
        at = 0
        while at < len(buffers):
            digest, end = digests[at], at + 1
            while end < len(buffers) and digests[end] is None:
                end += 1
            computed = buffer_digest(frame_buffer(buffers[at])) if end == at + 1 else span_digest(buffers[at:end])
            if not isinstance(digest, str) or not hmac.compare_digest(digest, computed):
                self._refuse("bad_digest", "a buffer does not match its digest in the signed header")
            at = end

    @staticmethod
    def _seen_key(signature):
        return int(signature[:32], 16)  # 128 bits of the checked signature: a third of the memory

    def _take_second_copy(self, signature):
        """Whether this is the ZeroMQ copy of a message taken from its request slot (forgotten then)."""
        with self._seen_lock:
            return self._second_way.pop(self._seen_key(signature), False) is None

    def _remember(self, signature, sent, second_way=False):
        """Refuse a signature seen before; remember this one as long as its message could come again."""
        seen = self._seen_key(signature)
        with self._seen_lock:  # looked up and added in one step: two threads never both take one message
            if seen in self._seen:
                if second_way or self._second_way.pop(seen, False) is None:
                    raise Duplicate("message was taken already, the other way it was sent")
                self._refuse("replayed", "message was seen before (replay)")
            if second_way:
                self._second_way[seen] = None
                if len(self._second_way) > SECOND_WAY_REMEMBERED:  # copies that never came: the oldest go
                    del self._second_way[next(iter(self._second_way))]
            now = time.time()
            self._seen.add(seen)
            self._order.append((seen, now, sent))
            horizon = now - 2 * self.max_skew  # first seen before this: its time is too old by now anyway
            while self._order and (self._order[0][1] < horizon or len(self._order) > self._capacity):
                forgotten, _, forgotten_sent = self._order.popleft()
                self._seen.discard(forgotten)
                if len(self._order) >= self._capacity:  # forgotten early: nothing as old is taken from now on
                    self._floor = max(self._floor, forgotten_sent)

    def _check_fresh(self, header):
        if header.get("to") != self.me:
            self._refuse("wrong_worker", "message is for another worker run (another worker, or before a restart)")
        sent, now = header.get("time"), time.time()
        if type(sent) is not float or abs(now - sent) > self.max_skew or sent <= self._floor:
            with self._count_lock:
                self.refused["stale"] += 1
            off = f"{now - sent:+.0f} s" if type(sent) is float else "no time"
            raise StaleMessage(f"the message's time is {off} from the worker's clock (at most {self.max_skew:.0f} s "
                               "allowed): a replay, or clocks that differ (on WSL2, `wsl --shutdown` resets its clock)")

    def _refuse(self, reason, message):
        with self._count_lock:
            self.refused[reason] += 1
        raise ProtocolError(message)
