"""The wire format: signing, the plain-values header, and arrays as descriptors.

In-process tests pin down :class:`Session`, :class:`Encoder` and
:class:`Decoder`; the rest go through the real worker of the session, both
through the client and through a raw DEALER socket that sends descriptors the
client would never write.
"""

import hmac
import os
import pickle
import random
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import msgpack
import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.protocol import (
    DTYPES,
    INLINE_MAX,
    POOL_INLINE_MAX,
    Decoder,
    Encoder,
    Session,
    dumps_header,
    loads_header,
    new_id,
)
from sklearn_gpu_bridge.protocol.session import MAX_TUPLE_DEPTH, StaleMessage
from sklearn_gpu_bridge.shm import Pool, PoolAttachment, PoolError

from .conftest import RawClient, nested_tuples

KEY = os.urandom(32)
RECV_TIMEOUT_MS = 5000


WORKER = "w" * 24  # the worker run these tests' messages are for


def _message(session, **header):
    return session.pack({"op": "ping", "id": new_id(), **header})


def _pair(**receiver):
    """(a client's session, a worker's session) with the same key."""
    return Session(KEY, peer=WORKER), Session(KEY, me=WORKER, **receiver)


# ---------------------------------------------------------------- Session


def test_sign_unpack_round_trip():
    sender, receiver = _pair()
    frames = sender.pack({"op": "fit", "id": new_id(), "params": {"C": 1.5, "k": [1, (2, None)]}}, [b"raw"])
    header, buffers = receiver.unpack(frames)
    assert header["op"] == "fit" and header["to"] == WORKER
    assert header["params"] == {"C": 1.5, "k": [1, (2, None)]}
    assert [bytes(b) for b in buffers] == [b"raw"]
    assert not receiver.refused


def test_key_given_as_str_signs_like_bytes():
    frames = Session("secret").pack({"op": "ping", "id": new_id()})
    assert Session(b"secret").unpack(frames)[0]["op"] == "ping"


def test_the_signature_is_hmac_sha256_of_the_header_from_any_thread():
    """docs/protocol.md's signature: hex HMAC-SHA256 of the header bytes under the key, whoever computes it (a peer
    of another version or language). The session keys one HMAC and signs by copies of it; threads sign at once."""
    key, headers = os.urandom(32), [os.urandom(n) for n in (0, 1, 64, 600, 70_000)]
    session = Session(key)
    expected = [hmac.new(key, h, "sha256").hexdigest().encode() for h in headers]
    assert [session.sign(h) for h in headers] == expected
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(session.sign, headers * 200)) == expected * 200


@pytest.mark.parametrize("key", [b"", "", None])
def test_empty_key_is_refused(key):
    with pytest.raises(ValueError, match="empty key"):
        Session(key)


def test_wrong_key_is_refused():
    _, receiver = _pair()
    with pytest.raises(ProtocolError, match="signature"):
        receiver.unpack(_message(Session(b"another key", peer=WORKER)))
    assert receiver.refused == {"bad_signature": 1}


def test_tampered_header_is_refused():
    sender, receiver = _pair()
    signature, header = _message(sender, handle=1)
    tampered = header.replace(b"ping", b"stop")
    assert tampered != header
    with pytest.raises(ProtocolError, match="signature"):
        receiver.unpack([signature, tampered])
    assert receiver.refused == {"bad_signature": 1}


@pytest.mark.parametrize("where", [0, 1 << 19, -1])
@pytest.mark.parametrize("size", [100, 20 << 20])  # one digest; a digest of parallel chunks
def test_a_buffer_changed_after_signing_is_refused(where, size):
    """The signature covers every frame: one byte of an array frame flipped is caught."""
    sender, receiver = _pair()
    data = bytearray(os.urandom(size))
    frames = sender.pack({"op": "echo", "id": new_id()}, [bytes(data)])
    assert len(_pair()[1].unpack(list(frames))[1]) == 1
    data[where % size] ^= 1
    with pytest.raises(ProtocolError, match="digest"):
        receiver.unpack([frames[0], frames[1], bytes(data)])
    with pytest.raises(ProtocolError, match="digest"):  # a frame added, or one left out
        receiver.unpack([*_message(sender), b"extra"])
    assert receiver.refused == {"bad_digest": 2}


def test_a_message_for_another_worker_run_is_refused():
    """A restarted worker with the same --key-file, or another worker: its messages are not this run's."""
    _, receiver = _pair()
    for sender in (Session(KEY, peer="x" * 24), Session(KEY)):
        with pytest.raises(ProtocolError, match="another worker run"):
            receiver.unpack(_message(sender))
    assert receiver.refused == {"wrong_worker": 2}


@pytest.mark.parametrize("skew", [-400.0, 400.0])
def test_a_message_from_too_long_ago_or_ahead_is_refused(skew, monkeypatch):
    sender, receiver = _pair()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    frames = _message(sender)
    monkeypatch.setattr(time, "time", real)
    with pytest.raises(StaleMessage, match="clock"):
        receiver.unpack(frames)
    assert receiver.refused == {"stale": 1}


