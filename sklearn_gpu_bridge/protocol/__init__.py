"""The wire protocol, written down once: shared by the client and the worker.

- :mod:`.ops`: the catalogue of operations (fields, buffers, replies, errors)
  and the worker's capabilities.
- :mod:`.session`: a message's frames, its signature, and plain headers.
- :mod:`.arrays`: arrays and blobs inside a message (inline, frames, the pool).

``docs/protocol.md`` walks through a request end to end.
"""

from .arrays import (
    DTYPES,
    INLINE_MAX,
    POOL_INLINE_MAX,
    AsDtype,
    BoundedLRU,
    Decoder,
    Encoder,
    KnownArrays,
    fingerprint,
)
from .ops import OPS, PROTOCOL_VERSION, QUICK_OPS, WORK_OPS, Capabilities, Op
from .session import Session, dumps_header, loads_header, new_id, to_plain

__all__ = [
    "DTYPES", "INLINE_MAX", "OPS", "POOL_INLINE_MAX", "PROTOCOL_VERSION", "QUICK_OPS", "WORK_OPS", "AsDtype",
    "BoundedLRU", "Capabilities", "Decoder", "Encoder", "KnownArrays", "Op", "Session", "dumps_header", "fingerprint",
    "loads_header", "new_id", "to_plain",
]
