"""Values in a message: arrays as descriptors plus raw bytes, never through pickle.

Inside a header an array is the marker ``{"__array__": i}``, described by
``header["arrays"][i]``::

    {"dtype": "<f8", "shape": [n, m], "order": "C" | "F", "where": W, ...}
    W = "inline": "data": bytes in the header      (small arrays)
    W = "frame":  "index": k  -> buffers[k]         (no shared pool; a list of k: chunks, in order)
    W = "pool":   "segment": s, "offset": o        (a block of the shared pool)
    W = "cached": "key": K                         (sent before; no bytes travel)

An array sent in full may carry ``"cache": K``, asking the worker to keep a
private copy under the key ``K`` (see :func:`fingerprint`); later requests
of the same client name it as ``"where": "cached"``. A key the worker no
longer holds is answered with :class:`CacheMiss`, and the client sends the
request again in full.

A sparse matrix (scipy.sparse, or CuPy's on a GPU worker) travels as its
arrays, never densified::

    {"__sparse__": {"format": "csr" | "csc" | "coo", "shape": [n, m], "container": "matrix" | "array",
                    "data": <array>, "indices": <array>, "indptr": <array>}}     (coo: "row", "col")

and is checked whole (index ranges, monotonic pointers) before it is used.

A blob (opaque bytes: fitted state) is ``{"__blob__": k}`` -> ``buffers[k]``
(a list of k: chunks, in order). An array or blob longer than the receiver's
largest frame (``max_frame``: a worker on TCP takes 1 MiB) travels as several
frames; so do the bytes inside the header, which go as frames once they fill
a quarter of that. Every descriptor is validated (dtype whitelist, shape x
itemsize == bytes, index and range bounds, no frame named twice) before any
byte is read or joined.

How a value is written is looked up by its type in :data:`ENCODERS` (as
dask registers serializers): a new type is a new entry, not a new branch.
"""

import math
import threading
from collections import OrderedDict

import blake3
import numpy as np

from ..errors import CacheMiss, ProtocolError
from ..parallel import PARALLEL_MIN, THREADS, all_sums_finite, copy_into, run_chunks
from .session import PLAIN_TYPES, Span, buffer_digest, frame_buffer

INLINE_MAX = 64 * 1024  # arrays up to this many bytes travel inside the header
#: the same where the message has a pool block to put them in: bytes inside the header are signed, and copied
#: by the writer, the reply slot and the reader; in the pool they are copied once
POOL_INLINE_MAX = 4 * 1024

# Plain numeric dtypes only, native (little-endian) byte order.
DTYPES = frozenset(
    np.dtype(t).str
    for t in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)
ARRAY = "__array__"
BLOB = "__blob__"
SPARSE = "__sparse__"
SPARSE_PARTS = {"csr": ("data", "indices", "indptr"), "csc": ("data", "indices", "indptr"),
                "coo": ("data", "row", "col")}


def _check_dtype(name):
    if not isinstance(name, str) or name not in DTYPES:
        raise ProtocolError(f"dtype {name!r} is not allowed")
    return np.dtype(name)


def _check_shape(shape):
    if not isinstance(shape, (list, tuple)) or len(shape) > 32:
        raise ProtocolError("shape must be a short list of integers")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise ProtocolError("shape must hold non-negative integers")
    return tuple(shape)


def _check_key(key):
    if not (isinstance(key, str) and len(key) == 32 and all(c in "0123456789abcdef" for c in key)):
        raise ProtocolError("a cache key must be 32 lower-case hex digits")
    return key


def fingerprint(dtype, shape, order, digest):
    """The cache key of an array: BLAKE3-128 of its dtype, shape, order and its bytes' ``digest``.

    Content, never identity: an array changed in place gets a new key, and a
    copy of the same data the same key. ``digest`` is the one a frame of those
    bytes carries in the signed header (:func:`.session.buffer_digest`), so an
    array that is offered to the cache and sent is hashed once.
    """
    return blake3.blake3(f"{dtype}|{tuple(shape)}|{order}|{digest}".encode()).hexdigest(length=16)


