"""What a worker does with messages it must not trust, and with requests it must not obey.

Bad messages are sent through a raw DEALER socket to the real worker of the
session. A refused message gets no reply at all. The worker handles one peer's
messages in order and answers a ping at once, so when a ping sent right after
a bad message gets the first reply, the bad one got none; one test also waits
a full second of silence for all of them together. Then the worker's own
count of refusals, by reason, must have grown by exactly what was sent.
"""

import json
import os
import pickle
import re
import socket
import stat
import subprocess
import sys

import cloudpickle
import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUStandardScaler, ProtocolError
from sklearn_gpu_bridge.client import connect
from sklearn_gpu_bridge.errors import ConfigurationError
from sklearn_gpu_bridge.protocol import Session, new_id
from sklearn_gpu_bridge.runtime.keys import derived_client_pair
from sklearn_gpu_bridge.runtime.keys import make_pair as make_curve_keys
from sklearn_gpu_bridge.worker import check_settings

from .conftest import RawClient, WorkerProcess, assert_same, nested_tuples, use_worker

NO_REPLY_MS = 1000  # how long refused messages are given to (wrongly) get a reply
LATE_MS = 200  # and, after the ping proof, how long a late reply is still waited for


class Stranger(RawClient):
    """A raw client (conftest.RawClient) that signs with any key and checks what came back."""

    def frames(self, op, **fields):
        return self.session.pack(self.header(op, **fields))

    def send(self, frames):
        self.socket.send_multipart(frames)

    def assert_no_reply_and_still_served(self, wait_ms=LATE_MS):
        """A ping sent now gets the first reply (so what came before got none), then silence."""
        header = self.header("ping")
        reply, _ = self.request(header)
        assert reply["op"] == "reply"
        assert self.receive(wait_ms) is None


@pytest.fixture
def raw(worker):
    client = Stranger(worker)
    yield client
    client.close()


def _refused(connection):
    return dict(connection.status()["refused"])