@pytest.mark.parametrize(
    "header_bytes",
    [
        b"\xc1garbage",  # not msgpack
        b"",  # empty
        msgpack.packb(["op", "ping"]),  # not a dict
        msgpack.packb({"id": "x"}),  # no op
        msgpack.packb({"op": 3}),  # op not a str
        msgpack.packb({"op": "ping"})[:-3],  # cut short
        msgpack.packb({"op": "ping"}) + b"\xc0",  # more after the header
        pickle.dumps({"op": "ping", "id": new_id()}, protocol=5),  # the format of protocol 2
    ],
    ids=["garbage", "empty", "list", "no-op", "int-op", "cut", "extra", "pickle"],
)
def test_signed_garbage_header_is_malformed(header_bytes):
    sender, receiver = _pair()
    with pytest.raises(ProtocolError):
        receiver.unpack([sender.sign(header_bytes), header_bytes])
    assert receiver.refused == {"malformed": 1}


@pytest.mark.parametrize("frames", [[], [b"only one frame"]], ids=["none", "one"])
def test_truncated_message_is_refused(frames):
    receiver = Session(KEY)
    with pytest.raises(ProtocolError, match="signature and a header"):
        receiver.unpack(frames)
    assert receiver.refused == {"truncated": 1}


def test_garbage_header_without_signature_is_refused_before_unpickling():
    receiver = Session(KEY)
    with pytest.raises(ProtocolError, match="signature"):
        receiver.unpack([b"0" * 64, b"\x80\x05garbage"])
    assert receiver.refused == {"bad_signature": 1}


def test_replayed_message_is_refused():
    sender, receiver = _pair()
    frames = _message(sender)
    receiver.unpack(frames)
    for _ in range(2):
        with pytest.raises(ProtocolError, match="replay"):
            receiver.unpack(list(frames))
    assert receiver.refused == {"replayed": 2}


@pytest.mark.parametrize("slot_first", [True, False])
def test_a_request_sent_two_ways_is_taken_once_and_its_replays_are_refused(slot_first):
    """A request comes through its request slot and through ZeroMQ: one copy is taken, the other dropped as a
    duplicate, uncounted. Replayed after that (a hostile copy of the frames, either way), it is refused every
    time, never run: through ZeroMQ as a replay (counted), through a request slot as a copy taken already
    (uncounted, as the client's own second copy is)."""
    from sklearn_gpu_bridge.protocol.session import Duplicate

    sender, receiver = _pair()
    frames = _message(sender, client="c" * 24)
    ways = [{"slot_of": "c" * 24}, {}] if slot_first else [{}, {"slot_of": "c" * 24}]
    header, _ = receiver.unpack(list(frames), **ways[0])
    assert header["client"] == "c" * 24
    with pytest.raises(Duplicate):
        receiver.unpack(list(frames), **ways[1])
    for way in [{}, {"slot_of": "c" * 24}, {}]:
        with pytest.raises(ProtocolError, match="replay|taken already") as raised:
            receiver.unpack(list(frames), **way)
        assert not isinstance(raised.value, Duplicate) or way, "a replay through ZeroMQ passed as a duplicate"
    assert receiver.refused["replayed"] == 2


def test_a_forgotten_signature_still_cannot_be_replayed():
    """Past ``remember`` signatures the oldest go, and with them every message as old: refused as stale."""
    sender, receiver = _pair(remember=3)
    messages = [_message(sender) for _ in range(4)]
    for frames in messages:
        receiver.unpack(frames)
    with pytest.raises(StaleMessage):
        receiver.unpack(messages[0])  # pushed out of the 3 remembered: its time is below the floor now
    for frames in messages[2:]:
        with pytest.raises(ProtocolError, match="replay|clock"):
            receiver.unpack(frames)


