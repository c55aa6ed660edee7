"""Framing and signing: a message is ``[signature, header, *buffers]``.

- ``header`` is a pickle (protocol 5, written without a memo) of a dict made
  only of plain builtins (None, bool, int, float, str, bytes, tuple, list,
  dict). It is read only after its signature checks; a worker reads it only if
  every opcode is one that builds such a value (no globals, no calls, no memo
  references): even a signed request cannot name a class or a function, make a
  value that refers to itself, or make the worker allocate more than the
  header's own size suggests. A client reads its worker's replies without the
  opcode scan (globals are still refused: see :func:`loads_header`).
- ``signature`` is the hex HMAC-SHA256 of the header bytes under the shared
  key, compared in constant time (as jupyter_client does).
- ``buffers`` are raw bytes: arrays as zero-copy frames, and opaque blobs
  that only the operation expecting one ever reads (see :mod:`.arrays`).
  The header carries a BLAKE3 digest of each (``digests``), so the
  signature covers every frame.

Every header also carries ``time`` (seconds since the epoch) and, from a
client, ``to``: the id of the worker run it is meant for. A worker's session
(``me=`` its id) refuses a message for another run (a restart with the same
key, another worker), one whose time is more than ``max_skew`` seconds from
its clock, and one it has seen before (a replay); every header carries a
fresh random ``id``, so no honest message repeats one.

:meth:`Session.pack` writes this format and :meth:`Session.unpack` is its
exact inverse.
"""

import hashlib
import hmac
import io
import os
import pickle
import pickletools
import threading
import time
from collections import Counter, deque

import blake3
import numpy as np

from ..errors import ProtocolError

MAX_SKEW = 300.0  # seconds a message's time may be from the worker's clock
REMEMBER = 1 << 20  # signatures a worker keeps to refuse replays (those older than 2 x MAX_SKEW go first)
MAX_HEADER = 16 << 20  # bytes: a longer header is refused before its signature is computed
DIGEST_THREADS_FROM = 1 << 20  # bytes: from this size a buffer is hashed on all cores
SECOND_WAY_REMEMBERED = 4096  # messages taken from request slots whose ZeroMQ copies may come (most never do)
PLAIN_TYPES = (type(None), bool, int, float, str, bytes)

# The opcodes that build plain values. Left out on purpose: globals, calls and
# object building (GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ ...), and memo
# references (GET, BINGET, PUT ...): a memo index of 2**30 makes CPython's
# unpickler allocate and zero gigabytes, and references would let a header of
# a few bytes be a list that contains itself, or 2**n leaves deep.
PLAIN_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE",
    "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8",
    "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT", "SETITEM", "SETITEMS",
    "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE",
})


def _step(opcode):
    """How :func:`check_plain_opcodes` steps over an opcode: its bytes with a fixed-size argument (> 0); the
    bytes of the little-endian length that comes before a sized argument, negated; 0 for STOP."""
    if opcode.name == "STOP":
        return 0
    size = opcode.arg.n if opcode.arg is not None else 0
    if size >= 0:
        return 1 + size
    return -{pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,  # LONG4's length is signed:
             pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}[size]  # < 0 reads > 16 MiB


#: the byte of each plain opcode -> :func:`_step` (from pickletools' own table of opcodes)
_PLAIN_STEPS = {ord(op.code): _step(op) for op in pickletools.opcodes if op.name in PLAIN_OPCODES}


def check_plain_opcodes(data):
    """Raise ProtocolError unless every opcode of the pickle ``data``, up to its STOP, is in PLAIN_OPCODES.

    The unpickler reads the same opcodes in the same order: it steps over their arguments as this does
    (a length that would run past the end refuses the header). ``pickletools.genops`` would say the same
    at two to three times the cost (``benchmarks/client_checks.py``): it decodes every argument, where
    stepping over it is enough.
    """
    steps, at, end = _PLAIN_STEPS, 0, len(data)
    while at < end:
        step = steps.get(data[at])
        if step is None:
            opcode = pickletools.code2op.get(chr(data[at]))
            raise ProtocolError(f"header uses the pickle opcode {opcode.name if opcode else hex(data[at])}; "
                                "only plain values are allowed")
        if step > 0:
            at += step
        elif step < 0:
            at += 1 - step + int.from_bytes(data[at + 1 : at + 1 - step], "little")
        else:
            return
    raise ProtocolError("header is not a valid pickle: it ends before its STOP")


