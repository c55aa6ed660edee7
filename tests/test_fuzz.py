"""A protocol fuzzer: real messages, captured from a real client, mutated and sent to a real worker.

A seeded mutator takes messages that the client really sent (hello, fit,
call, get_state, set_state, attribute, echo, status, ping; arrays inline,
in the pool and as frames) and breaks them: values swapped for junk, keys
removed or added, operations renamed, array descriptors forged, frames
dropped, cut, grown or added (up to 8 MB), header bytes flipped, cut or
spliced or given msgpack the reader refuses (extensions, long lengths,
tuples nested 2000 deep), lists nested 100,000 deep, signatures wrong, missing or replayed.
Most mutants are signed again with the worker's key, so that they get past
the signature check and reach the code behind it.

After each mutant the fuzzer sends a fence (a valid ``echo``, a work
operation: the worker answers work in order, and quick operations at once),
so every reply before the fence's belongs to the mutant. For every mutant:
exactly one reply (a result or an error), or none and the worker counted it
as refused. The worker must keep serving (a real fit at the end equals
scikit-learn's), never hit its last-resort handler, and its resident memory
must stay flat.
"""

import copy
import os
import pickle
import random
import time

import msgpack
import numpy as np
import pytest
import zmq
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUPCA, GPUKMeans, GPULogisticRegression, GPUStandardScaler
from sklearn_gpu_bridge.protocol import Session, loads_header, new_id
from sklearn_gpu_bridge.protocol.session import MAX_TUPLE_DEPTH

from .conftest import WorkerProcess, assert_same, nested_tuples, record, use_worker
from .test_load import worker_rss

FENCE_TIMEOUT_MS = 30_000
OPS = ["hello", "ping", "status", "release", "goodbye", "fit", "call", "attribute", "get_state", "set_state", "echo",
       "", "reply", "error", "_op_fit", "__init__", "close", "serve_forever", "Fit", "fit ", "x" * 300]
JUNK = [
    None, True, False, 0, 1, -1, 7, 2**31, 2**63, 2**64 - 1, -(2**63), 1.5, -0.0, float("nan"), float("inf"),
    "", "x", "fit", "../../etc/passwd", "sgb-pool-1-0123456789abcdef", "\x00" * 8, "é" * 50, "x" * 100_000,
    b"", b"\x00" * 16, b"\xff" * 1000, [], {}, (), [1, [2, [3]]], {"a": {"b": {}}}, [None] * 1000,
    {"__array__": 0}, {"__array__": 99}, {"__array__": -1}, {"__array__": "0"}, {"__blob__": 0}, {"__blob__": 7},
    {"args": [], "kwargs": {}}, {"args": {"__array__": 0}, "kwargs": []},
]

# inserted into signed headers: an extension, a timestamp, lengths past the end, tuples past the limit and 2000
# deep (which would crash a reader without the limit), a byte msgpack never uses
HOSTILE_MSGPACK = [b"\xd4\x2a\x00", b"\xd6\xff\x00\x00\x00\x01", b"\xdd\xff\xff\xff\xff", b"\xdf\x01\x00\x00\x00",
                   b"\xdb\x7f\xff\xff\xff", nested_tuples(MAX_TUPLE_DEPTH + 1), nested_tuples(2000), b"\xc1"]


def _bytes(buffer):
    return buffer.tobytes() if isinstance(buffer, np.ndarray) else bytes(memoryview(buffer))


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory, worker):
    """A worker of this module alone, with one executor thread (so replies come in order), and real messages."""
    process = WorkerProcess(tmp_path_factory.mktemp("fuzz"), threads=1)
    templates, keep = _capture(process)
    yield process, templates
    for connection in keep:
        connection.close()
    use_worker(worker)
    process.stop()


