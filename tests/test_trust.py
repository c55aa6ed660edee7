"""The trust boundary, attacked: another local user, a peer without the key, a hostile client with the key.

Each test does what that attacker would do and checks that it gets nothing:
no code run as the bridge's user, no message parsed or buffered without the
credentials, nothing of another client's reached, no worker killed or
stalled. (docs/reliability.md, "Who is trusted", maps each to its property.)

Tests that need a second local user create one when running as root and are
skipped with the reason otherwise. Figures (memory, latency during floods,
time to free a dead client) are printed and recorded, never asserted on time.
"""

import getpass
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUStandardScaler
from sklearn_gpu_bridge.client import connect
from sklearn_gpu_bridge.errors import ConfigurationError
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Session, new_id
from sklearn_gpu_bridge.runtime.connection_file import read_connection_file, read_key_file
from sklearn_gpu_bridge.runtime.keys import PLAIN_USER
from sklearn_gpu_bridge.runtime.private_files import pid_alive
from sklearn_gpu_bridge.shm import default_directory

from .conftest import BACKEND, RawClient, WorkerProcess, assert_same, own_worker, record, wait_until

REPLY_MS = 60_000
CPU_ONLY = pytest.mark.skipif(BACKEND != "sklearn", reason="the slow fits these use are slow on the CPU backend")


def _rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _shared_folder(sticky):
    """A folder every local user may write to, as /tmp is (sticky) or as a careless share is (not)."""
    folder = Path(tempfile.mkdtemp(prefix="sgb-shared-"))
    folder.chmod(0o1777 if sticky else 0o777)
    return folder


def _client_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKLEARN_GPU_BRIDGE_") and k != "XDG_RUNTIME_DIR"}
    env.update(SKLEARN_GPU_BRIDGE_LOCAL_BACKEND="sklearn", **extra)
    return env


# ================================================================ another local user


_LOCAL_CLIENT = textwrap.dedent("""
    import numpy as np, sklearn_gpu_bridge as sgb
    from sklearn_gpu_bridge.errors import ConfigurationError
    try:
        sgb.GPUStandardScaler().fit(np.ones((4, 2)))
        print("FITTED")
    except ConfigurationError as exc:
        print("REFUSED", exc)
""")


def _run_local_client(tmpdir):
    """A user's program with no worker configured: it starts the embedded local worker (in TMPDIR)."""
    return subprocess.run([sys.executable, "-c", _LOCAL_CLIENT], capture_output=True, text=True, timeout=120,
                          env=_client_env(TMPDIR=str(tmpdir)), cwd=tmpdir)


def test_another_user_cannot_plant_code_in_the_local_workers_folder(other_user):
    """The old worker ran `python -m` in /tmp/sklearn-gpu-bridge-<user>, whoever had made it: a planted package ran."""
    tmp = _shared_folder(sticky=True)
    marker = tmp / "PLANTED-CODE-RAN"
    planted = "open('%s', 'w').close()" % marker
    for name in (os.getuid(), getpass.getuser()):  # the folder by uid (now) and by user name (before)
        folder = tmp / f"sklearn-gpu-bridge-{name}"
        package = folder / "sklearn_gpu_bridge"
        other_user.sh(f"mkdir -m 777 {folder} {package} {package}/worker && for f in __init__ worker/__init__ "
                      f"worker/__main__; do echo \"{planted}\" > {package}/$f.py; done")
    run = _run_local_client(tmp)
    folder = tmp / f"sklearn-gpu-bridge-{os.getuid()}"
    assert "REFUSED" in run.stdout and str(folder) in run.stdout and "another user" in run.stdout, run
    assert not marker.exists()


def test_a_link_in_place_of_the_local_workers_folder_is_refused(other_user):
    tmp = _shared_folder(sticky=True)
    folder = tmp / f"sklearn-gpu-bridge-{os.getuid()}"
    other_user.sh(f"mkdir -m 777 {tmp}/theirs && ln -s {tmp}/theirs {folder}")
    run = _run_local_client(tmp)
    assert "REFUSED" in run.stdout and "symbolic link" in run.stdout, run
    assert os.listdir(tmp / "theirs") == []  # nothing of ours was written into their folder