class _Touch:
    """Unpickling this would run ``os.system("touch <path>")``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _evil_pickles(marker):
    cmd = f"touch {marker}".encode()
    return {
        "reduce": pickle.dumps(_Touch(marker), protocol=5),
        "nested-in-header": pickle.dumps({"op": "ping", "id": new_id(), "x": [_Touch(marker)]}, protocol=5),
        "protocol-0-global": b"cos\nsystem\n(V" + cmd + b"\ntR.",
        "inst": b"(V" + cmd + b"\nios\nsystem\n.",
        "builtins-eval": b"cbuiltins\neval\n(V__import__('os').system('" + cmd + b"')\ntR.",
        "harmless-global": pickle.dumps({"op": "ping", "t": np.float64}, protocol=5),
    }


def test_evil_pickles_really_would_run(tmp_path):
    """The pickles below are live: plain pickle.loads runs them (so the refusal tests mean something)."""
    marker = tmp_path / "proof"
    pickle.loads(_evil_pickles(marker)["protocol-0-global"])
    assert marker.exists()


@pytest.mark.parametrize("name", list(_evil_pickles("x")))
def test_signed_header_with_a_global_is_refused_and_nothing_runs(tmp_path, name):
    marker = tmp_path / "MARKER"
    header_bytes = _evil_pickles(marker)[name]
    sender, receiver = _pair()
    with pytest.raises(ProtocolError):
        receiver.unpack([sender.sign(header_bytes), header_bytes])
    assert receiver.refused == {"malformed": 1}
    with pytest.raises(ProtocolError):
        loads_header(header_bytes)
    assert not marker.exists()


def _hostile_headers():
    """Signed headers (written byte by byte) that a reader which trusted msgpack's defaults, or built what an
    extension names, would take."""
    head = b"\x82\xa2op\xa4ping\xa1x"  # {"op": "ping", "x": ...
    return {
        "extension-type-42": head + b"\xd4\x2a\x00",  # fixext 1 of type 42: an object msgpack leaves to the hook
        "array-of-2**24-in-5-bytes": head + b"\xdd\x01\x00\x00\x00",  # a list as long as no header holds
        "map-of-2**24-in-5-bytes": head + b"\xdf\x01\x00\x00\x00",
        "str-of-4-GiB": head + b"\xdb\xff\xff\xff\xff",
        "nested-100k-deep": head + b"\x91" * 100_000 + b"\xc0",
        "tuples-nested-past-the-limit": head + nested_tuples(MAX_TUPLE_DEPTH + 1),
        "list-as-map-key": head + b"\x81\x91\x01\x02",  # {[1]: 2}
        "str-not-utf8": head + b"\xa2\xff\xfe",
        "tuple-that-holds-a-map": head + b"\xc7\x01\x01\x80",  # the tuple extension around {}
    }


@pytest.mark.parametrize("name", list(_hostile_headers()))
def test_signed_hostile_header_is_refused_without_building_anything(name):
    """Each is refused as malformed, and reading it never holds more than a few kB: no length is believed
    past the header's end (tracemalloc sees every list, dict and str the reader makes)."""
    header_bytes = _hostile_headers()[name]
    sender, receiver = _pair()
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            receiver.unpack([sender.sign(header_bytes), header_bytes])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert receiver.refused == {"malformed": 1}
    assert peak < 64_000 + 4 * len(header_bytes), peak


UNBOUNDED_TUPLES = """
import sys, threading, msgpack
def read(data):  # a tuple hook with no bound on its depth
    return msgpack.unpackb(data, ext_hook=lambda code, inner: tuple(read(inner)))
thread = threading.Thread(target=read, args=(bytes.fromhex(sys.argv[1]),))
thread.start()
thread.join()
"""


def test_hostile_headers_really_would_do_harm():
    """Read as a careless reader would, the headers above do harm: each tuple is read by a call of msgpack of
    its own, whose state lies on the C stack, so tuples nested 2000 deep kill a thread's process (SIGSEGV);
    and an extension msgpack leaves to its hook becomes an object of a type the header names."""
    import resource
    import subprocess
    import sys

    crashed = subprocess.run([sys.executable, "-c", UNBOUNDED_TUPLES, nested_tuples(2000).hex()], capture_output=True,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)), timeout=60)
    assert crashed.returncode < 0, crashed  # killed by a signal
    built = msgpack.unpackb(_hostile_headers()["extension-type-42"], strict_map_key=False)
    assert isinstance(built["x"], msgpack.ExtType)
    deepest = loads_header(b"\x81\xa1x" + nested_tuples(MAX_TUPLE_DEPTH))["x"]  # the limit itself is read
    for _ in range(MAX_TUPLE_DEPTH - 1):
        (deepest,) = deepest
    assert deepest == ([],)


def _plain(value):
    """Whether ``value`` is made of exact plain builtins only (what a header may hold)."""
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return type(value) in (type(None), bool, int, float, str, bytes)


def test_mutated_headers_are_refused_or_read_as_plain_values():
    """Mutated headers (bytes flipped, cut, inserted: extension types, timestamps, long lengths, tuples):
    loads_header either refuses one (ProtocolError, nothing else) or reads plain builtins only."""
    rng = random.Random(7)
    header = {"op": "fit", "id": new_id(), "params": {"C": 1.5, "k": [1, (2, None)], "w": {0: 2.0}},
              "neg": -(2**40), "b": b"\x00\xff" * 40, "s": "\u00e9" * 90, "t": ()}
    clean = dumps_header(header)
    inserts = [b"\xd4\x2a\x00", b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x01\x01\x90", b"\xc7\x00\x01",
               b"\xdd\xff\xff\xff\xff", b"\xdf\x00\x01\x00\x00", b"\xdb\x00\x00\x10\x00", b"\x91\x91\x91",
               b"\xc1", b"\x80\x05"]
    read = 0
    for _ in range(3000):
        data = bytearray(clean)
        for _ in range(rng.randint(1, 3)):
            action = rng.random()
            if action < 0.4:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif action < 0.6:
                data = data[: rng.randrange(len(data))]
            else:
                at = rng.randrange(len(data) + 1)
                data[at:at] = rng.choice(inserts)
        try:
            got = loads_header(bytes(data))
        except ProtocolError:
            continue
        assert _plain(got), bytes(data)
        read += 1
    assert 0 < read < 3000
    assert loads_header(clean) == header


def test_a_tuple_stays_a_tuple_and_numpy_scalars_become_python_values():
    value = {"t": (1, (np.float32(2.5),)), "l": [np.int64(3), np.bool_(True)], "d": {np.int32(0): "a"}}
    read = loads_header(dumps_header(value))
    assert read == {"t": (1, (2.5,)), "l": [3, True], "d": {0: "a"}}
    assert type(read["t"]) is tuple and type(read["l"]) is list
    assert type(read["t"][1][0]) is float and type(read["l"][0]) is int and type(read["l"][1]) is bool