def new_id():
    """A fresh random message (or client, or worker) id: 96 bits, hex."""
    return os.urandom(12).hex()


def to_plain(value):
    """``value`` with numpy scalars made Python ones, or raise TypeError if not plain."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, PLAIN_TYPES):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(v) for v in value)
    if isinstance(value, dict):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise ProtocolError(f"header names {module}.{name}; only plain values are allowed")


def dumps_header(header):
    """Pickle a header of plain values, without a memo (so no opcode refers back)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True  # no memo: shared objects are written twice; a cycle is refused
    pickler.dump(header)
    return buffer.getvalue()


def loads_header(data, check_opcodes=True):
    """Unpickle a header that may hold plain builtins only, after checking every opcode.

    ``check_opcodes=False`` (a client reading its worker's replies) leaves out
    the opcode scan, which costs more than the unpickling (about 40 us of 45
    for a reply): globals stay refused, but a signed reply could still make
    this process allocate, which its worker can do anyway by sending arrays.
    """
    try:
        if check_opcodes:
            check_plain_opcodes(data)
        return _PlainUnpickler(io.BytesIO(data)).load()
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"header is not a valid pickle: {type(exc).__name__}") from None


def raw_bytes(frame):
    """A received frame's bytes (a zmq.Frame or bytes)."""
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def frame_buffer(frame):
    """A received frame's memory, without a copy."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def buffer_digest(buffer):
    """BLAKE3 of a buffer (hex), hashed where it lies; large ones on all cores, without the GIL.

    BLAKE3 rather than SHA-256: on the 2-core VM of the benchmarks it hashes a
    51 MB frame in 9 to 11 ms against SHA-256's 17.5 ms on both cores, and each
    frame is hashed twice (sender, receiver); see docs/reliability.md.
    """
    memory = memoryview(buffer).cast("B")
    threads = blake3.blake3.AUTO if memory.nbytes >= DIGEST_THREADS_FROM else 1
    return blake3.blake3(memory, max_threads=threads).hexdigest()


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
        return hmac.new(self._key, header_bytes, hashlib.sha256).hexdigest().encode()

    def pack(self, header, buffers=(), digests=None):
        """Stamp ``header`` (plain values: time, recipient, buffer digests) and sign it; buffers follow raw.

        ``digests`` maps a buffer's index to its digest where the caller has it already.
        """
        header["time"] = time.time()
        if self.peer is not None:
            header["to"] = self.peer
        if buffers:
            known = digests or {}
            header["digests"] = [known.get(i) or buffer_digest(b) for i, b in enumerate(buffers)]
        header_bytes = dumps_header(header)
        return [self.sign(header_bytes), header_bytes, *buffers]

    def unpack(self, frames, check_buffers=True, slot_of=None):
        """Inverse of :meth:`pack`: check the signature, THEN unpickle the header, then the buffers' digests.

        ``check_buffers=False`` leaves the digests to :meth:`check_buffers` (the worker checks them on an
        executor thread, so that hashing a large frame never holds up its loop). ``slot_of``: the message
        was read from the request slot (protocol.reply_slot) of this client, whose request it must be; its
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
        try:  # a worker (``me``) checks every opcode its clients send; a client trusts its worker that far
            header = loads_header(header_bytes, check_opcodes=self.me is not None)
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
        """Each buffer against its digest in the (already verified) header."""
        for digest, buffer in zip(header.get("digests", []), buffers):
            if not isinstance(digest, str) or not hmac.compare_digest(digest, buffer_digest(frame_buffer(buffer))):
                self._refuse("bad_digest", "a buffer does not match its digest in the signed header")

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