def test_a_log_file_link_planted_by_another_user_is_not_followed(other_user, tmp_path):
    """`start --log-file` in a shared folder: a link planted there must not make the worker append to our files."""
    shared = _shared_folder(sticky=False)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    other_user.sh(f"ln -s {victim} {shared}/worker.log")
    run = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge", "start", "--backend", "sklearn",
                          "--connection-file", str(tmp_path / "w.json"), "--log-file", str(shared / "worker.log")],
                         capture_output=True, text=True, timeout=120, env=_client_env())
    assert run.returncode != 0, run
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "w.json").exists()


def test_stop_never_removes_another_users_socket(other_user, tmp_path):
    """``stop`` tidies the socket a killed worker left, but only a socket of this user: one planted by another
    user at the address our connection file names stays (as root, an unchecked unlink would remove it)."""
    from sklearn_gpu_bridge.manage import service
    from sklearn_gpu_bridge.runtime.connection_file import ConnectionInfo, new_key, write_connection_file

    shared = _shared_folder(sticky=True)
    theirs = shared / "worker.sock"
    other_user.run([other_user.python, "-c", f"import socket; socket.socket(socket.AF_UNIX).bind({str(theirs)!r})"])
    assert stat.S_ISSOCK(theirs.lstat().st_mode) and theirs.lstat().st_uid == other_user.uid
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the pid of a worker that is no more
    connection_file = tmp_path / "w.json"
    write_connection_file(connection_file, ConnectionInfo(
        address=f"ipc://{theirs}", key=new_key(), protocol_version=PROTOCOL_VERSION, pid=gone.pid, backend="sklearn",
        worker_id=new_id()))
    result = service.stop(connection_file=connection_file, timeout=1.0)
    assert result["stopped"] and str(connection_file) in result["removed"]
    assert str(theirs) not in result["removed"] and stat.S_ISSOCK(theirs.lstat().st_mode)


def _foreign_connection_file(other_user, folder, data):
    path = folder / "worker.json"
    other_user.sh(f"umask 077 && echo '{json.dumps(data)}' > {path}")
    return path


def test_a_connection_file_another_user_wrote_is_refused(other_user, worker):
    """A rogue file (their worker, their key) where a client looks: refused before anything is sent or unpickled."""
    shared = _shared_folder(sticky=True)
    data = json.loads(worker.connection_file.read_text())
    path = _foreign_connection_file(other_user, shared, data)
    assert os.stat(path).st_uid == other_user.uid and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(ConfigurationError, match="belongs to another user"):
        read_connection_file(path)
    sklearn_gpu_bridge.reset_connection()
    with sklearn_gpu_bridge.config_context(connection_file=str(path)):
        with pytest.raises(ConfigurationError, match="another user"):
            GPUStandardScaler().fit(np.ones((4, 2)))
    sklearn_gpu_bridge.reset_connection()


@pytest.mark.parametrize("how", ["readable-by-others", "in-a-folder-others-write"])
def test_a_connection_file_others_may_read_or_replace_is_refused(worker, how):
    folder = _shared_folder(sticky=False) if how == "in-a-folder-others-write" else Path(tempfile.mkdtemp())
    path = folder / "worker.json"
    path.write_text(worker.connection_file.read_text())
    path.chmod(0o644 if how == "readable-by-others" else 0o600)
    with pytest.raises(ConfigurationError, match="chmod"):
        read_connection_file(path)


@pytest.mark.parametrize("how", ["0644", "another-user", "link"])
def test_a_key_file_others_may_read_or_own_is_refused(tmp_path, how, request):
    key = os.urandom(32).hex()
    path = tmp_path / "key"
    if how == "0644":
        path.write_text(key)
        path.chmod(0o644)
        expected = "chmod 600"
    elif how == "another-user":
        other = request.getfixturevalue("other_user")
        shared = _shared_folder(sticky=True)
        path = shared / "key"
        other.sh(f"umask 077 && echo {key} > {path}")
        expected = "another user"
    else:
        (tmp_path / "real").write_text(key)
        (tmp_path / "real").chmod(0o600)
        path.symlink_to(tmp_path / "real")
        expected = "symbolic link"
    with pytest.raises(ConfigurationError, match=expected):
        read_key_file(path)
    run = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", "sklearn",
                          "--connection-file", str(tmp_path / "w.json"), "--key-file", str(path)],
                         capture_output=True, text=True, timeout=60, env=_client_env(), cwd=tmp_path)
    assert run.returncode != 0 and expected in run.stderr and not (tmp_path / "w.json").exists()