def test_the_timestamp_extension_reads_as_a_float():
    """msgpack reads its one built-in extension as a ``msgpack.Timestamp`` by default: an object, where a
    header holds plain values only."""
    read = loads_header(b"\x81\xa1x\xd6\xff\x00\x00\x00\x01")  # {"x": Timestamp(seconds=1)}
    assert read == {"x": 1.0} and type(read["x"]) is float


@pytest.mark.parametrize("value", [object(), 2**64, -(2**63) - 1, np.datetime64("NaT"), {1, 2}],
                         ids=["object", "int-too-big", "int-too-small", "datetime64", "set"])
def test_a_value_that_is_not_plain_cannot_be_packed(value):
    with pytest.raises(TypeError, match="cannot go in a message"):
        dumps_header({"op": "ping", "x": [value]})


def test_tuples_nested_past_the_limit_are_refused_when_packed():
    """What the reader would refuse is refused at once, with a TypeError, before anything is sent."""
    value = ()
    for _ in range(MAX_TUPLE_DEPTH - 1):
        value = (value,)  # MAX_TUPLE_DEPTH tuples in all
    assert loads_header(dumps_header({"x": value}))["x"] == value
    with pytest.raises(TypeError, match="nested more than"):
        dumps_header({"x": [(value,)]})


# ---------------------------------------------------------------- Encoder / Decoder in process