def _capture(process):
    """(header, buffers) of every message real clients send in a few real calls."""
    captured = []
    pack = Session.pack

    def recording_pack(session, header, buffers=(), digests=None):
        if header.get("op") not in ("goodbye", "shutdown"):
            captured.append((copy.deepcopy(header), [_bytes(b) for b in buffers]))
        return pack(session, header, buffers, digests)

    rng = np.random.default_rng(0)
    X, Xbig = rng.standard_normal((40, 5)), rng.standard_normal((400, 30))  # inline, and 96 KB: pool or frames
    y = (X[:, 0] > 0).astype(int)
    keep = []
    Session.pack = recording_pack
    try:
        for pool in ("auto", "off"):
            use_worker(process)
            with sklearn_gpu_bridge.config_context(pool=pool):
                connection = sklearn_gpu_bridge.get_connection()
                keep.append(connection)
                scaler = GPUStandardScaler().fit(Xbig)
                scaler.transform(Xbig)
                scaler.mean_  # get_state
                GPUStandardScaler().fit_transform(X)
                model = GPULogisticRegression().fit(X, y)
                model.predict_proba(X)
                pickle.loads(pickle.dumps(model)).predict(X)  # set_state
                GPUKMeans(n_clusters=2, n_init=1, random_state=0).fit_predict(X)
                GPUPCA(n_components=2).fit(X).transform(X)
                connection.attribute(scaler._remote.handle, "scale_")
                connection.echo(Xbig, np.arange(5))
                connection.status()
                connection.ping()
                del scaler, model
                connection.status()  # carries the releases
            sklearn_gpu_bridge.client.discovery._connection = None  # keep this one open, make the next one anew
    finally:
        Session.pack = pack
    ops = {header["op"] for header, _ in captured}
    assert {"hello", "fit", "call", "get_state", "set_state", "attribute", "echo", "status", "ping"} <= ops, ops
    return captured, keep


# ---------------------------------------------------------------- the mutator