def test_a_process_of_another_user_is_never_taken_for_ours(other_user):
    """A pid in a stale file may now be another user's process: it must not pass for our live worker or lock."""
    sleeper = subprocess.Popen(["sleep", "30"], user=other_user.uid, group=other_user.gid, extra_groups=[])
    try:
        assert os.path.exists(f"/proc/{sleeper.pid}")
        assert not pid_alive(sleeper.pid)
        assert pid_alive(os.getpid())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_user_cannot_connect_to_the_workers_socket(other_user, worker):
    """On one host the worker listens on a socket in a 0700 folder: another user's connect is refused by the OS."""
    assert worker.info.address.startswith("ipc://")
    path = worker.info.address[len("ipc://"):]
    if other_user.python is None:
        pytest.skip("no Python the other user may run")
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('CONNECTED')\nexcept OSError as e:\n    print('REFUSED', e.errno)")
    run = other_user.run([other_user.python, "-c", probe, path])
    assert run.stdout.startswith("REFUSED"), run


# ================================================================ a peer without the key


@pytest.fixture(scope="module")
def tcp_worker(tmp_path_factory):
    """A worker on loopback TCP (how Windows reaches WSL2): the only kind another peer can reach at all."""
    process = WorkerProcess(tmp_path_factory.mktemp("tcp"), bind="127.0.0.1")
    yield process
    process.stop()