def _values(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    wanted, dtype = np.dtype(dtype), np.dtype(dtype).newbyteorder("=")
    n = int(np.prod(shape))
    if dtype.kind == "b":
        flat = rng.random(n) < 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        flat[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
    elif dtype.kind == "f":
        flat = rng.standard_normal(n).astype(dtype)
        flat[: min(n, 3)] = [np.nan, np.inf, -0.0][: min(n, 3)]
    else:
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    return flat.astype(wanted).reshape(shape)


_BASE = _values("float64", (6, 10), seed=1)
_BIG = _values("float64", (20000,), seed=2)  # 160 KB: over the inline limit

LAYOUTS = {
    **{f"{np.dtype(t).name}-C": _values(t, (3, 5)) for t in sorted(DTYPES)},
    "float64-F": np.asfortranarray(_values("float64", (4, 7))),
    "int32-F": np.asfortranarray(_values("int32", (4, 7))),
    "complex64-F": np.asfortranarray(_values("complex64", (5, 3))),
    "bool-F": np.asfortranarray(_values("bool", (5, 3))),
    "every-other-row": _BASE[::2],
    "every-third-column": _BASE[:, ::3],
    "inner-block": _BASE[1:5, 2:7],
    "reversed-1d": _BASE[0][::-1],
    "reversed-both-axes": _BASE[::-1, ::-2],
    "transposed-3d": _values("int16", (2, 3, 4)).transpose(1, 0, 2),
    "size-one-negative-stride": _BASE[0][::-1][:1],
    "single-column": _BASE[:, 3:4],
    "empty-1d": np.empty(0, "float32"),
    "empty-rows": np.empty((0, 5), "int64"),
    "empty-columns": np.empty((5, 0), "float64"),
    "empty-3d": np.empty((2, 0, 3), "uint8"),
    "empty-F": np.empty((0, 4), "complex128", order="F"),
    "0d-float": np.array(3.25),
    "0d-int8": np.array(-7, "int8"),
    "0d-bool": np.array(True),
    "big-endian-f8": _values(">f8", (3, 4)),
    "big-endian-i4": _values(">i4", (4, 3)),
    "big-endian-c16-F": np.asfortranarray(_values(">c16", (2, 3))),
    "big-endian-u2-strided": _values(">u2", (20,))[::-3],
    "1d": _values("float32", (17,)),
    "3d-C": _values("float64", (2, 3, 4)),
    "3d-F": np.asfortranarray(_values("uint32", (2, 3, 4))),
    "big-1d": _BIG,
    "big-F": np.asfortranarray(_BIG[: 200 * 50].reshape(200, 50)),
    "big-strided": _BIG[::2],
}


@pytest.fixture(scope="module")
def pool():
    pool = Pool()  # memfd segments on Linux, files elsewhere: the client's default
    yield pool
    pool.close()


def _reader(pool):
    """The worker's reads of ``pool``."""
    return PoolAttachment(pool.describe(), [pool.directory] if pool.directory else []).read


def _codec_pair(path, pool, leases):
    """(encoder, read_pool) for one path: everything inline, as frames, or through a pool."""
    if path == "inline":
        return Encoder(inline_max=1 << 30), None
    if path == "frame":
        return Encoder(inline_max=0), None

    def place(nbytes):
        lease = pool.allocate(nbytes)
        leases.append(lease)
        return lease.segment, lease.offset, lease.buffer()

    return Encoder(place, inline_max=0), _reader(pool)


@pytest.mark.parametrize("path", ["inline", "frame", "pool"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_array_round_trip(name, path, pool):
    original = LAYOUTS[name]
    leases = []
    try:
        _round_trip(original, path, pool, leases)
    finally:
        for lease in leases:
            lease.release()
    assert pool.slots_in_use == 0


def _round_trip(original, path, pool, leases):
    expected_dtype = original.dtype.newbyteorder("=")
    encoder, read_pool = _codec_pair(path, pool, leases)
    payload = encoder.encode({"x": original, "pair": [original, 1]})
    assert encoder.counts[path if original.nbytes else "inline"] == 2
    sender, receiver = Session(KEY), Session(KEY)
    header, buffers = receiver.unpack(
        sender.pack({"op": "echo", "id": new_id(), "payload": payload, "arrays": encoder.arrays}, encoder.buffers)
    )
    value = Decoder(header, buffers, read_pool=read_pool).decode(header["payload"])
    assert value["pair"][1] == 1
    for out in (value["x"], value["pair"][0]):
        assert isinstance(out, np.ndarray)
        assert out.shape == original.shape
        assert out.dtype == expected_dtype and out.dtype.str in DTYPES
        np.testing.assert_array_equal(out, original)
        assert not out.flags.writeable  # a view of the message: read-only
    writable = Decoder(header, buffers, read_pool=read_pool, writeable=True).decode(header["payload"])["x"]
    assert writable.flags.writeable
    np.testing.assert_array_equal(writable, original)


@pytest.mark.parametrize("name", ["float64-F", "3d-C", "big-1d", "big-F"])
def test_contiguous_arrays_travel_as_frames_without_a_copy(name):
    original = LAYOUTS[name]
    encoder = Encoder(inline_max=0)
    header = {"payload": encoder.encode(original), "arrays": encoder.arrays}
    assert np.shares_memory(encoder.buffers[0], original)
    out = Decoder(header, encoder.buffers).decode(header["payload"])
    assert np.shares_memory(out, original)
    assert out.flags.c_contiguous == original.flags.c_contiguous
    assert out.flags.f_contiguous == original.flags.f_contiguous


def test_numpy_scalars_become_python_values():
    value = Encoder().encode({"a": np.float32(1.5), "b": [np.int64(3), np.bool_(True)]})
    assert value == {"a": 1.5, "b": [3, True]}
    assert type(value["a"]) is float and type(value["b"][0]) is int and type(value["b"][1]) is bool


@pytest.mark.parametrize(
    "array",
    [
        np.array([1, "a", None], dtype=object),
        np.array(["ab", "cd"]),
        np.array([b"ab"]),
        np.zeros(3, "datetime64[ns]"),
        np.zeros(3, "timedelta64[s]"),
        np.zeros(2, dtype=[("a", "<f8"), ("b", "<i4")]),
        np.zeros(2, dtype=[("a", "O")]),
    ],
    ids=["object", "str", "bytes", "datetime", "timedelta", "struct", "struct-object"],
)
def test_unsupported_dtypes_raise_type_error(array):
    with pytest.raises(TypeError, match="cannot be sent"):
        Encoder().encode({"x": [array]})


# ---------------------------------------------------------------- forged descriptors, in process


def _desc(**overrides):
    desc = {"dtype": "<f8", "shape": [2, 2], "order": "C", "where": "inline", "data": bytes(32)}
    desc.update(overrides)
    return {k: v for k, v in desc.items() if v is not _DROP}


_DROP = object()

FORGED = {
    "dtype-object": _desc(dtype="|O"),
    "dtype-str": _desc(dtype="<U4"),
    "dtype-void": _desc(dtype="|V8"),
    "dtype-big-endian": _desc(dtype=">f8"),
    "dtype-datetime": _desc(dtype="<M8[ns]"),
    "dtype-by-name": _desc(dtype="float64"),
    "dtype-not-str": _desc(dtype=8),
    "dtype-missing": _desc(dtype=_DROP),
    "inline-too-short": _desc(data=bytes(31)),
    "inline-too-long": _desc(data=bytes(40)),
    "inline-not-bytes": _desc(data="\x00" * 32),
    "frame-size-mismatch": _desc(where="frame", index=0, data=_DROP, shape=[3, 2]),
    "negative-shape": _desc(shape=[-2, -2]),
    "float-shape": _desc(shape=[2.0, 2]),
    "bool-shape": _desc(shape=[True, 4]),
    "shape-not-a-list": _desc(shape="22"),
    "shape-too-many-dims": _desc(shape=[1] * 33, data=bytes(8)),
    "frame-index-out-of-range": _desc(where="frame", index=1, data=_DROP),
    "frame-index-negative": _desc(where="frame", index=-1, data=_DROP),
    "frame-index-not-int": _desc(where="frame", index="0", data=_DROP),
    "frame-index-missing": _desc(where="frame", data=_DROP),
    "unknown-where": _desc(where="disk"),
    "where-missing": _desc(where=_DROP),
    "bad-order": _desc(order="K"),
    "pool-without-pool": _desc(where="pool", segment=0, offset=0, data=_DROP),
    "not-a-dict": ["<f8", [2, 2]],
}


@pytest.mark.parametrize("name", list(FORGED))
def test_decoder_rejects_forged_descriptor(name):
    header = {"op": "echo", "arrays": [FORGED[name]]}
    decoder = Decoder(header, [bytes(32)])
    with pytest.raises(ProtocolError):
        decoder.decode({"x": {"__array__": 0}})


@pytest.mark.parametrize("index", [1, -1, "0", None, 0.0])
def test_decoder_rejects_array_and_blob_indexes_out_of_range(index):
    decoder = Decoder({"arrays": [_desc()]}, [b"blob"])
    with pytest.raises(ProtocolError):
        decoder.decode([{"__array__": index}])
    with pytest.raises(ProtocolError):
        decoder.decode([{"__blob__": index}])
    assert bytes(decoder.decode({"__blob__": 0})) == b"blob"


@pytest.mark.parametrize("nbytes", [0, 1000, 4096, 4097, 3 * 4096 + 5])
def test_values_longer_than_a_frame_travel_as_several_under_one_digest(nbytes):
    """A worker on TCP takes frames of at most max_frame_bytes: longer arrays and blobs go as several frames, which
    the header lists under one digest of them all (then None), checked whole and joined back in order."""
    rng = np.random.default_rng(nbytes)
    arr, blob = rng.integers(0, 255, nbytes, dtype=np.uint8), rng.integers(0, 255, nbytes, np.uint8).tobytes()
    encoder = Encoder(max_frame=4096, inline_max=0)
    header = {"op": "echo", "payload": encoder.encode({"args": [arr]}), "state": encoder.blob(blob),
              "arrays": encoder.arrays, "id": new_id()}
    assert all(memoryview(b).nbytes <= 4096 for b in encoder.buffers)
    client, worker = _pair()
    frames = client.pack(header, encoder.buffers, encoder.digests)
    received, buffers = worker.unpack(frames)
    runs = max(1, -(-nbytes // 4096))
    assert received["digests"].count(None) == 2 * (runs - 1)
    decoder = Decoder(received, buffers)
    np.testing.assert_array_equal(decoder.decode(received["payload"])["args"][0], arr)
    assert bytes(decoder.decode(received["state"])) == blob
    if runs > 1:  # one byte changed in the last frame of a run: the run's digest no longer matches
        changed = [bytes(f) for f in frames]
        changed[1 + runs] = bytes([changed[1 + runs][0] ^ 1]) + changed[1 + runs][1:]
        with pytest.raises(ProtocolError, match="digest"):
            Session(KEY, me=WORKER).unpack(changed)


def test_bytes_in_a_header_stay_within_a_quarter_of_a_frame():
    """The header is one frame: arrays inline past a quarter of the receiver's largest frame go as frames."""
    encoder = Encoder(max_frame=1 << 20)
    encoder.encode([np.ones(8192) for _ in range(8)])  # 64 KiB each: inline alone
    assert [a["where"] for a in encoder.arrays].count("inline") == 4
    assert sum(len(a.get("data", b"")) for a in encoder.arrays) <= (1 << 20) // 4


@pytest.mark.parametrize("index, buffers", [
    ([0] * 256, [bytes(4096)] + [b""] * 255),
    ([0, 1, 0], [bytes(4096)] * 3),
    ([1, 0], [bytes(4096), bytes(4096)]),
], ids=["one-frame-256-times", "one-frame-twice", "frames-of-another-size"])
def test_a_frame_list_is_checked_before_anything_is_joined(index, buffers, monkeypatch):
    """Sizes are checked, and a frame named twice refused, before a byte is joined: a list naming one frame 256
    times would otherwise be joined 256 times over."""
    joins = []
    monkeypatch.setattr("sklearn_gpu_bridge.protocol.arrays._join", lambda *args: joins.append(args))
    desc = {"dtype": "|u1", "shape": [len(index) * 4096 if len(set(index)) < len(index) else 4096 * 3],
            "order": "C", "where": "frame", "index": index}
    with pytest.raises(ProtocolError, match="named twice|does not match"):
        Decoder({"arrays": [desc]}, buffers).decode([{"__array__": 0}])
    assert joins == []


def test_a_frame_is_taken_by_one_value_only():
    """Two arrays, or an array and a blob, naming one frame: refused (each frame is one value's)."""
    desc = {"dtype": "|u1", "shape": [16], "order": "C", "where": "frame", "index": 0}
    with pytest.raises(ProtocolError, match="named twice"):
        Decoder({"arrays": [desc, desc]}, [bytes(16)]).decode([{"__array__": 0}, {"__array__": 1}])
    with pytest.raises(ProtocolError, match="named twice"):
        Decoder({"arrays": [desc]}, [bytes(16)]).decode([{"__array__": 0}, {"__blob__": 0}])


def test_decoder_rejects_arrays_that_are_not_a_list():
    with pytest.raises(ProtocolError):
        Decoder({"arrays": {"0": _desc()}}, [])


@pytest.mark.parametrize(
    "where",
    [
        {"segment": 0, "offset": 2**40},
        {"segment": 0, "offset": -64},
        {"segment": 7, "offset": 0},
        {"segment": -1, "offset": 0},
        {"segment": "0", "offset": 0},
        {"segment": 0, "offset": None},
        {"segment": 0, "offset": 0, "shape": [2**31, 2**31]},
    ],
    ids=["offset-huge", "offset-negative", "segment-missing", "segment-negative", "segment-str",
         "offset-none", "shape-huge"],
)
def test_decoder_never_reads_outside_the_pool(pool, where):
    lease = pool.allocate(64)
    try:
        desc = _desc(where="pool", data=_DROP, **where)
        decoder = Decoder({"arrays": [desc]}, [], read_pool=_reader(pool))
        with pytest.raises((ProtocolError, PoolError)):
            decoder.decode({"__array__": 0})
    finally:
        lease.release()


# ---------------------------------------------------------------- through the real worker


def _mixed_arrays(seed):
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((40, 30)),  # small: inline
        np.asfortranarray(rng.standard_normal((120, 90)).astype("float32")),  # 43 KB, F
        rng.integers(-(2**40), 2**40, (300, 70)),  # 168 KB: pool
        rng.standard_normal((200, 200))[::2, ::-1],  # non-contiguous, 160 KB
        rng.random(5) < 0.5,
        np.array(2.5),
        np.empty((0, 3), "int8"),
        rng.standard_normal((3, 4, 5)).astype(">f8"),
        (rng.standard_normal(20000) + 1j).astype("complex64"),  # 160 KB
    ]


def _check_echo(connection, arrays):
    result = connection.echo(*arrays)
    assert len(result) == len(arrays)
    for out, original in zip(result, arrays):
        assert out.shape == original.shape
        assert out.dtype == original.dtype.newbyteorder("=")
        np.testing.assert_array_equal(out, original)
    return result


def _delta(before, after):
    """How the arrays' transport counters moved (where replies were read, ``replies_*``, is not one: a client
    beside a cuML worker reads them from its pool)."""
    return {k: after[k] - before.get(k, 0) for k in after
            if after[k] != before.get(k, 0) and not k.startswith("replies_")}


def test_small_arrays_go_inline(connection):
    before = dict(connection.stats)
    _check_echo(connection, [np.arange(100.0), np.ones((10, 10), "int32")])
    assert _delta(before, connection.stats) == {"sent_inline": 2, "received_inline": 2}


def test_large_arrays_go_through_the_pool(connection):
    assert connection.pool is not None and connection.capabilities.pool
    big = np.random.default_rng(0).standard_normal((300, 40))  # 96 KB > INLINE_MAX
    before = dict(connection.stats)
    out = _check_echo(connection, [big, np.arange(3)])
    assert _delta(before, connection.stats) == {
        "sent_pool": 1, "sent_inline": 1, "received_pool": 1, "received_inline": 1,
    }
    assert out[0].flags.writeable


def test_with_the_pool_arrays_past_a_few_kilobytes_go_through_it_both_ways(connection):
    """Bytes inside a header are signed and copied by the writer, the reply slot and the reader: with a pool, an
    array of more than POOL_INLINE_MAX bytes (a fit's 5000 labels, their predictions) goes through the pool,
    there and back; without one, up to INLINE_MAX stay inline (the next test)."""
    assert connection.pool is not None and POOL_INLINE_MAX < 20_000 <= INLINE_MAX
    labels = np.arange(5000, dtype="int32") % 3  # 20 KB
    before = dict(connection.stats)
    out = _check_echo(connection, [labels, np.arange(POOL_INLINE_MAX // 8, dtype="float64")])
    assert _delta(before, connection.stats) == {
        "sent_pool": 1, "sent_inline": 1, "received_pool": 1, "received_inline": 1,
    }
    assert out[0].dtype == labels.dtype


def test_without_the_pool_large_arrays_go_as_frames(worker):
    big = np.random.default_rng(1).standard_normal((300, 40))
    try:
        with sklearn_gpu_bridge.config_context(pool="off"):
            sklearn_gpu_bridge.reset_connection()
            connection = sklearn_gpu_bridge.get_connection()
            assert connection.pool is None
            before = dict(connection.stats)
            _check_echo(connection, [big, np.asfortranarray(big), np.arange(3)])
            assert _delta(before, connection.stats) == {
                "sent_frame": 2, "sent_inline": 1, "received_frame": 2, "received_inline": 1,
            }
    finally:
        sklearn_gpu_bridge.reset_connection()
    assert sklearn_gpu_bridge.get_connection().pool is not None


@pytest.mark.parametrize("pool_setting", ["auto", "off"])
def test_mixed_arrays_round_trip_through_the_worker(worker, pool_setting):
    try:
        with sklearn_gpu_bridge.config_context(pool=pool_setting):
            sklearn_gpu_bridge.reset_connection()
            connection = sklearn_gpu_bridge.get_connection()
            for seed in range(3):
                _check_echo(connection, _mixed_arrays(seed))
            used = {k.split("_")[1] for k in connection.stats if not k.startswith("replies_")}
            assert used == ({"inline", "pool"} if pool_setting == "auto" else {"inline", "frame"})
    finally:
        sklearn_gpu_bridge.reset_connection()


# ---------------------------------------------------------------- forged descriptors sent to the worker


class Forger(RawClient):
    """A raw client (conftest.RawClient) that sends each header it is given, however wrong, under a new client id."""

    def send(self, header, buffers=()):
        return self.send_header({"id": new_id(), "client": "raw-" + new_id(), **header}, buffers)

    def reply(self, msg_id, timeout_ms=RECV_TIMEOUT_MS):
        reply = self.receive(timeout_ms)
        assert reply is not None, "no reply from the worker"
        assert reply[0]["parent"] == msg_id
        return reply


@pytest.fixture
def raw(worker):
    client = Forger(worker)
    yield client
    client.close()


def _echo_header(connection, desc, **extra):
    return {
        "op": "echo", "client": connection.transport.client_id, "pool": connection.pool.name, "arrays": [desc],
        "payload": {"args": [{"__array__": 0}], "kwargs": {}}, **extra,
    }


def _pool_desc(**overrides):
    return _desc(**{"where": "pool", "data": _DROP, "segment": 0, "offset": 0, **overrides})


WORKER_FORGED = {
    "pool-offset-huge": (_pool_desc(offset=2**40), ()),
    "pool-offset-past-end": (_pool_desc(offset=64 << 20, shape=[1]), ()),
    "pool-offset-negative": (_pool_desc(offset=-8), ()),
    "pool-segment-missing": (_pool_desc(segment=999), ()),
    "pool-segment-negative": (_pool_desc(segment=-1), ()),
    "pool-shape-huge": (_pool_desc(shape=[2**31, 2**31]), ()),
    "dtype-object": (_desc(dtype="|O"), ()),
    "dtype-str": (_desc(dtype="<U4"), ()),
    "inline-shape-mismatch": (_desc(shape=[3, 3]), ()),
    "frame-shape-mismatch": (_desc(where="frame", index=0, data=_DROP, shape=[5]), (bytes(32),)),
    "frame-index-out-of-range": (_desc(where="frame", index=3, data=_DROP), (bytes(32),)),
    "negative-shape": (_desc(shape=[-1, 4]), ()),
    "unknown-where": (_desc(where="file", path="/etc/passwd"), ()),
}


@pytest.mark.parametrize("name", list(WORKER_FORGED))
def test_worker_answers_forged_descriptor_with_an_error(connection, raw, name):
    desc, buffers = WORKER_FORGED[name]
    msg_id = raw.send(_echo_header(connection, desc), buffers)
    reply, _ = raw.reply(msg_id)
    assert reply["op"] == "error"
    assert reply["mro"][0][1] in ("ProtocolError", "PoolError"), reply["message"]
    np.testing.assert_array_equal(connection.echo(np.arange(5.0))[0], np.arange(5.0))


def test_worker_refuses_pool_descriptor_of_a_pool_it_never_attached(connection, raw):
    other = connection.pool.name[:-1] + ("0" if connection.pool.name[-1] != "0" else "1")
    msg_id = raw.send(_echo_header(connection, _pool_desc(), pool=other))
    reply, _ = raw.reply(msg_id)
    assert reply["op"] == "error" and "did not attach" in reply["message"]


def test_worker_refuses_output_room_outside_the_pool(connection, raw):
    big = np.zeros(INLINE_MAX, "uint8")
    desc = {"dtype": "|u1", "shape": [big.size], "order": "C", "where": "frame", "index": 0}
    out = {"segment": connection.pool.handshake.segment, "offset": 2**40, "nbytes": 1 << 20}
    msg_id = raw.send(_echo_header(connection, desc, out=out), [big])
    reply, _ = raw.reply(msg_id)
    assert reply["op"] == "error" and reply["mro"][0][1] in ("ProtocolError", "PoolError")
    assert "outside" in reply["message"]
    np.testing.assert_array_equal(connection.echo(big + 1)[0], big + 1)


def test_worker_answers_a_well_formed_raw_echo(connection, raw):
    """The raw client itself is sound: a correct descriptor gets the array back."""
    data = np.arange(6, dtype="<i8")
    desc = {"dtype": "<i8", "shape": [2, 3], "order": "F", "where": "frame", "index": 0}
    msg_id = raw.send(_echo_header(connection, desc), [data.tobytes()])
    reply, buffers = raw.reply(msg_id)
    assert reply["op"] == "reply"
    result = Decoder(reply, buffers).decode(reply["payload"])["result"][0]
    np.testing.assert_array_equal(result, data.reshape((2, 3), order="F"))


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_float64_cast_to_float32_on_all_cores_equals_astype_in_any_layout(layout, order):
    """The cast of a large array runs in chunks on all cores (a 400 MB float64 X took 70 ms in one thread): the
    same values as numpy's ``astype`` whatever the source's layout and the order asked for, and an overflow is
    said in scikit-learn's words."""
    from sklearn_gpu_bridge.protocol.arrays import _cast

    X = np.random.default_rng(0).standard_normal((3000, 800))  # 19 MB: split over the cores
    X = {"C": X, "F": np.asfortranarray(X), "strided": X[::2, ::3]}[layout]
    cast = _cast(X, np.dtype(np.float32), order, "X")
    assert cast.dtype == np.float32 and cast.flags[f"{order}_CONTIGUOUS"]
    np.testing.assert_array_equal(cast, X.astype(np.float32))
    X[0, 0] = 1e300
    with pytest.raises(ValueError, match="too large for dtype"):
        _cast(X, np.dtype(np.float32), order, "X")