class BoundedLRU:
    """Values by key within a byte bound, least recently used first out; thread-safe.

    The one bookkeeping of the array cache on both sides: the worker keeps
    arrays under it, and the client mirrors the keys the worker keeps.
    """

    def __init__(self, max_bytes):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._entries = OrderedDict()  # key -> (value, nbytes)
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def keys(self):
        with self._lock:
            return list(self._entries)

    def get(self, key):
        """The value under ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, value, nbytes):
        with self._lock:
            self.nbytes += nbytes - self._entries.pop(key, (None, 0))[1]
            self._entries[key] = (value, nbytes)
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._entries.popitem(last=False)[1][1]

    def pop(self, key):
        """Remove ``key``; returns its value, or None."""
        with self._lock:
            value, nbytes = self._entries.pop(key, (None, 0))
            self.nbytes -= nbytes
            return value


class KnownArrays(BoundedLRU):
    """The keys of the arrays that the worker keeps for one client, as far as the client knows.

    Kept in the worker's order and within its byte bound, so that for a lone
    client it is what the worker holds. Where it is not (other clients filled
    the worker's cache, a worker restarted behind the same address), the
    worker answers CacheMiss and the request goes again in full.
    """

    def __init__(self, max_bytes, min_bytes):
        super().__init__(max_bytes)
        self.min_bytes = min_bytes

    def holds(self, key):
        return self.get(key) is not None


class AsDtype:
    """An array to send as ``dtype``: cast on its way into the pool, in one pass (float64 -> float32).

    A value too large for ``dtype`` raises scikit-learn's own message for it,
    naming ``name``.
    """

    __slots__ = ("array", "dtype", "name")

    def __init__(self, array, dtype, name="X"):
        self.array, self.dtype, self.name = array, np.dtype(dtype), name


class Unchecked(np.ndarray):
    """A validated float array whose finite check is left to the copy that sends it.

    Checking a large array and then copying it into the pool reads it twice;
    the encoder sums each block as it copies it instead, in one pass. Where it
    is not copied (frames), it is summed first. ``on_failure(array)`` words
    the error (scikit-learn's own check, which may also let NaN pass).
    """

    on_failure = None

    def __array_finalize__(self, obj):
        self.on_failure = getattr(obj, "on_failure", None)


def defer_finite_check(array, on_failure):
    """``array`` as an :class:`Unchecked` view (no copy): checked by the copy that sends it."""
    view = array.view(Unchecked)
    view.on_failure = on_failure
    return view


def check_finite_now(array):
    """A plain ndarray of ``array``, its deferred check run now: before a conversion that would lose the mark
    (``scipy.sparse.csr_matrix``), so that nothing unchecked is sent as checked."""
    if not isinstance(array, Unchecked):
        return array
    plain = array.view(np.ndarray)
    if not all_sums_finite(plain):
        array.on_failure(plain)
    return plain


# ---------------------------------------------------------------- writing


class Encoder:
    """Turns the values inside a payload into plain values, descriptors and frames for one message.

    ``place(nbytes)`` returns ``(segment, offset, writable memoryview)`` for a
    block of the pool, or None when the array must go as a frame. Arrays up to
    ``inline_max`` bytes go inside the header: by default :data:`POOL_INLINE_MAX`
    with a ``place``, else :data:`INLINE_MAX`. ``cache``
    (a :class:`KnownArrays`) turns fingerprints on; with ``reuse=False`` every
    array is sent in full (the resend after a :class:`CacheMiss`). ``reused``
    and ``offered`` list the ``(key, nbytes)`` sent as cached and sent to be kept.
    ``host_buffer(nbytes)`` gives the writable uint8 buffer a device array that
    goes as frames is copied into (None: new memory each time).
    """

    def __init__(self, place=None, inline_max=None, cache=None, reuse=True, max_frame=None, host_buffer=None):
        self.place = place
        self.host_buffer = host_buffer
        if inline_max is None:
            inline_max = INLINE_MAX if place is None else POOL_INLINE_MAX
        self.inline_max = inline_max
        self.max_frame = max_frame  # the receiver's largest frame: longer arrays and blobs go as several
        # bytes inside the header, all arrays together: the header is one frame, and must stay well within one
        self.inline_left = max_frame // 4 if max_frame else None
        self.cache = cache
        self.reuse = reuse
        self.arrays = []
        self.buffers = []
        # buffer index -> its digest where known already (a cache key's), or a session.Span: the frames of one value
        self.digests = {}
        self.counts = {}  # arrays per path (a dict: a Counter's methods are Python calls)
        self.reused = []
        self.offered = []

    def encode(self, value):
        write = _encoder_for(value)
        return write(self, value) if write is not None else value

    def blob(self, data):
        indexes = self._frames(memoryview(data).cast("B"), None)
        return {BLOB: indexes[0] if len(indexes) == 1 else indexes}

    def _frames(self, raw, content):
        """Append ``raw`` (flat bytes) as frames of at most ``max_frame``; their indexes. Several frames carry one
        digest of them all (``content`` if known), hashed here on all cores while the bytes lie together."""
        nbytes = raw.nbytes
        step = self.max_frame or nbytes or 1
        first = len(self.buffers)
        self.buffers.extend(raw[at : at + step] for at in range(0, max(nbytes, 1), step))
        count = len(self.buffers) - first
        if count > 1:
            self.digests[first] = Span(content or buffer_digest(raw), count)
        elif content is not None:
            self.digests[first] = content  # hashed for the cache key already
        return list(range(first, first + count))

    def _marker(self, desc):
        self.counts[desc["where"]] = self.counts.get(desc["where"], 0) + 1
        self.arrays.append(desc)
        return {ARRAY: len(self.arrays) - 1}

    def array(self, arr, dtype=None, name="X"):
        """The marker of ``arr`` (sent as ``dtype`` if given), its bytes placed inline, in the pool or as a frame."""
        on_failure = None
        if isinstance(arr, Unchecked):
            on_failure, arr = arr.on_failure, arr.view(np.ndarray)
        if arr.dtype.str not in DTYPES:
            native = arr.dtype.newbyteorder("=")
            if arr.dtype.hasobject or native.str not in DTYPES:
                raise TypeError(f"arrays of dtype {arr.dtype} cannot be sent to the worker")
            arr = arr.astype(native)
        target = np.dtype(dtype) if dtype is not None else arr.dtype
        if arr.flags.c_contiguous:
            order = "C"
        elif arr.flags.f_contiguous:
            order = "F"
        else:
            arr, order = np.ascontiguousarray(arr), "C"
        spot = content = None
        if on_failure is not None:  # copied into the pool: checked on the way; anywhere else: first
            spot = self.place(arr.size * target.itemsize) if self.place is not None and self.cache is None \
                and arr.size * target.itemsize > self.inline_max else None
            if spot is None and not all_sums_finite(arr):
                on_failure(arr)
        if target != arr.dtype and (self.cache is not None or arr.size * target.itemsize <= self.inline_max):
            arr = _cast(arr, target, order, name)  # these paths need the cast array itself
        desc = {"dtype": target.str, "shape": list(arr.shape), "order": order}
        nbytes = arr.size * target.itemsize
        if self.cache is not None and nbytes >= self.cache.min_bytes:
            content = buffer_digest(_raw(arr))
            key = fingerprint(target.str, arr.shape, order, content)
            if self.reuse and self.cache.holds(key):
                self.reused.append((key, nbytes))
                return self._marker({**desc, "where": "cached", "key": key})
            self.offered.append((key, nbytes))
            desc["cache"] = key
        if nbytes <= self.inline_max and (self.inline_left is None or nbytes <= self.inline_left):
            if self.inline_left is not None:
                self.inline_left -= nbytes
            return self._marker({**desc, "where": "inline", "data": _raw(arr).tobytes()})
        if spot is None and self.place is not None:
            spot = self.place(nbytes)
        if spot is not None:
            segment, offset, memory = spot
            dest = np.frombuffer(memory, target, count=arr.size).reshape(arr.shape, order=order)
            if not _copy_checked(dest, arr, name, check_finite=on_failure is not None):
                on_failure(arr)  # raises (nothing is sent), or lets NaN pass where the estimator allows it
            return self._marker({**desc, "where": "pool", "segment": segment, "offset": offset})
        if target != arr.dtype:
            arr = _cast(arr, target, order, name)
        indexes = self._frames(_raw(arr), content)
        return self._marker({**desc, "where": "frame", "index": indexes[0] if len(indexes) == 1 else indexes})

    def sparse(self, matrix, dtype=None, name="X"):
        """A sparse matrix as its arrays (its data sent as ``dtype`` if given); CuPy's come to the host first."""
        if not type(matrix).__module__.startswith("scipy"):
            matrix = matrix.get()  # cupyx.scipy.sparse
        fmt = matrix.format if matrix.format in SPARSE_PARTS else "csr"
        if fmt != matrix.format:
            matrix = matrix.asformat(fmt)
        container = "array" if type(matrix).__name__.endswith("_array") else "matrix"
        parts = {part: getattr(matrix, part) for part in SPARSE_PARTS[fmt]}
        out = {"format": fmt, "shape": list(matrix.shape), "container": container}
        for part, values in parts.items():
            out[part] = self.array(np.asarray(values), dtype if part == "data" else None, name)
        return {SPARSE: out}

    def device_array(self, arr):
        """A CuPy array: copied from the device straight into its pool block when it has one, else into a
        ``host_buffer`` (reused, page-locked memory on a worker) when there is one."""
        nbytes = arr.nbytes
        order = "C" if arr.flags.c_contiguous else "F" if arr.flags.f_contiguous else None
        dtype = np.dtype(arr.dtype)
        spot = None
        if order and nbytes > self.inline_max and dtype.str in DTYPES and self.place is not None:
            spot = self.place(nbytes)
        if spot is None and order and dtype.str in DTYPES and self.host_buffer is not None:
            host = np.frombuffer(self.host_buffer(nbytes), dtype, count=arr.size).reshape(arr.shape, order=order)
            return self.array(arr.get(out=host))
        if spot is None:
            return self.array(arr.get())
        segment, offset, memory = spot
        arr.get(out=np.frombuffer(memory, dtype, count=arr.size).reshape(arr.shape, order=order))
        return self._marker({"dtype": dtype.str, "shape": list(arr.shape), "order": order,
                             "where": "pool", "segment": segment, "offset": offset})


def _raw(arr):
    """A contiguous array's bytes as a flat uint8 view (no copy)."""
    return arr.ravel(order="K").view(np.uint8)


def _overflow(name, dtype):
    return ValueError(f"Input {name} contains infinity or a value too large for {dtype!r}.")


def _cast(arr, dtype, order, name):
    """``arr`` as ``dtype`` in a new array of ``order``, cast on all cores where it is large (a 400 MB float64
    X takes 70 ms in one thread on an H200 host); an overflow is said in scikit-learn's words."""
    if not arr.flags[f"{order}_CONTIGUOUS"]:  # copy_into flattens both arrays alike: one layout only
        try:
            with np.errstate(over="raise"):
                return arr.astype(dtype, order=order)
        except FloatingPointError:  # finite before (validated), infinite after: scikit-learn's words
            raise _overflow(name, dtype) from None
    cast = np.empty(arr.shape, dtype, order=order)
    _copy_checked(cast, arr, name)
    return cast


def _copy_checked(dest, src, name, check_finite=False):
    """Copy (casting); with ``check_finite``, whether the copy sums finite (else True)."""
    try:
        return copy_into(dest, src, check_finite=check_finite) is not False
    except FloatingPointError:
        raise _overflow(name, dest.dtype) from None


def _encode_sequence(encoder, value):
    return type(value)(encoder.encode(v) for v in value)


def _encode_dict(encoder, value):
    return {k: encoder.encode(v) for k, v in value.items()}


def _encode_as_dtype(encoder, value):
    write = encoder.sparse if is_sparse(value.array) else encoder.array
    return write(value.array, value.dtype, value.name)


def is_sparse(value):
    """scipy.sparse or cupyx.scipy.sparse, told without importing either."""
    return getattr(value, "format", None) in ("csr", "csc", "coo", "bsr", "dia", "lil", "dok") \
        and hasattr(value, "tocoo")


#: how a value of each type is written (the type's MRO is searched, first match wins)
ENCODERS = {
    np.ndarray: Encoder.array,
    AsDtype: _encode_as_dtype,
    np.generic: lambda encoder, v: v.item(),
    list: _encode_sequence,
    tuple: _encode_sequence,
    dict: _encode_dict,
}


def _encoder_for(value):
    kind = type(value)
    write = ENCODERS.get(kind)  # the exact type first: a plain dict, list or ndarray is no sparse matrix
    if write is not None or kind in PLAIN_TYPES:
        return write
    if is_sparse(value):  # before the types' bases: a DOK matrix is also a dict
        return Encoder.sparse
    for cls in type(value).__mro__:
        write = ENCODERS.get(cls)
        if write is not None:
            return write
    if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):  # CuPy, without importing it
        return Encoder.device_array
    return None


# ---------------------------------------------------------------- reading


class Decoder:
    """Inverse of :class:`Encoder`: rebuilds values from a header and its buffers.

    ``read_pool(segment, offset, nbytes)`` returns a bounds-checked memoryview.
    Arrays are views of the frames or the pool (no copy) unless ``writeable``
    asks for arrays the caller may modify. ``cache`` (the worker's arrays of
    this client: ``get(key)``, and ``put(key, arr)`` that returns the kept
    private copy) serves "cached" arrays and keeps those sent with "cache".
    ``landing(nbytes)`` gives the writable uint8 buffer a value sent as
    several frames is joined into (None: a new one each time).
    """

    def __init__(self, header, buffers, read_pool=None, writeable=False, cache=None, landing=None):
        self.arrays = header.get("arrays", [])
        if not isinstance(self.arrays, list):
            raise ProtocolError("'arrays' must be a list")
        self.buffers = buffers
        self.read_pool = read_pool
        self.writeable = writeable
        self.cache = cache
        self.landing = landing
        self.counts = {}  # arrays per path
        self._used = set()  # buffers taken by an array or blob: none is taken twice (nor joined twice)

    def decode(self, value):
        if isinstance(value, dict):
            if len(value) == 1 and ARRAY in value:
                return self._array(value[ARRAY])
            if len(value) == 1 and BLOB in value:
                return self._frames(value[BLOB])
            if len(value) == 1 and SPARSE in value:
                return self._sparse(value[SPARSE])
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.decode(v) for v in value)
        return value

    def _sparse(self, desc):
        """A scipy sparse matrix from its arrays, checked whole before anyone computes with it."""
        import scipy.sparse

        if not isinstance(desc, dict) or desc.get("format") not in SPARSE_PARTS:
            raise ProtocolError("a sparse matrix needs a format: csr, csc or coo")
        fmt, shape = desc["format"], _check_shape(desc.get("shape"))
        if len(shape) != 2:
            raise ProtocolError("a sparse matrix has two dimensions")
        parts = []
        for part in SPARSE_PARTS[fmt]:
            marker = desc.get(part)
            if not (isinstance(marker, dict) and set(marker) == {ARRAY}):
                raise ProtocolError(f"the sparse matrix's {part} must be an array")
            values = self._array(marker[ARRAY])
            if values.ndim != 1 or (part != "data" and values.dtype.kind not in "iu"):
                raise ProtocolError(f"the sparse matrix's {part} must be a 1-d array (of integers, but data)")
            parts.append(values)
        kind = {"matrix": "_matrix", "array": "_array"}.get(desc.get("container", "matrix"))
        if kind is None:
            raise ProtocolError("a sparse container is 'matrix' or 'array'")
        build = getattr(scipy.sparse, fmt + kind)
        try:
            if fmt == "coo":
                data, row, col = parts
                if not (len(data) == len(row) == len(col)) or (len(row) and (
                        row.min() < 0 or row.max() >= shape[0] or col.min() < 0 or col.max() >= shape[1])):
                    raise ValueError("row or column out of range")
                matrix = build((data, (row, col)), shape=shape, copy=True)
            else:  # copied: scipy and scikit-learn sort and sum a sparse matrix's arrays in place
                matrix = build(tuple(parts), shape=shape, copy=True)
                matrix.check_format(full_check=True)
        except (ValueError, TypeError, IndexError) as exc:
            raise ProtocolError(f"a malformed {fmt} matrix: {exc}") from None
        return matrix

    def _buffer_at(self, index):
        if type(index) is not int or not 0 <= index < len(self.buffers):
            raise ProtocolError(f"buffer index {index!r} out of range")
        return self.buffers[index]

    def _frames(self, index, nbytes=None):
        """One frame's memory (no copy), or several joined in order (one copy); ``nbytes``: what they must hold
        together, checked before anything is joined. A frame taken before (by this value or another) is refused:
        a message of one frame named a thousand times would otherwise be joined a thousand times."""
        indexes = index if isinstance(index, list) else [index]
        if not indexes or len(indexes) > len(self.buffers):
            raise ProtocolError("an array's frame list is empty or longer than the message")
        parts = [frame_buffer(self._buffer_at(i)) for i in indexes]
        if len(set(indexes)) != len(indexes) or not self._used.isdisjoint(indexes):
            raise ProtocolError("a frame is named twice in one message")
        total = sum(part.nbytes for part in parts)
        if nbytes is not None and total != nbytes:
            raise ProtocolError("frame size does not match its shape")
        self._used.update(indexes)
        return parts[0] if len(parts) == 1 else _join(parts, total, self.landing)

    def _array(self, index):
        if type(index) is not int or not 0 <= index < len(self.arrays):
            raise ProtocolError(f"array index {index!r} out of range")
        desc = self.arrays[index]
        if not isinstance(desc, dict):
            raise ProtocolError("array descriptor must be a dict")
        dtype = _check_dtype(desc.get("dtype"))
        shape = _check_shape(desc.get("shape"))
        order = desc.get("order")
        if order not in ("C", "F"):
            raise ProtocolError(f"order {order!r} is not C or F")
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        where = desc.get("where")
        if where == "cached":
            arr = self._cached(_check_key(desc.get("key")), dtype, shape, order)
        elif where == "inline":
            data = desc.get("data")
            if not isinstance(data, bytes) or len(data) != nbytes:
                raise ProtocolError("inline array size does not match its shape")
        elif where == "frame":
            data = self._frames(desc.get("index"), nbytes)
        elif where == "pool":
            if self.read_pool is None:
                raise ProtocolError("array names the pool, but no pool is attached")
            data = self.read_pool(desc.get("segment"), desc.get("offset"), nbytes)
        else:
            raise ProtocolError(f"unknown array location {where!r}")
        if where != "cached":
            arr = np.frombuffer(data, dtype=dtype, count=count) if count else np.empty(0, dtype)
            arr = arr.reshape(shape, order=order)
            if "cache" in desc:
                key = _check_key(desc["cache"])
                if self.cache is not None:
                    arr = self.cache.put(key, arr)
        self.counts[where] = self.counts.get(where, 0) + 1
        if self.writeable and not arr.flags.writeable:
            arr = arr.copy(order="K")
        elif not self.writeable:
            arr.flags.writeable = False
        return arr

    def _cached(self, key, dtype, shape, order):
        arr = self.cache.get(key) if self.cache is not None else None
        if arr is None:
            raise CacheMiss(f"the worker holds no array {key} (evicted, or another worker): send it again")
        if arr.dtype != dtype or arr.shape != shape or not arr.flags[f"{order}_CONTIGUOUS"]:
            raise ProtocolError(f"the cached array {key} is not of the dtype, shape and order described")
        return arr


def _join(parts, total, landing=None):
    """The frames of one value in one buffer (the one copy of a value sent in several frames), from ``landing``
    where given; large ones on all cores, a run of whole frames each."""
    joined = np.empty(total, np.uint8) if landing is None else landing(total)
    ends = np.cumsum([part.nbytes for part in parts])

    def copy(first, last):
        for k in range(first, last):
            joined[ends[k] - parts[k].nbytes : ends[k]] = np.frombuffer(parts[k], np.uint8)

    threads = min(THREADS, len(parts)) if total >= PARALLEL_MIN else 1
    if threads == 1:
        copy(0, len(parts))
    else:
        step = -(-len(parts) // threads)
        run_chunks(copy, [(at, min(at + step, len(parts))) for at in range(0, len(parts), step)])
    return memoryview(joined)