def _honest_round_trips(connection, stop, times, errors):
    small = np.arange(16.0)
    while not stop.is_set():
        start = time.perf_counter()
        try:
            np.testing.assert_array_equal(connection.echo(small)[0], small)
            times.append(time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - counted: the assertion below says which
            errors.append(repr(exc))


def _flood(address, kind, stop):
    """What a peer without the key can throw at the worker's TCP port."""
    context = zmq.Context()
    sockets = []
    try:
        if kind in ("million-frames", "256MB-messages"):
            for mechanism in ("null", "wrong-password"):
                sock = context.socket(zmq.DEALER)
                sock.linger = 0
                sock.sndtimeo = 2000  # the gate refuses the connection: sends then have nowhere to go
                if mechanism == "wrong-password":
                    sock.plain_username, sock.plain_password = PLAIN_USER, b"guess"
                sock.connect(address)
                sockets.append(sock)
                try:
                    if kind == "million-frames":
                        sock.send_multipart([b""] * 1_000_000)
                    else:
                        for _ in range(4):
                            sock.send(np.zeros(256 << 20, np.uint8), copy=False)
                except zmq.Again:
                    pass
        elif kind == "many-connections":
            host, port = address[len("tcp://"):].rsplit(":", 1)
            for _ in range(2000):
                raw = socket.create_connection((host, int(port)))
                sockets.append(raw)
        elif kind == "garbage-bytes":
            host, port = address[len("tcp://"):].rsplit(":", 1)
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                with socket.create_connection((host, int(port))) as raw:
                    try:
                        raw.sendall(os.urandom(1 << 20))
                    except OSError:
                        pass
        stop.wait(3.0)
    finally:
        for sock in sockets:
            sock.close(**({"linger": 0} if isinstance(sock, zmq.Socket) else {}))
        context.term()


@pytest.mark.parametrize("kind", ["million-frames", "256MB-messages", "many-connections", "garbage-bytes"])
def test_a_peer_without_the_key_cannot_stall_or_bloat_the_worker(tcp_worker, kind):
    """Without the credentials nothing becomes a message: it costs a refused handshake, never a parse or a buffer.

    Before the gate, one unsigned message of a million empty frames stalled the loop for seconds and a few
    256 MB messages cost gigabytes. An honest client talks to the worker throughout.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    connection = connect(tcp_worker.info, pool="off", array_cache="off")
    try:
        idle = []
        for _ in range(50):
            start = time.perf_counter()
            connection.echo(np.arange(16.0))
            idle.append(time.perf_counter() - start)
        rss_before = _rss_mb(tcp_worker.pid)
        refused_before = connection.status()["refused"].get("handshake", 0)
        stop, times, errors = threading.Event(), [], []
        honest = threading.Thread(target=_honest_round_trips, args=(connection, stop, times, errors))
        flooder = threading.Thread(target=_flood, args=(tcp_worker.info.address, kind, stop))
        honest.start()
        flooder.start()
        flooder.join(timeout=120)
        stop.set()
        honest.join(timeout=60)
        status = connection.status()
        rss_after = _rss_mb(tcp_worker.pid)
    finally:
        connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    record("unauthenticated_flood", kind=kind, honest_calls=len(times), honest_errors=len(errors),
           idle_median_ms=round(1e3 * float(np.median(idle)), 3),
           flood_median_ms=round(1e3 * float(np.median(times)), 3) if times else None,
           flood_max_ms=round(1e3 * max(times), 1) if times else None,
           worker_rss_before_mb=round(rss_before, 1), worker_rss_after_mb=round(rss_after, 1),
           handshakes_refused=status["refused"].get("handshake", 0) - refused_before)
    assert not errors and times, errors[:3]
    assert rss_after - rss_before < 64, (rss_before, rss_after)
    assert status["requests"].get("unknown", 0) == 0 and status["pid"] == tcp_worker.pid
    if kind in ("million-frames", "256MB-messages"):  # the wrong password got as far as the ZAP handler
        assert status["refused"].get("handshake", 0) > refused_before


# ================================================================ a hostile client with the key


class KeyHolder(RawClient):
    """A client that has the key (it read the connection file) but is not the victim: its own id, raw requests."""

    def __init__(self, worker):
        super().__init__(worker, name="hostile", reply_ms=REPLY_MS)

    def send(self, op, buffers=(), **fields):
        return self.send_header(self.header(op, **fields), buffers)

    def ask(self, op, buffers=(), **fields):
        """Send a request and wait for its reply, passing over late replies to earlier ones."""
        msg_id = self.send(op, buffers, **fields)
        while True:
            reply = self.receive()
            assert reply is not None, f"no reply to {op}"
            if reply[0].get("parent") == msg_id:
                return reply


@pytest.fixture
def hostile(worker):
    client = KeyHolder(worker)
    yield client
    client.close()


def test_another_clients_handle_is_not_there(connection, hostile):
    """Handles are random and owned: call, attribute, get_state and release of a victim's model all find nothing."""
    X = np.random.default_rng(0).standard_normal((50, 4)) * 3 + 1
    victim = GPUStandardScaler().fit(X)
    handle = victim._remote.handle
    for op, fields in [("call", {"method": "transform", "payload": {"args": [], "kwargs": {}}}),
                       ("attribute", {"name": "mean_"}), ("get_state", {})]:
        reply, buffers = hostile.ask(op, handle=handle, **fields)
        assert reply["op"] == "error" and reply["mro"][0][1] == "KeyError", reply
        assert "this client has no estimator with handle" in reply["message"] and not buffers
    hostile.ask("release", release=[handle])
    hostile.ask("goodbye")
    assert_same(victim.transform(X), StandardScaler().fit(X).transform(X))  # still there, still the victim's


def test_another_clients_pool_cannot_be_attached(connection, hostile):
    """Naming the victim's pool gets a nonce written where only the victim can read it; a guess attaches nothing."""
    pool = connection.pool
    assert pool is not None
    victim_data = np.arange(50_000.0)  # travels in a pool block
    reply, _ = hostile.ask("hello", protocol_version=PROTOCOL_VERSION, pid=os.getpid(), pool=pool.describe())
    slot = reply["pool_challenge"]
    assert slot is not None and reply["pool"] is False
    for guess in (bytes(32), b"\xff" * 32, os.urandom(32)):
        attached, _ = hostile.ask("attach", nonce=guess)
        assert attached["pool"] is False
        reply, _ = hostile.ask("hello", protocol_version=PROTOCOL_VERSION, pid=os.getpid(), pool=pool.describe())
    desc = {"dtype": "<f8", "shape": [8], "order": "C", "where": "pool",
            "segment": pool.handshake.segment, "offset": 0}
    reply, _ = hostile.ask("echo", pool=pool.name, arrays=[desc],
                           payload={"args": [{"__array__": 0}], "kwargs": {}})
    assert reply["op"] == "error" and "did not attach" in reply["message"]
    np.testing.assert_array_equal(connection.echo(victim_data)[0], victim_data)  # the victim's pool still works


def test_another_clients_pool_is_not_written_with_a_reply(connection, hostile):
    """A reply slot (protocol.reply_slot) naming the victim's pool and a block the victim uses: the worker
    writes replies only into the pool the requesting client attached, so the victim's bytes stay as they were."""
    pool = connection.pool
    block = pool.allocate(1)
    try:
        pattern = np.frombuffer(os.urandom(block.nbytes), np.uint8)
        block.buffer()[:] = pattern
        slot = {"segment": block.segment, "offset": block.offset, "nbytes": block.nbytes, "token": 12345}
        for op in ("echo", "fit"):
            reply, _ = hostile.ask(op, pool=pool.name, reply_slot=slot, estimator="StandardScaler",
                                   method="fit", params={}, payload={"args": [], "kwargs": {}})
            assert reply["op"] == "error" and "did not attach" in reply["message"], reply
        np.testing.assert_array_equal(np.frombuffer(block.buffer(), np.uint8), pattern)
    finally:
        block.release()
    X = np.random.default_rng(2).standard_normal((30, 3))
    assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))  # the victim still works