def _grew(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _ping_header_bytes(key):
    return Session(key).pack({"op": "ping", "id": new_id()})[1]


class _Touch:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _signed(key, header_bytes):
    return [Session(key).sign(header_bytes), header_bytes]


def _ping_with(value_bytes):
    """A ping's header written by hand, with a field ``x`` that holds ``value_bytes`` (what no packer writes)."""
    return b"\x83" + b"".join(msgpack.packb(v) for v in ("op", "ping", "id", new_id(), "x")) + value_bytes


BAD_MESSAGES = {
    # name: (reason the worker counts, frames built from the worker's key)
    "garbage-signature": ("bad_signature", lambda key: [b"f" * 64, _ping_header_bytes(key)]),
    "empty-signature": ("bad_signature", lambda key: [b"", _ping_header_bytes(key)]),
    "wrong-key": ("bad_signature", lambda key: Session(os.urandom(32)).pack({"op": "ping", "id": new_id()})),
    "key-with-one-bit-flipped": (
        "bad_signature",
        lambda key: Session(bytes([key[0] ^ 1]) + key[1:]).pack({"op": "ping", "id": new_id()}),
    ),
    "garbage-single-frame": ("truncated", lambda key: [os.urandom(300)]),
    "one-empty-frame": ("truncated", lambda key: [b""]),
    "two-empty-frames": ("bad_signature", lambda key: [b"", b""]),
    # each built fresh: an identical signed message sent again would be a replay
    "signed-garbage": ("malformed", lambda key: _signed(key, b"\xc1not msgpack " + os.urandom(8))),
    "signed-non-dict": ("malformed", lambda key: _signed(key, msgpack.packb(["ping", new_id()]))),
    "signed-without-op": ("malformed", lambda key: _signed(key, msgpack.packb({"id": new_id()}))),
    "signed-pickle": ("malformed", lambda key: _signed(key, pickle.dumps({"op": "ping", "id": new_id()}, protocol=5))),
    "signed-extension-type": ("malformed", lambda key: _signed(key, _ping_with(msgpack.packb(msgpack.ExtType(42, b"x"))))),
    # each tuple is read by a call of msgpack of its own, on the C stack: 2000 deep kill an unbounded reader
    "signed-tuples-nested-2000-deep": ("malformed", lambda key: _signed(key, _ping_with(nested_tuples(2000)))),
}


@pytest.mark.parametrize("name", list(BAD_MESSAGES))
def test_bad_message_gets_no_reply_and_is_counted(connection, worker, raw, name):
    reason, build = BAD_MESSAGES[name]
    before = _refused(connection)
    raw.send(build(worker.info.key_bytes))
    raw.assert_no_reply_and_still_served()
    assert _grew(before, _refused(connection)) == {reason: 1}


def test_replayed_message_gets_no_reply_and_is_counted(connection, raw):
    frames = raw.frames("ping")
    raw.send(frames)
    assert raw.receive() is not None
    before = _refused(connection)
    for _ in range(2):
        raw.send(list(frames))
    raw.assert_no_reply_and_still_served()
    assert _grew(before, _refused(connection)) == {"replayed": 2}


def test_no_bad_message_gets_a_reply_within_a_second(connection, worker, raw):
    valid = raw.frames("ping")
    raw.send(valid)
    assert raw.receive() is not None
    before = _refused(connection)
    expected = {"replayed": 1}
    raw.send(list(valid))
    for reason, build in BAD_MESSAGES.values():
        raw.send(build(worker.info.key_bytes))
        expected[reason] = expected.get(reason, 0) + 1
    assert raw.receive(NO_REPLY_MS) is None
    raw.assert_no_reply_and_still_served()
    assert _grew(before, _refused(connection)) == expected


def test_replayed_fit_creates_nothing(connection, raw):
    X = np.arange(12.0).reshape(4, 3)
    desc = {"dtype": X.dtype.str, "shape": list(X.shape), "order": "C", "where": "inline", "data": X.tobytes()}
    header = raw.header(
        "fit", estimator="StandardScaler", method="fit", params={}, arrays=[desc],
        payload={"args": [{"__array__": 0}], "kwargs": {}},
    )
    frames = raw.session.pack(header)
    handles = connection.status()["handles"]
    raw.send(frames)
    reply = raw.receive()
    assert reply is not None and reply[0]["op"] == "reply"
    assert connection.status()["handles"] == handles + 1
    raw.send(list(frames))
    raw.assert_no_reply_and_still_served()
    assert connection.status()["handles"] == handles + 1
    raw.request(raw.header("goodbye"))  # frees the raw client's handle
    assert connection.status()["handles"] == handles


def test_signed_header_with_a_pickle_global_runs_nothing(connection, worker, raw, tmp_path):
    marker = tmp_path / "MARKER"
    header = {"op": "ping", "id": new_id(), "x": _Touch(marker)}
    header_bytes = pickle.dumps(header, protocol=5)
    assert b"system" in header_bytes
    before = _refused(connection)
    raw.send(_signed(worker.info.key_bytes, header_bytes))
    raw.assert_no_reply_and_still_served()
    assert _grew(before, _refused(connection)) == {"malformed": 1}
    assert not marker.exists()


@pytest.mark.parametrize("op", ["frobnicate", "_attach_pool", "__init__", "close", "serve_forever", "_release"])
def test_unknown_operation_gets_an_error(connection, raw, op):
    reply, _ = raw.request(raw.header(op))
    assert reply["op"] == "error"
    assert reply["mro"][0][1] == "ProtocolError" and "unknown operation" in reply["message"]
    assert connection.status()["pid"] == connection.info.pid


# ---------------------------------------------------------------- the connection file


def test_connection_file_is_owner_only_and_holds_a_fresh_key(worker):
    mode = os.stat(worker.connection_file).st_mode
    assert stat.S_ISREG(mode)
    assert mode & 0o777 == 0o600
    data = json.loads(worker.connection_file.read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", data["key"])
    assert data["key"] == worker.info.key
    assert re.fullmatch(r"[0-9a-f]{24}", data["worker_id"])
    assert data["address"].startswith("ipc://")  # a socket of this user's, by default
    socket_path = data["address"][len("ipc://"):]
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert stat.S_IMODE(os.lstat(os.path.dirname(socket_path)).st_mode) == 0o700
    assert not data.get("curve_server_key")


def test_two_workers_have_different_keys_and_refuse_each_other(worker, fresh_worker):
    assert os.stat(fresh_worker.connection_file).st_mode & 0o777 == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}", fresh_worker.info.key)
    assert fresh_worker.info.key != worker.info.key
    assert fresh_worker.info.address != worker.info.address
    stranger = Stranger(fresh_worker, key=worker.info.key_bytes)  # the other worker's key
    try:
        stranger.send(stranger.frames("ping"))
        assert stranger.receive(LATE_MS) is None
    finally:
        stranger.close()
    connection = sklearn_gpu_bridge.get_connection()
    assert connection.info.address == fresh_worker.info.address
    assert connection.status()["refused"] == {"bad_signature": 1}


# ---------------------------------------------------------------- what a signed request may reach


@pytest.mark.parametrize(
    "name",
    ["os.system", "Popen", "subprocess.Popen", "sklearn.svm.SVC", "builtins.eval", "__builtins__",
     "StandardScaler ", "standardscaler", "", None, 7],
)
def test_estimator_outside_the_backend_table_is_refused(connection, name):
    handles = connection.status()["handles"]
    header = {"op": "fit", "estimator": name, "method": "fit", "params": {}}
    with pytest.raises(ValueError, match="unknown estimator"):
        connection.transport.request(header, {"args": [], "kwargs": {}})
    assert connection.status()["handles"] == handles


@pytest.mark.parametrize("method", ["__reduce__", "__init__", "set_params", "_validate_params", "predict", "score"])
def test_fit_with_a_method_that_does_not_fit_is_refused(connection, method):
    handles = connection.status()["handles"]
    header = {"op": "fit", "estimator": "StandardScaler", "method": method, "params": {}}
    with pytest.raises(ProtocolError, match="not a fitting method"):
        connection.transport.request(header, {"args": [np.ones((3, 2))], "kwargs": {}})
    assert connection.status()["handles"] == handles


def test_set_state_of_an_unknown_estimator_never_unpickles(connection, tmp_path):
    marker = tmp_path / "MARKER"
    blob = cloudpickle.dumps(_Touch(marker))
    with pytest.raises(ValueError, match="unknown estimator"):
        connection.set_state("Popen", "portable", blob)
    with pytest.raises(ValueError, match="unknown state form"):
        connection.set_state("StandardScaler", "joblib", blob)
    assert not marker.exists()


@pytest.fixture
def fitted(connection):
    """(handle, X) of a StandardScaler fitted on the worker through GPUStandardScaler."""
    X = np.random.default_rng(0).standard_normal((20, 3)) * 5 + 2
    scaler = GPUStandardScaler().fit(X)
    handle = scaler._remote.handle
    yield handle, X
    del scaler


@pytest.mark.parametrize(
    "method",
    ["__class__", "__reduce__", "__reduce_ex__", "__init__", "__setattr__", "__getattribute__", "__dict__",
     "_private", "_validate_params", "set_params", "get_params", "__sklearn_tags__", "mean_", "", None, 5],
)
def test_calling_a_method_outside_the_allowed_list_is_refused(connection, fitted, method):
    handle, X = fitted
    with pytest.raises((AttributeError, ProtocolError), match="may call"):
        connection.call(handle, method, [], {"with_mean": False})
    expected = StandardScaler().fit(X).transform(X)
    assert_same(connection.call(handle, "transform", [X], {}), expected)  # the model is as it was


@pytest.mark.parametrize("handle", [10**9, -1, "1", None, [1]])
def test_call_on_a_handle_that_does_not_exist_is_refused(connection, handle):
    with pytest.raises((KeyError, TypeError)):
        connection.call(handle, "transform", [np.ones((2, 3))], {})


# ---------------------------------------------------------------- keys and addresses at start-up


CLI = (sys.executable, "-c", "from sklearn_gpu_bridge.cli import main; main()")


def _start_refused(tmp_path, *args, timeout=60):
    """Run a worker that must refuse to start: (exit code, output); no connection file may appear."""
    connection_file = tmp_path / "refused.json"
    run = subprocess.run(
        [sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", "sklearn",
         "--connection-file", str(connection_file), *args],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )
    assert not connection_file.exists()
    return run.returncode, run.stdout + run.stderr


def _private_file(path, text):
    path.write_text(text)
    path.chmod(0o600)
    return path


def _make_keys(folder, cli=False, name="worker"):
    if not cli:
        return make_curve_keys(folder, name)
    run = subprocess.run([*CLI, "keys", str(folder)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert str(folder / "worker.key_secret") in run.stdout
    return folder / "worker.key", folder / "worker.key_secret"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.org", "127.0.0.1.nip.io"])
def test_binding_beyond_loopback_without_keys_is_refused(host):
    with pytest.raises(ConfigurationError, match="needs CurveZMQ encryption keys") as refused:
        check_settings(bind=host)
    assert "sklearn-gpu-bridge keys DIR" in str(refused.value)


@pytest.mark.parametrize("host", ["ipc", "127.0.0.1", "127.3.4.5", "::1", "localhost"])
def test_loopback_needs_no_keys(host):
    key, curve, allowed = check_settings(bind=host)
    assert re.fullmatch(r"[0-9a-f]{64}", key) and curve is None
    assert allowed == {derived_client_pair(bytes.fromhex(key))[0]}  # only a holder of the key


def test_worker_command_beyond_loopback_without_keys_exits_and_says_how_to_make_them(tmp_path):
    code, output = _start_refused(tmp_path, "--bind", "0.0.0.0")
    assert code != 0
    assert "needs CurveZMQ encryption keys" in output
    assert "sklearn-gpu-bridge keys DIR" in output and "--curve-secret-key DIR/worker.key_secret" in output


def test_keys_command_writes_an_owner_only_secret_and_refuses_to_overwrite(tmp_path):
    public_file, secret_file = _make_keys(tmp_path / "keys", cli=True)
    assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    public, secret = zmq.auth.load_certificate(secret_file)
    assert len(public) == len(secret) == 40 and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(public_file) == (public, None)
    again = subprocess.run([*CLI, "keys", str(tmp_path / "keys")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "--force" in again.stderr
    assert zmq.auth.load_certificate(secret_file) == (public, secret)  # untouched


def test_a_secret_key_file_that_others_can_read_is_refused(tmp_path):
    _, secret_file = _make_keys(tmp_path / "keys")
    assert check_settings(bind="0.0.0.0", curve_secret_key=secret_file)[1] is not None
    os.chmod(secret_file, 0o640)
    with pytest.raises(ConfigurationError, match=f"chmod 600 {secret_file}"):
        check_settings(bind="0.0.0.0", curve_secret_key=secret_file)


def test_a_public_key_file_is_no_secret_key(tmp_path):
    public_file, _ = _make_keys(tmp_path / "keys")
    os.chmod(public_file, 0o600)
    with pytest.raises(ConfigurationError, match="holds no secret key"):
        check_settings(bind="0.0.0.0", curve_secret_key=public_file)
    with pytest.raises(ConfigurationError, match="No such file"):
        check_settings(bind="0.0.0.0", curve_secret_key=tmp_path / "absent")


@pytest.mark.parametrize("key, message", [
    ("", "empty"), (b"", "empty"), ("\n  \n", "empty"), ("0123abcd", "at least 128 bits"),
    ("not hex at all!", "hex digits"),
], ids=["empty", "empty-bytes", "blank", "short", "not-hex"])
def test_a_bad_signing_key_is_refused(key, message):
    with pytest.raises(ConfigurationError, match=message):
        check_settings(bind="127.0.0.1", key=key)


def test_worker_command_with_an_empty_key_file_exits(tmp_path):
    _private_file(tmp_path / "key", "")
    code, output = _start_refused(tmp_path, "--key-file", str(tmp_path / "key"))
    assert code != 0 and "empty" in output and "signing off" in output


def test_worker_uses_a_signing_key_it_is_given(tmp_path):
    key = os.urandom(32).hex()
    _private_file(tmp_path / "key", key + "\n")
    process = WorkerProcess(tmp_path, key_file=tmp_path / "key")
    try:
        assert process.info.key == key
        client = Stranger(process)
        try:
            assert client.request(client.header("ping"))[0]["op"] == "reply"
        finally:
            client.close()
    finally:
        process.stop()


@pytest.mark.parametrize("key", ["", "zz"], ids=["empty", "not-hex"])
def test_client_refuses_a_connection_file_with_a_bad_key(worker, tmp_path, key):
    data = json.loads(worker.connection_file.read_text())
    data["key"] = key
    path = _private_file(tmp_path / "bad-key.json", json.dumps(data))
    sklearn_gpu_bridge.reset_connection()
    with sklearn_gpu_bridge.config_context(connection_file=str(path)):
        with pytest.raises(ConfigurationError, match="is empty|hex digits"):
            sklearn_gpu_bridge.get_connection()
    sklearn_gpu_bridge.reset_connection()


def _server_mechanism(address):
    """The security mechanism a ZeroMQ listener announces in its ZMTP 3 greeting (read off a raw TCP socket)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    host = "127.0.0.1" if host in ("0.0.0.0", "*") else host
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"\xff" + bytes(8) + b"\x7f" + b"\x03")  # signature and major version: the server answers
        # with its whole greeting (version, mechanism, as-server) before it learns which mechanism we speak
        received = b""
        while len(received) < 64:
            chunk = conn.recv(64 - len(received))
            if not chunk:
                break
            received += chunk
    return received[12:32].rstrip(b"\x00").decode()


def test_a_worker_listens_on_a_private_socket_by_default_and_behind_plain_on_loopback_tcp(worker, tmp_path):
    """ipc: only this user can connect; TCP on loopback: ZeroMQ's PLAIN, the password derived from the key."""
    assert worker.info.address.startswith("ipc://")
    process = WorkerProcess(tmp_path, bind="127.0.0.1")
    try:
        assert process.info.address.startswith("tcp://127.0.0.1:")
        assert _server_mechanism(process.info.address) == "PLAIN"
    finally:
        process.stop()


@pytest.fixture(scope="module")
def curve_worker(tmp_path_factory):
    """A worker beyond loopback: CurveZMQ, and besides the key's own client key, one made by `keys`."""
    tmp_path = tmp_path_factory.mktemp("curve")
    public_file, secret_file = _make_keys(tmp_path / "keys")
    _, client_secret = _make_keys(tmp_path / "allowed", name="laptop")
    process = WorkerProcess(tmp_path, bind="0.0.0.0", curve_secret_key=secret_file, curve_allow=tmp_path / "allowed")
    yield process, zmq.auth.load_certificate(public_file)[0].decode(), client_secret
    sklearn_gpu_bridge.reset_connection()
    process.stop()


def test_client_and_worker_talk_over_curve(curve_worker, worker):
    """Bound to 0.0.0.0 with the user's keys: CURVE on the wire, the public key in the file, a client that works."""
    process, public, client_secret = curve_worker
    assert process.info.curve_server_key == public
    assert process.info.address.startswith("tcp://0.0.0.0:")
    assert _server_mechanism(process.info.address) == "CURVE"
    use_worker(process)
    try:
        X = np.random.default_rng(0).normal(size=(2000, 8))  # 128 KB: frames or pool, not only inline
        assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))
        connection = sklearn_gpu_bridge.get_connection()
        assert connection.info.curve_server_key == public
        assert connection.status()["refused"] == {}
        sklearn_gpu_bridge.reset_connection()
        with sklearn_gpu_bridge.config_context(curve_secret_key=str(client_secret)):  # a key on --curve-allow
            assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))
    finally:
        sklearn_gpu_bridge.reset_connection()
        use_worker(worker)


def _curve_peer(process, server_key, client_pair=None):
    """A DEALER that speaks CurveZMQ with the given keys and sends a correctly signed ping."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = client_pair or zmq.curve_keypair()
    sock.connect(process.info.address)
    session = Session(process.info.key_bytes, peer=process.info.worker_id)
    sock.send_multipart(session.pack({"op": "ping", "id": new_id(), "client": "peer-" + new_id()}))
    answered = bool(sock.poll(NO_REPLY_MS))
    sock.close(linger=0)
    context.term()
    return answered


def test_curve_lets_in_only_allowed_client_keys(curve_worker):
    """Knowing the server's public key (it is in a file anyone may read) is not enough: the client key must be allowed.

    Every peer below signs with the right HMAC key, so what refuses them is the handshake, before any message.
    """
    process, public, client_secret = curve_worker
    before = _status_of_curve(process)["refused"].get("handshake", 0)
    assert not _curve_peer(process, None)  # no CURVE at all
    assert not _curve_peer(process, zmq.curve_keypair()[0])  # someone else's server
    assert not _curve_peer(process, public.encode())  # the right server, an unknown client key
    refused = _status_of_curve(process)["refused"].get("handshake", 0) - before
    assert refused >= 1  # the unknown client key is counted (ZAP); the others fail the handshake sooner
    assert _curve_peer(process, public.encode(), derived_client_pair(process.info.key_bytes))
    assert _curve_peer(process, public.encode(), zmq.auth.load_certificate(client_secret))


def _status_of_curve(process):
    connection = connect(process.info, pool="off", array_cache="off")
    try:
        return connection.status()
    finally:
        connection.close()


def test_on_tcp_frames_are_of_a_mebibyte_and_clients_split_what_is_longer(tmp_path):
    """A TCP worker takes frames of at most 1 MiB (what a peer without the key may make it buffer in a handshake):
    an honest client sends longer arrays and fitted state as several frames, and gets the same answers; a header
    that cannot fit one frame is refused before it is sent, with the reason."""
    process = WorkerProcess(tmp_path, bind="127.0.0.1")
    connection = connect(process.info, pool="off", array_cache="off")
    try:
        assert connection.capabilities.max_frame_bytes == 1 << 20
        X = np.random.default_rng(0).standard_normal((40_000, 60))  # 19 MB: 19 frames
        (back,) = connection.echo(X)
        np.testing.assert_array_equal(back, X)
        state = cloudpickle.dumps(StandardScaler().fit(X[:, :3]))
        big_state = state + bytes(3 << 20)  # a fitted state of 3 MB (cloudpickle stops at its own end)
        handle = connection.set_state("StandardScaler", "portable", big_state)
        assert_same(connection.call(handle, "transform", [X[:5, :3]], {}), StandardScaler().fit(X[:, :3]).transform(
            X[:5, :3]))
        with pytest.raises(ProtocolError, match="longer than the worker's largest frame"):
            connection.transport.roundtrip({"op": "ping", "padding": "x" * (2 << 20)})
        assert connection.status()["refused"] == {}
    finally:
        connection.close()
        process.stop()
