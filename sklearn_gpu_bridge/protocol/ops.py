"""The operations: every request a worker answers, its fields, buffers, reply and errors.

This table is the catalogue: the worker's two tables of operations (its
quick ops, and the work ops of ``worker/dispatch.py``) hold exactly these (a
test checks), and an op that is not here is refused. ``docs/protocol.md``
explains the rest of the wire format.

Every request header carries ``op``, ``id`` (fresh, random), ``client``
(the sender's random id; required by work ops), ``to`` (the worker run it is
for), ``time`` and ``digests`` (see :mod:`.session`), and may carry ``release``:
handles of this client to free (releases ride on the next request instead
of costing a round trip of their own; a work request's models are dropped
after its reply). Every reply carries ``op`` ("reply" or "error"), ``id``,
``parent`` (the request's id) and, for work ops, ``worker_span`` ([arrived,
replied], CLOCK_MONOTONIC seconds) and ``warnings`` ([module, category, message]
of each warning raised on the worker). An ``error`` reply carries ``mro``,
``args``, ``message`` and ``traceback`` (see :func:`errors.describe`).

Quick ops are answered at once by the worker's reading thread, even while work runs;
work ops run on its executor threads, in turn per client.
"""

from dataclasses import asdict, dataclass, fields

from ..errors import ProtocolError

PROTOCOL_VERSION = 4  # 4: one digest for the frames of one value, PLAIN per worker run (3: msgpack headers)

#: fields of a work request that carry arrays (see protocol.arrays)
_ARRAYS = ("payload: {'args': [...], 'kwargs': {...}} with array markers; arrays: their descriptors; "
           "pool: the client's pool name when arrays lie in it; out: {segment, offset, nbytes}, a pool block "
           "for the reply's arrays; reply_slot: {segment, offset, nbytes, token}, a block of the client's memfd pool "
           "where the worker also writes the signed reply (protocol.reply_slot)")


@dataclass(frozen=True)
class Op:
    kind: str  #: "quick" (the loop answers at once) or "work" (an executor thread runs it)
    request: str  #: fields of the request header beyond the common ones
    reply: str  #: fields of the reply
    buffers: str = "none"  #: raw frames after the header
    errors: str = "ProtocolError (bad fields)"


OPS = {
    "hello": Op(
        "quick",
        request="protocol_version: int; pid: int; pool: {name, kind: memfd | file, pid, segment} (optional)",
        reply="the fields of Capabilities (pool_challenge: the handshake slot the worker wrote a nonce into)",
        errors="VersionMismatch (another protocol version)",
    ),
    "attach": Op(
        "quick", request="nonce: bytes (read from the pool's handshake slot)",
        reply="pool: bool (attached); client_timeout: as in Capabilities, now that the pid may be proven",
        errors="ProtocolError (no challenge pending)",
    ),
    "ping": Op("quick", request="-", reply="busy: int (work requests queued)"),
    "status": Op(
        "quick", request="-",
        reply="backend, pid, address, uptime, handles, pools, clients, requests {op: n}, "
              "refused {reason: n}, swept {reason: n}, rss, versions, array_cache {entries, bytes, max_bytes}, "
              "pinned {pinned, budget, refused} (bytes of pools page-locked for the GPU; null without)",
    ),
    "release": Op("quick", request="release: [handle] (the common field)", reply="-"),
    "goodbye": Op("quick", request="-", reply="released: int (the client's handles, pool and arrays are freed)"),
    "shutdown": Op("quick", request="-", reply="- (the worker stops after replying)"),
    "adopt": Op(
        "quick", request="client; pool: as in hello; pid: int (from a front to the worker process of one of its "
                         "GPUs only, once the client answered the pool's challenge; refused by any other worker)",
        reply="pool: bool (attached)", errors="ProtocolError (not behind a front)",
    ),
    "fit": Op(
        "work",
        request=f"estimator: catalogue name; method: fit | fit_transform | fit_predict | partial_fit; "
                f"params: dict of plain values, or a blob marker (cloudpickle); changed: [param] (set by the "
                f"user: refused rather than dropped); params_from: 'sklearn' (accel: scikit-learn's parameters, "
                f"mapped as cuML maps them) or absent (the wrapper's, cuML's names); finite: true (optional: the "
                f"client checked every float array for NaN and inf; the estimator does not again); {_ARRAYS}",
        reply="payload: {result: the method's result (None for fit), handle: int, dropped: [param]}",
        buffers="frames of arrays; the params blob",
        errors="the estimator's own (ValueError ...); ValueError (unknown estimator, or a user-set parameter "
               "the backend lacks); NotOnWorker (accel: the worker cannot run these parameters); CacheMiss; "
               "ProtocolError",
    ),
    "call": Op(
        "work",
        request=f"handle: int (one of this client's); method: one the catalogue lists for the class; "
                f"finite: true (optional, as for fit); {_ARRAYS}",
        reply="payload: {result}",
        buffers="frames of arrays",
        errors="the estimator's own; KeyError (no such handle of this client); AttributeError (method not "
               "allowed); CacheMiss; ProtocolError",
    ),
    "attribute": Op(
        "work", request="handle: int; name: a public fitted attribute (lower case, trailing underscore)",
        reply="payload: {result}", errors="KeyError (no such handle); AttributeError",
    ),
    "echo": Op("work", request=_ARRAYS, reply="payload: {result: the args, as sent}", buffers="frames of arrays",
               errors="ProtocolError; CacheMiss"),
    "get_state": Op(
        "work", request="handle: int",
        reply="backend: the worker's; portable: bool; native: bool (which blobs follow, in that order)",
        buffers="reply: the portable form (cloudpickle of a model that needs scikit-learn only), and/or the "
                "native one (the backend's own pickle)", errors="KeyError (no such handle)",
    ),
    "set_state": Op(
        "work", request="estimator: catalogue name; form: 'portable' | 'native'; state: blob marker",
        reply="handle: int", buffers="one blob (cloudpickle of a fitted model)",
        errors="ValueError / TypeError (unknown estimator, form, or a model of another class)",
    ),
}

QUICK_OPS = frozenset(name for name, op in OPS.items() if op.kind == "quick")
WORK_OPS = frozenset(name for name, op in OPS.items() if op.kind == "work")


@dataclass(frozen=True)
class Capabilities:
    """What a worker says of itself in its hello reply; the client reads these, never raw keys."""

    protocol_version: int
    worker_id: str  #: this worker run: handles are valid only on it
    backend: str  #: "cuml" or "sklearn"
    fallback_reason: str | None  #: why an "auto" worker runs scikit-learn, if it does
    float_dtype: str | None  #: the float dtype the client should send (cuML: float32), or None
    pool: bool  #: whether the worker attached the client's pool (after ``attach``)
    pool_challenge: int | None  #: the handshake slot holding the nonce that proves the pool is the client's
    max_frame_bytes: int  #: the largest frame the worker takes (longer arrays go as several frames)
    versions: dict  #: package versions, GPU name and memory
    array_cache: int  #: bytes of arrays the worker keeps for its clients (0: none)
    client_timeout: float | None  #: seconds of silence before this client is freed (None: its pid is watched)

    def to_reply(self):
        return asdict(self)

    @classmethod
    def from_reply(cls, reply):
        try:
            return cls(**{f.name: reply[f.name] for f in fields(cls)})
        except KeyError as exc:
            raise ProtocolError(f"the worker's hello reply lacks {exc.args[0]!r}") from None