_TRUNCATING_CLIENT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from sklearn_gpu_bridge.client import connect
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
    conn = connect(read_connection_file(sys.argv[1]), pool_directory=sys.argv[2])  # a file pool
    assert conn.pool is not None and conn.pool.kind == "file"
    block = conn.pool.allocate(8 << 20)
    block.buffer()[:] = bytes(8 << 20)
    for path in conn.pool.paths:  # the client cuts its own pool short under the worker (and never touches it again)
        os.truncate(path, 0)
    desc = {"dtype": "<f8", "shape": [1 << 20], "order": "C", "where": "pool", "segment": block.segment,
            "offset": block.offset}
    try:
        conn.transport._roundtrip({"op": "echo", "pool": conn.pool.name, "arrays": [desc],
                         "payload": {"args": [{"__array__": 0}], "kwargs": {}}})
        print(json.dumps({"answered": True}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
""")


def test_a_client_that_truncates_its_own_pool_does_not_kill_the_worker(connection, worker, tmp_path):
    """Before: the worker mapped pool files, and a truncated one killed it with SIGBUS (every client's models lost).

    Now memfd segments are sealed (tests/test_pool.py: the truncate fails) and file segments are read with pread.
    """
    X = np.random.default_rng(1).standard_normal((30, 3))
    survivor = GPUStandardScaler().fit(X)
    run = subprocess.run([sys.executable, "-c", _TRUNCATING_CLIENT, str(worker.connection_file), default_directory()],
                         capture_output=True, text=True, timeout=120, env=_client_env())
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome.get("error") == "ProtocolError" and "shorter" in outcome["message"], (outcome, run.stderr)
    assert connection.status()["pid"] == worker.pid
    assert_same(survivor.transform(X), StandardScaler().fit(X).transform(X))


def test_a_frame_changed_on_the_way_is_refused(connection, hostile):
    """The signature covers every frame (digests in the signed header): a flipped byte of an array is caught."""
    data = np.arange(20_000.0)
    desc = {"dtype": "<f8", "shape": [data.size], "order": "C", "where": "frame", "index": 0}
    header = {"op": "echo", "id": new_id(), "client": hostile.client, "arrays": [desc],
              "payload": {"args": [{"__array__": 0}], "kwargs": {}}}
    frames = hostile.session.pack(header, [data.tobytes()])
    tampered = bytearray(frames[2])
    tampered[12345] ^= 1
    before = connection.status()["refused"].get("bad_digest", 0)
    hostile.socket.send_multipart([frames[0], frames[1], bytes(tampered)])
    assert hostile.receive(1000) is None
    assert connection.status()["refused"].get("bad_digest", 0) == before + 1


def test_a_message_for_an_earlier_run_is_refused_after_a_restart(tmp_path):
    """Same --key-file, new run: a message signed for the old run is not taken (it names that run)."""
    key = tmp_path / "key"
    key.write_text(os.urandom(32).hex())
    key.chmod(0o600)
    first = WorkerProcess(tmp_path / "a", key_file=key)
    recorded = Session(first.info.key_bytes, peer=first.info.worker_id).pack(
        {"op": "fit", "id": new_id(), "client": "x", "estimator": "StandardScaler", "method": "fit", "params": {},
         "arrays": [], "payload": {"args": [np.ones((3, 2)).tolist()], "kwargs": {}}})
    first.stop()
    second = WorkerProcess(tmp_path / "b", key_file=key)
    try:
        assert second.info.key == first.info.key and second.info.worker_id != first.info.worker_id
        replayer = RawClient(second)
        try:
            replayer.socket.send_multipart(recorded)
            assert replayer.receive(1000) is None
        finally:
            replayer.close()
        checker = connect(second.info, pool="off")
        status = checker.status()
        checker.close()
        assert status["refused"] == {"wrong_worker": 1} and status["handles"] == 0
    finally:
        second.stop()


def test_a_message_from_another_time_is_refused_with_the_reason(hostile, connection, monkeypatch):
    """Recorded an hour ago and played back now (or a clock an hour off): refused, and the error says why."""
    real = time.time
    before = connection.status()["refused"].get("stale", 0)
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    hostile.send("ping")
    monkeypatch.setattr(time, "time", real)
    reply, _ = hostile.receive()
    assert reply["op"] == "error" and "+3600 s from the worker's clock" in reply["message"]
    assert connection.status()["refused"].get("stale", 0) == before + 1


# ---------------------------------------------------------------- one client cannot starve or bloat the others


@pytest.fixture
def busy_worker(tmp_path, worker):
    """One executor thread, so that queueing shows."""
    with own_worker(tmp_path, worker, threads=1) as process:
        yield process


def _slow_fit_fields():
    """A TSNE fit of a few seconds on the CPU backend; inline data, so any raw client can send it."""
    X = np.random.default_rng(0).standard_normal((1500, 4))
    desc = {"dtype": "<f8", "shape": list(X.shape), "order": "C", "where": "inline", "data": X.tobytes()}
    return {"estimator": "TSNE", "method": "fit", "params": {"max_iter": 250}, "arrays": [desc],
            "payload": {"args": [{"__array__": 0}], "kwargs": {}}}


@CPU_ONLY
def test_a_clients_backlog_waits_its_turn_and_goes_when_it_goes(busy_worker):
    """Eight queued slow fits of one client: another client's request runs next, and the backlog of a client
    that said goodbye never runs."""
    backlog, other = KeyHolder(busy_worker), KeyHolder(busy_worker)
    checker = connect(busy_worker.info, pool="off")
    try:
        sent = [backlog.send("fit", **_slow_fit_fields()) for _ in range(8)]
        time.sleep(0.5)  # the first is running
        X = np.arange(12.0).reshape(4, 3)
        desc = {"dtype": "<f8", "shape": [4, 3], "order": "C", "where": "inline", "data": X.tobytes()}
        reply, _ = other.ask("fit", estimator="StandardScaler", method="fit", params={}, arrays=[desc],
                             payload={"args": [{"__array__": 0}], "kwargs": {}})
        assert reply["op"] == "reply"
        other_arrived, other_done = reply["worker_span"]
        backlog.send("goodbye")  # the client leaves: its queued fits are dropped
        replies, status = [], None
        deadline = time.monotonic() + 120  # a fit that runs on answers when it ends: seconds, more on a busy host
        while time.monotonic() < deadline:
            if (got := backlog.receive(200)) is not None:
                replies.append(got[0])
                continue
            status = checker.status()
            if status["running"] == 0 and status["queued"] == 0:  # every reply was sent before this count
                break
        else:
            pytest.fail(f"the worker still runs or queues requests after 120 s: {status}")
        while (got := backlog.receive(200)) is not None:  # one sent just before the count, still on its way
            replies.append(got[0])
        done = [r["worker_span"][1] for r in replies if r.get("parent") in sent]
        status = checker.status()
    finally:
        checker.close()
        backlog.close()
        other.close()
    overtook = sum(other_arrived < t < other_done for t in done)  # backlog fits finished while the other waited
    record("backlog", queued=8, finished_while_the_other_client_waited=overtook, ran=len(done),
           cancelled=status["requests"].get("cancelled", 0))
    assert overtook <= 1  # only the one already running: in turn, not first come first served
    assert len(done) + status["requests"].get("cancelled", 0) == 8
    assert len(done) < 8 and sum(t > other_done for t in done) <= 1  # the rest went with their client


@CPU_ONLY
def test_a_client_may_queue_only_so_many_requests(busy_worker):
    flooder = KeyHolder(busy_worker)
    try:
        ids = [flooder.send("fit", **_slow_fit_fields())]  # runs for seconds: the rest wait
        ids += [flooder.send("echo", payload={"args": [], "kwargs": {}}) for _ in range(80)]
        refused = 0
        for _ in range(200):
            got = flooder.receive(200)
            if got is None:
                break
            refused += got[0]["op"] == "error" and "requests waiting" in got[0].get("message", "")
        flooder.send("goodbye")
    finally:
        flooder.close()
    record("queue_cap", sent=len(ids), refused=refused)
    assert refused >= 80 - 64 - 1


def test_a_client_that_never_reads_its_replies_cannot_bloat_the_worker(tmp_path, worker):
    """Replies wait in ZeroMQ's queue of that peer only up to its high-water mark; then they are dropped."""
    process = WorkerProcess(tmp_path)
    try:
        reader = KeyHolder(process)
        data = np.zeros(1 << 20, np.uint8)  # 1 MiB as a frame, echoed back as a frame
        desc = {"dtype": "|u1", "shape": [data.size], "order": "C", "where": "frame", "index": 0}
        rss_before = _rss_mb(process.pid)
        for _ in range(600):
            reader.send("echo", [data], arrays=[desc], payload={"args": [{"__array__": 0}], "kwargs": {}})
        honest = connect(process.info, pool="off")
        assert wait_until(lambda: honest.status()["queued"] == 0, 60)
        rss_after = _rss_mb(process.pid)
        honest.close()
        reader.close()
    finally:
        process.stop()
    record("never_reading_client", requests=600, mb_each=1, rss_before_mb=round(rss_before, 1),
           rss_after_mb=round(rss_after, 1))
    assert rss_after - rss_before < 300  # 600 MiB of replies were asked for


_FRAMES_CLIENT = textwrap.dedent("""
    import sys
    import numpy as np
    import sklearn_gpu_bridge as sgb
    sgb.set_config(connection_file=sys.argv[1], start_local_worker=False, pool="off")
    kept = sgb.GPUStandardScaler().fit(np.ones((10, 3)))
    print(sgb.get_connection().capabilities.client_timeout, flush=True)
    import time; time.sleep(600)
""")


def test_a_dead_client_on_the_frames_transport_is_freed_within_its_timeout(fresh_worker):
    """A client the worker cannot watch (no shared pool: Windows, another host) that dies: freed after 10 s.

    A worker of its own: on the session's worker the count of handles this test waits on is every client's
    (in a CI run the dead client was freed, its handle released, and the count never came back)."""
    connection = sklearn_gpu_bridge.get_connection()
    before = connection.status()["handles"]
    client = subprocess.Popen([sys.executable, "-c", _FRAMES_CLIENT, str(fresh_worker.connection_file)],
                              stdout=subprocess.PIPE, text=True, env=_client_env())
    try:
        timeout = float(client.stdout.readline())
        assert timeout == 10.0
        assert connection.status()["handles"] == before + 1
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    killed = time.monotonic()
    assert wait_until(lambda: connection.status()["handles"] == before, 60, step=0.2)
    record("dead_frames_client_freed", client_timeout=timeout, seconds=round(time.monotonic() - killed, 2))
