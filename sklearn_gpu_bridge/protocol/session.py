"""Framing and signing: a message is ``[signature, header, *buffers]``.

- ``header`` is a pickle (protocol 5, written without a memo) of a dict made
  only of plain builtins (None, bool, int, float, str, bytes, tuple, list,
  dict). It is read only after its signature checks, and then only if every
  opcode is one that builds such a value (no globals, no calls, no memo
  references): even a signed header cannot name a class or a function, make a
  value that refers to itself, or make the reader allocate more than the
  header's own size suggests.
- ``signature`` is the hex HMAC-SHA256 of the header bytes under the shared
  key, compared in constant time (as jupyter_client does). A signature seen
  before is a replay and is refused; every header carries a fresh random
  ``id``, so no honest message repeats one.
- ``buffers`` are raw bytes: arrays as zero-copy frames, and opaque blobs
  that only the operation expecting one ever reads (see :mod:`.arrays`).

:meth:`Session.pack` writes this format and :meth:`Session.unpack` is its
exact inverse.
"""

import hashlib
import hmac
import io
import os
import pickle
import pickletools
from collections import Counter, deque

import numpy as np

from ..errors import ProtocolError

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


def loads_header(data):
    """Unpickle a header that may hold plain builtins only, after checking every opcode."""
    try:
        for opcode, _, _ in pickletools.genops(data):
            if opcode.name not in PLAIN_OPCODES:
                raise ProtocolError(f"header uses the pickle opcode {opcode.name}; only plain values are allowed")
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


class Session:
    """Signs outgoing headers and checks incoming ones, as jupyter_client does."""

    def __init__(self, key, replay_window=1 << 16):
        if not key:
            raise ValueError("an empty key would turn message signing off; refusing it")
        self._key = key if isinstance(key, bytes) else key.encode()
        self._seen = set()
        self._order = deque()
        self._window = replay_window
        self.refused = Counter()

    def sign(self, header_bytes):
        return hmac.new(self._key, header_bytes, hashlib.sha256).hexdigest().encode()

    def pack(self, header, buffers=()):
        """Serialize ``header`` (plain values) and sign it; buffers follow raw."""
        header_bytes = dumps_header(header)
        return [self.sign(header_bytes), header_bytes, *buffers]

    def unpack(self, frames):
        """Inverse of :meth:`pack`: check the signature, THEN unpickle the header."""
        if len(frames) < 2:
            self._refuse("truncated", "a message needs a signature and a header")
        signature, header_bytes = raw_bytes(frames[0]), raw_bytes(frames[1])
        if not hmac.compare_digest(signature, self.sign(header_bytes)):
            self._refuse("bad_signature", "message signature does not match the key")
        seen = int(signature[:32], 16)  # 128 bits of the checked signature: a third of the memory
        if seen in self._seen:
            self._refuse("replayed", "message was seen before (replay)")
        self._seen.add(seen)
        self._order.append(seen)
        if len(self._order) > self._window:
            self._seen.discard(self._order.popleft())
        try:
            header = loads_header(header_bytes)
        except ProtocolError as exc:
            self._refuse("malformed", str(exc))
        if not isinstance(header, dict) or not isinstance(header.get("op"), str):
            self._refuse("malformed", "header must be a dict with an 'op'")
        return header, list(frames[2:])

    def _refuse(self, reason, message):
        self.refused[reason] += 1
        raise ProtocolError(message)