def _paths(value, prefix=()):
    """Every (container, key) path inside a header."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield prefix + (index,)
            yield from _paths(item, prefix + (index,))


def _parent(header, path):
    for key in path[:-1]:
        header = header[key]
    return header


def _deep_list_header(depth, msg_id):
    """A signed-able header whose payload is a list nested ``depth`` deep (written byte by byte)."""
    fields = b"".join(msgpack.packb(v) for v in ("op", "echo", "id", msg_id, "client", "fuzz", "payload"))
    return b"\x84" + fields + b"\x91" * (depth - 1) + b"\x90"


class Mutator:
    def __init__(self, seed, templates, key, worker_id):
        self.rng = random.Random(seed)
        self.templates = templates
        self.session = Session(key, peer=worker_id)
        self.sent = []  # earlier frames, for replays
        self.kinds = [
            ("value", 8), ("delete", 4), ("insert", 3), ("op", 3), ("descriptor", 6), ("buffers", 4), ("bytes", 6),
            ("unsigned", 3), ("replay", 2), ("framing", 2), ("client", 2), ("deep", 1), ("big-frame", 1),
        ]

    def next(self):
        """(kind, frames, id) of a new mutant; id is the header's id where one was set."""
        rng = self.rng
        header, buffers = copy.deepcopy(rng.choice(self.templates))
        header["id"] = new_id()
        kind = rng.choices([k for k, _ in self.kinds], [w for _, w in self.kinds])[0]
        frames = getattr(self, "_" + kind.replace("-", "_"))(header, buffers)
        if frames is None:
            return self.next()
        self.sent.append(frames)
        if len(self.sent) > 200:
            self.sent.pop(rng.randrange(len(self.sent)))
        return kind, frames, header.get("id")

    def _signed(self, header, buffers):
        if isinstance(header, dict) and header.get("op") == "shutdown":
            return None  # a signed shutdown is obeyed: that is the protocol, not a fault
        try:
            return self.session.pack(header, buffers)
        except (ValueError, RecursionError):  # a cycle or too deep for the packer: not a message
            return None

    def _resigned(self, header_bytes, buffers):
        try:
            if loads_header(header_bytes).get("op") == "shutdown":
                return None
        except Exception:  # noqa: BLE001 - not a valid header at all: exactly what is wanted
            pass
        return [self.session.sign(header_bytes), header_bytes, *buffers]

    def _value(self, header, buffers):
        # Values inside "params" are the estimator's to judge: any one is a valid request, and some are valid
        # requests for work that never ends (KMeans with n_init=2**64+1), which is not what this fuzzes.
        paths = [p for p in _paths(header) if p != ("op",) and not (p[0] == "params" and len(p) > 1)]
        path = self.rng.choice(paths)
        _parent(header, path)[path[-1]] = copy.deepcopy(self.rng.choice(JUNK))
        return self._signed(header, buffers)

    def _delete(self, header, buffers):
        paths = [p for p in _paths(header) if p != ("op",) and isinstance(_parent(header, p), dict)]
        if not paths:
            return None
        path = self.rng.choice(paths)
        del _parent(header, path)[path[-1]]
        return self._signed(header, buffers)

    def _insert(self, header, buffers):
        dicts = [header] + [_parent(header, p)[p[-1]] for p in _paths(header)
                            if isinstance(_parent(header, p)[p[-1]], dict)]
        target = self.rng.choice(dicts)
        name = self.rng.choice(["op", "id", "client", "pool", "out", "arrays", "payload", "params", "handle",
                                "method", "estimator", "release", "format", "state", "name", "__class__", "x" * 40])
        target[name] = copy.deepcopy(self.rng.choice(JUNK))
        return self._signed(header, buffers)

    def _op(self, header, buffers):
        header["op"] = self.rng.choice(OPS)
        return self._signed(header, buffers)

    def _descriptor(self, header, buffers):
        arrays = header.get("arrays")
        if not arrays:
            return self._value(header, buffers)
        desc = self.rng.choice(arrays)
        field = self.rng.choice(["dtype", "shape", "order", "where", "data", "index", "segment", "offset", "extra",
                                 "key", "cache"])
        choices = {
            "dtype": ["<f8", "|O", "<U4", ">f8", "|V8", "<M8[ns]", "float64", "<c16", "|b1", 8, None],
            "shape": [[], [0], [-1], [2**62, 2**62], [10**9], [1] * 40, [3, 3], [2.0], "22", None],
            "order": ["C", "F", "K", "A", None, 1],
            "where": ["inline", "frame", "pool", "cached", "disk", "file", None],
            "data": [b"", b"\x00" * 7, b"\x00" * 10_000, "text", None],
            "index": [0, 1, -1, 10**6, "0", None],
            "segment": [0, 1, -1, 999, 2**40, "0", None],
            "offset": [0, 1, 63, -8, 2**40, 2**63, 1 << 20, None],
            "extra": [None],
            "key": ["0" * 32, "f" * 32, "F" * 32, "0" * 31, "g" * 32, 0, None],  # "cached": kept by this client?
            "cache": ["0" * 32, "f" * 32, "0" * 33, b"0" * 32, [], None],  # asks the worker to keep the array
        }
        desc[field] = copy.deepcopy(self.rng.choice(choices[field]))
        return self._signed(header, buffers)

    def _buffers(self, header, buffers):
        rng = self.rng
        action = rng.choice(["drop", "duplicate", "cut", "grow", "garbage", "many"])
        if action == "drop" and buffers:
            buffers.pop(rng.randrange(len(buffers)))
        elif action == "duplicate" and buffers:
            buffers.insert(0, buffers[-1])
        elif action == "cut" and buffers:
            i = rng.randrange(len(buffers))
            buffers[i] = buffers[i][: rng.randrange(len(buffers[i]) + 1)]
        elif action == "grow" and buffers:
            i = rng.randrange(len(buffers))
            buffers[i] = buffers[i] + os.urandom(rng.choice([1, 8, 4096]))
        elif action == "many":
            buffers = buffers + [b""] * rng.choice([10, 1000])
        else:
            buffers = [os.urandom(rng.choice([0, 1, 64, 65536])) for _ in range(rng.randrange(1, 4))]
        return self._signed(header, buffers)

    def _bytes(self, header, buffers):
        rng = self.rng
        data = bytearray(self.session.pack(header)[1])
        action = rng.choice(["flip", "flip", "cut", "insert", "splice", "hostile"])
        if action == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif action == "cut":
            data = data[: rng.randrange(len(data))]
        elif action == "insert":
            at = rng.randrange(len(data))
            data[at:at] = os.urandom(rng.randint(1, 16))
        elif action == "splice":
            other = self.session.pack(rng.choice(self.templates)[0])[1]
            data = data[: rng.randrange(len(data))] + other[rng.randrange(len(other)):]
        else:  # what the reader refuses or reads as plain: extensions, a timestamp, long lengths, deep tuples
            at = rng.randrange(2, len(data))
            data[at:at] = rng.choice(HOSTILE_MSGPACK)
        return self._resigned(bytes(data), buffers)

    def _unsigned(self, header, buffers):
        frames = self.session.pack(header, buffers)
        signature = self.rng.choice([b"", b"0" * 64, frames[0][:-1], frames[0][::-1], os.urandom(32),
                                     Session(os.urandom(32)).sign(frames[1])])
        return [signature, *frames[1:]]

    def _replay(self, header, buffers):
        return list(self.rng.choice(self.sent)) if self.sent else None

    def _framing(self, header, buffers):
        frames = self.session.pack(header, buffers)
        return self.rng.choice([[frames[0]], [b""], [os.urandom(100)], frames[:1] + [b""] * 3])

    def _client(self, header, buffers):
        header["client"] = copy.deepcopy(self.rng.choice(JUNK))
        return self._signed(header, buffers)

    def _deep(self, header, buffers):
        header_bytes = _deep_list_header(self.rng.choice([1000, 10_000, 100_000]), header["id"])
        return self._resigned(header_bytes, [])

    def _big_frame(self, header, buffers):
        return self._signed(header, buffers + [os.urandom(self.rng.choice([1, 4, 8]) << 20)])


# ---------------------------------------------------------------- the run


def _fuzz(target, count, seed):
    process, templates = target
    key = process.info.key_bytes
    mutator = Mutator(seed, templates, key, process.info.worker_id)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(process.info.address)
    session = Session(key, peer=process.info.worker_id)  # replies are signed with the same key
    fence_array = np.arange(4.0)
    fence_desc = {"dtype": "<f8", "shape": [4], "order": "C", "where": "inline", "data": fence_array.tobytes()}

    def status():
        msg_id = new_id()
        sock.send_multipart(session.pack({"op": "status", "id": msg_id, "client": "fuzz-fence"}))
        return _until(msg_id)[0]

    def _until(msg_id):
        """Replies received until the one to ``msg_id``: (that reply, the ones before it)."""
        before = []
        while True:
            assert sock.poll(FENCE_TIMEOUT_MS), "the worker stopped answering"
            reply, _ = session.unpack(sock.recv_multipart())
            if reply.get("parent") == msg_id:
                return reply, before
            before.append(reply)

    kinds = {}
    first = status()
    pid = first["pid"]
    warm = min(1000, count // 2)  # malloc's arenas settle on the biggest mutants first: a leak grows on
    rss = []
    answered = {}  # mutant number -> the op of its reply ("reply" or "error")
    numbers = {}  # the ids mutants were sent with -> mutant number
    started = time.monotonic()
    try:
        for i in range(count):
            if i == warm:
                rss.append(worker_rss(pid))
            kind, frames, msg_id = mutator.next()
            kinds[kind] = kinds.get(kind, 0) + 1
            if isinstance(msg_id, str):
                numbers[msg_id] = i
            sock.send_multipart(frames)
            fence_id = new_id()
            sock.send_multipart(session.pack({
                "op": "echo", "id": fence_id, "client": "fuzz-fence", "arrays": [fence_desc],
                "payload": {"args": [{"__array__": 0}], "kwargs": {}},
            }))
            fence, before = _until(fence_id)
            assert fence["op"] == "reply", fence
            for reply in before:  # this mutant's reply, or (clients are served in turn) an earlier one's
                parent = reply.get("parent")
                number = numbers.get(parent, i) if isinstance(parent, str) and parent != msg_id else i
                number = i if number in answered else number
                assert number not in answered, (kind, reply.get("message"))  # one reply per message at most
                answered[number] = reply["op"]
            if i % max(1, count // 10) == 0 and i > warm:
                rss.append(worker_rss(pid))
        took = time.monotonic() - started
        rss.append(worker_rss(pid))
        last = status()
        outcomes = {"reply": 0, "error": 0, "no reply": count - len(answered)}
        for op in answered.values():
            outcomes[op] += 1
    finally:
        sock.close(linger=0)
        context.term()
    refused = {k: v - first["refused"].get(k, 0) for k, v in last["refused"].items()}
    assert last["pid"] == pid
    assert "failed" not in last["requests"], last["requests"]  # the loop's last-resort handler never ran
    # every silence is a counted refusal; a signed message of another time is refused with an error that says so
    assert sum(refused.values()) - refused.get("stale", 0) == outcomes["no reply"], (refused, outcomes)
    assert sum(outcomes.values()) == count
    growth = (rss[-1] - rss[0]) / rss[0]
    record("fuzz", messages=count, seed=seed, seconds=round(took, 1), outcomes=outcomes, refused=refused,
           kinds=kinds, rss_start_mb=round(rss[0] / 2**20, 1), rss_end_mb=round(rss[-1] / 2**20, 1),
           growth_percent=round(100 * growth, 2), rss_checkpoints_mb=[round(r / 2**20, 1) for r in rss])
    assert abs(growth) < 0.05, rss
    return outcomes


def _still_serves(process):
    use_worker(process)
    X = np.random.default_rng(3).standard_normal((300, 30))
    assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))
    sklearn_gpu_bridge.reset_connection()


def test_fuzzed_messages_are_answered_or_dropped_and_the_worker_carries_on(fuzz_target):
    outcomes = _fuzz(fuzz_target, count=2000, seed=1)
    assert min(outcomes.values()) > 50  # the mutants reach every outcome, not only the signature check
    _still_serves(fuzz_target[0])


@pytest.mark.slow
def test_fuzz_full_size(fuzz_target):
    _fuzz(fuzz_target, count=20_000, seed=2)
    _still_serves(fuzz_target[0])
