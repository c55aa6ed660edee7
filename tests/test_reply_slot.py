"""Replies read from the client's own pool (protocol.reply_slot), against a real worker.

A call on a worker of this host may name a block of its memfd pool where the
worker writes the signed reply before sending it through ZeroMQ; the client
spins on the block instead of sleeping on the socket (the ``reply_wait``
setting). These tests force ``spin`` (``auto`` spins only beside a cuML worker
on 4 cores or more) and check that the answers are the same, that the ZeroMQ
copies never mix with later replies, and that whatever cannot be used (a
reply too long, a slot that does not verify, one a request names badly) falls
back to ZeroMQ with nothing lost. Attacks by another key holder are in
tests/test_trust.py.
"""

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPULogisticRegression, GPUStandardScaler, client
from sklearn_gpu_bridge.client import discovery
from sklearn_gpu_bridge.errors import ConfigurationError, ProtocolError
from sklearn_gpu_bridge.protocol import Session, new_id
from sklearn_gpu_bridge.transport import fastpath, reply_slot

from .conftest import assert_same, wait_until


def _frames(*sizes):
    return [bytes([i % 251]) * size for i, size in enumerate(sizes)]


@pytest.mark.parametrize("sizes", [(64, 200), (64, 200, 0), (64, 10_000, 1, 7, 100_000)])
def test_a_slot_gives_back_the_frames_written_into_it(sizes):
    memory = memoryview(bytearray(1 << 20))
    frames = _frames(*sizes)
    assert reply_slot.write(memory, 12345, frames)
    assert reply_slot.state_word(memory)[0] == 12345
    assert [bytes(f) for f in reply_slot.read(memory)] == frames


def test_a_reply_longer_than_its_slot_is_marked_so_and_not_written():
    memory = memoryview(bytearray(4096))
    assert not reply_slot.write(memory, 99, _frames(64, 5000))
    assert reply_slot.state_word(memory)[0] == -99
    assert bytes(memory[8:]) == bytes(4096 - 8)


@pytest.mark.parametrize("words", [
    [1, 1, 8],  # one frame: a message has at least two
    [1, 5000, 8, 8],  # more frames than the slot could describe
    [1, 2, -8, 8],  # a negative length
    [1, 2, 8, 1 << 40],  # a length past the slot
    [1, 2, 4000, 4000],  # lengths that add up past the slot
    [1, 1000, 8, 8],  # a count within bounds, whose lengths would lie past the slot's end
    [1, 3, (1 << 62), (1 << 62), (1 << 62)],  # lengths whose int64 sum wraps around to 2 ** 62
    [1, 2, (1 << 63) - 1, 2],  # ... or to a negative number
])
def test_lengths_that_do_not_add_up_are_refused_not_read(words):
    memory = memoryview(bytearray(4096))
    np.frombuffer(memory, np.int64, count=len(words))[:] = words
    assert reply_slot.read(memory) is None


def test_tokens_are_positive_and_fresh():
    tokens = {reply_slot.new_token() for _ in range(1000)}
    assert len(tokens) == 1000 and all(reply_slot.is_token(t) for t in tokens)
    assert not any(reply_slot.is_token(v) for v in (0, -5, True, 7.0, 1 << 62, "7", None))


# ---------------------------------------------------------------- against the worker


@pytest.fixture
def spin_long(monkeypatch):
    """Spin for a minute before the socket: every reply that fits is read from the pool, however slow the host."""
    monkeypatch.setattr(fastpath, "SPIN_SECONDS", 60.0)


def test_calls_that_spin_get_their_replies_from_the_pool_and_the_same_answers(connection, spin_long):
    X = np.random.default_rng(0).standard_normal((300, 6)) * 2 + 1
    y = (X[:, 0] + X[:, 1] > 2).astype(int)
    before = connection.stats.get("replies_from_pool", 0)
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        for _ in range(5):  # the ZeroMQ copy of each reply must never be taken for the next one's
            scaled = GPUStandardScaler().fit_transform(X)
            model = GPULogisticRegression().fit(X, y)
            predicted, proba = model.predict(X), model.predict_proba(X)
    assert connection.stats["replies_from_pool"] - before == 5 * 4
    # each reply's ZeroMQ copy is dropped unread while a later call waits: they do not pile up on the socket
    assert 1 <= connection.transport._link().copies <= 2  # the last reply's copy, and at most the one before it
    assert_same(scaled, StandardScaler().fit_transform(X))
    assert_same(proba, LogisticRegression().fit(X, y).predict_proba(X))
    np.testing.assert_array_equal(predicted, model.classes_[proba.argmax(axis=1)])  # labels: the model's own


def test_threads_that_spin_each_get_their_own_replies(connection, spin_long):
    rng = np.random.default_rng(1)
    data = [rng.standard_normal((200 + 10 * i, 4)) * (i + 1) for i in range(4)]
    results, errors = {}, []

    def run(i):
        try:
            results[i] = [connection.echo(data[i] + k)[0] for k in range(20)]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    # set once, around the threads: config_context saves and restores the process's settings, so threads
    # that each entered it could leave "spin" set for every later test
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    for i in range(4):
        for k, echoed in enumerate(results[i]):
            np.testing.assert_array_equal(echoed, data[i] + k)


def test_a_reply_that_comes_after_the_spin_comes_through_zeromq(connection, monkeypatch):
    """The client stopped watching before the worker wrote the slot: ZeroMQ's copy answers, and the late write
    into the slot (a block this request still holds) disturbs no later call. Each fit takes the worker tens of
    milliseconds and replies with a small model, which fits in the slot: a reply read from ZeroMQ came late,
    not too large (a call of a fraction of a millisecond could be done before a busy client's first look)."""
    monkeypatch.setattr(fastpath, "SPIN_SECONDS", 1e-6)
    data = np.random.default_rng(2)
    X = data.standard_normal((20000, 20))
    y = (X[:, 0] + 0.5 * data.standard_normal(20000) > 0).astype(np.int32)
    before = connection.stats.get("replies_from_pool", 0)
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        models = [GPULogisticRegression(C=1.0 + k).fit(X, y) for k in range(10)]
    assert connection.stats.get("replies_from_pool", 0) - before < 10
    for k, model in enumerate(models):
        assert_same(model.coef_, LogisticRegression(C=1.0 + k).fit(X, y).coef_)


def test_sleep_never_spins(connection):
    before = connection.stats.get("replies_from_pool", 0)
    with sklearn_gpu_bridge.config_context(reply_wait="sleep"):
        connection.echo(np.arange(10.0))
    assert connection.stats.get("replies_from_pool", 0) == before


def test_auto_spins_only_beside_a_cuml_worker_on_enough_cores(connection, monkeypatch):
    """Spinning saves the wake-up of a sleeping thread on a many-core GPU host; beside a CPU backend, or on a
    host of few cores, the spinning thread would take the core the worker needs."""
    with sklearn_gpu_bridge.config_context(reply_wait="auto"):
        expected = connection.capabilities.backend == "cuml" and connection.transport._cpus >= fastpath.SPIN_MIN_CPUS
        assert bool(connection.transport.spin_seconds()) == expected
        monkeypatch.setattr(connection.transport, "_cpus", 2)
        assert connection.transport.spin_seconds() == 0.0


def test_a_reply_too_long_for_its_slot_comes_through_zeromq(connection, spin_long):
    big = np.arange(300_000.0)  # 2.4 MB back as a frame (no output block): more than the 1 MiB slot
    before = connection.stats.get("replies_from_pool", 0)
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        np.testing.assert_array_equal(connection.echo(big, out_nbytes=0)[0], big)
        np.testing.assert_array_equal(connection.echo(big[:10])[0], big[:10])  # the next one is not confused
    assert connection.stats["replies_from_pool"] == before + 1


def test_a_slot_that_does_not_verify_is_not_believed(connection):
    """A reply in the slot signed with another key (or changed after signing) is passed over for ZeroMQ's."""
    block = connection.pool.allocate(1)
    try:
        token, msg_id = reply_slot.new_token(), new_id()
        forged = Session(b"k" * 32).pack({"op": "reply", "id": new_id(), "parent": msg_id, "result": "forged"})
        assert reply_slot.write(block.buffer(), token, forged)
        assert connection.transport._watch(block, 0.01, token, msg_id) is None
        genuine = Session(connection.info.key_bytes).pack({"op": "reply", "id": new_id(), "parent": msg_id})
        reply_slot.write(block.buffer(), token, genuine)
        assert connection.transport._watch(block, 0.01, token, msg_id)[0]["parent"] == msg_id
        assert connection.transport._watch(block, 0.01, token, new_id()) is None  # another request's reply
        genuine[1] = genuine[1].replace(b"reply", b"rEply")
        reply_slot.write(block.buffer(), token, genuine)
        assert connection.transport._watch(block, 0.01, token, msg_id) is None
    finally:
        block.release()


@pytest.mark.parametrize("slot", [
    {"segment": 0, "offset": -8, "nbytes": 1 << 20},
    {"segment": 0, "offset": 0, "nbytes": 1 << 40},
    {"segment": 987654, "offset": 0, "nbytes": 4096},
    {"segment": "0", "offset": 0, "nbytes": 4096},
    {"segment": 0, "offset": 1.5, "nbytes": 4096},
    {"segment": 0, "offset": 0, "nbytes": None},
    {"segment": 0, "offset": 0, "nbytes": 4096, "token": 0},
    {"segment": 0, "offset": 0, "nbytes": 4096, "token": True},
    {"segment": 0, "offset": 0, "nbytes": 4096, "token": 1 << 63},
    "not a dict",
])
def test_a_bad_reply_slot_is_passed_over_and_answered_through_zeromq(connection, slot):
    if isinstance(slot, dict):
        slot = {"token": 7, **slot}
    reply, _ = connection.transport._roundtrip({"op": "echo", "pool": connection.pool.name, "reply_slot": slot,
                                      "payload": {"args": [], "kwargs": {}}})
    assert reply["op"] == "reply"
    assert connection.status()["pid"] == connection.info.pid


def test_an_unknown_reply_wait_is_refused_before_anything_is_sent(connection):
    with sklearn_gpu_bridge.config_context(reply_wait="busy"):
        with pytest.raises(ConfigurationError, match="reply_wait='busy'"):
            GPUStandardScaler().fit(np.ones((4, 2)))


# ---------------------------------------------------------------- requests read from the pool (next_slot)


def _worker_in_this_process(tmp_path, monkeypatch, watch_ms):
    """A worker in this process whose threads watch a request slot for ``watch_ms`` after each reply."""
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
    from sklearn_gpu_bridge.worker.backends import SklearnBackend
    from sklearn_gpu_bridge.worker.server import Worker

    monkeypatch.setattr(fastpath, "SPIN_SECONDS", 60.0)
    worker = Worker(SklearnBackend(), connection_file=str(tmp_path / "worker.json"), threads=2,
                    watch_ms=watch_ms).start()
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    connections = []

    def connect():
        connections.append(client.connect(read_connection_file(tmp_path / "worker.json")))
        return connections[-1]

    yield worker, connect
    for connection in connections:
        connection.close()
    worker.close()
    thread.join(timeout=10)


@pytest.fixture
def watching_worker(tmp_path, monkeypatch):
    """A worker in this process whose threads watch a request slot for a minute after each reply (unless other
    work comes): every next request that is written there is read there, however slow the host."""
    yield from _worker_in_this_process(tmp_path, monkeypatch, 60_000.0)


@pytest.fixture
def ringing_worker(tmp_path, monkeypatch):
    """A worker in this process whose threads do not watch at all: a request slot is armed at once after each
    reply, and read only when its client rings the doorbell."""
    yield from _worker_in_this_process(tmp_path, monkeypatch, 0.0)


def _scaled(connection, X):
    fitted = connection.fit("StandardScaler", {}, "fit_transform", [X], {})
    return fitted.result


@pytest.fixture
def copies_held_long(monkeypatch):
    """A request written into its slot waits a minute for the worker's mark before its ZeroMQ copy goes: only a
    request the worker did not take is sent twice, however slow the host."""
    monkeypatch.setattr(reply_slot, "COPY_AFTER", 60.0)


def test_the_next_requests_are_read_from_the_request_slot_and_never_sent_twice(watching_worker, copies_held_long):
    """A thread watches the slot, so the client does not ring; the worker marks each request taken, so the
    client never sends its ZeroMQ copy (before: every request went both ways, and the reader woke to drop
    one copy of each while the other ran)."""
    worker, connect = watching_worker
    connection = connect()
    X = np.random.default_rng(3).standard_normal((200, 5)) * 3 + 1

    def watched():  # a thread watches the slot for the next request (else the client rings: one process here)
        link = connection.transport._link()
        return reply_slot.watch_word(link.request_slot.buffer())[0] == link.next_token

    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        results = []
        for k in range(6):
            results.append(_scaled(connection, X + k))
            assert wait_until(watched, 10)
        fitted = connection.fit("LogisticRegression", {}, "fit", [X, (X[:, 0] > 1).astype(np.int32)], {})
        proba = connection.call(fitted.handle, "predict_proba", [X], {}, n_classes=2)
    for k, result in enumerate(results):
        assert_same(result, StandardScaler().fit_transform(X + k))
    assert_same(proba, LogisticRegression().fit(X, (X[:, 0] > 1).astype(np.int32)).predict_proba(X))
    # every request but the first was written into the slot, and taken there
    assert worker.counts["from_slot"] == 7 and worker.counts["rung"] == 0
    assert connection.ping()  # a round trip after the last request: a copy sent would have been read by now
    assert worker.counts["rings"] <= 1  # the last request's: the fit's reply is not waited for to be watched
    assert worker.counts["second_copies"] == 0
    assert not worker.session.refused, worker.session.refused
    assert worker.counts["fit"] + worker.counts["call"] == 8  # each request ran once


def test_a_request_slot_that_does_not_verify_costs_only_the_wait_for_its_zeromq_copy(watching_worker):
    """Bytes written over the request (a torn write, a forgery, another key) are refused; ZeroMQ's copy answers."""
    worker, connect = watching_worker
    connection = connect()
    X = np.random.default_rng(4).standard_normal((50, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(connection, X)
        link = connection.transport._link()
        forged = Session(b"k" * 32).pack({"op": "call", "id": new_id(), "client": connection.transport.client_id})
        assert reply_slot.write(link.request_slot.buffer(), link.next_token, forged)
        assert wait_until(lambda: worker.session.refused["bad_signature"] == 1, 10)
        assert_same(_scaled(connection, X + 1), StandardScaler().fit_transform(X + 1))  # through ZeroMQ
    assert worker.counts["from_slot"] == 0 and worker.counts["fit"] == 2


def _answered_on_a_thread_of_its_own(calls, timeout=20):
    """What ``calls()`` returns, run with ``reply_wait=spin`` on a thread of its own (its own link): a client
    that waits too long (for the end of a minute's spin, or for ever) fails the test instead of hanging it."""
    results, errors = [], []

    def run():
        try:
            with sklearn_gpu_bridge.config_context(reply_wait="spin"):
                results.append(calls())
        except BaseException as exc:  # noqa: BLE001 - raised again on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if errors:
        raise errors[0]
    assert results, f"no answer within {timeout} s: the held ZeroMQ copy was not sent"
    return results[0]


def test_a_request_the_worker_does_not_take_from_its_slot_is_sent_through_zeromq_at_once(watching_worker,
                                                                                          monkeypatch):
    """A request that the worker reads from the slot but refuses (here: changed after signing) is marked so, and
    the client sends the ZeroMQ copy it holds back at once; without the mark it would wait for ``COPY_AFTER``
    (here: never) and then for the end of its spin (a minute)."""
    monkeypatch.setattr(reply_slot, "COPY_AFTER", float("inf"))
    worker, connect = watching_worker
    connection = connect()
    X = np.random.default_rng(4).standard_normal((50, 3))
    signed_write = reply_slot.write

    def torn(memory, token, frames):  # a request's header changed after it was signed; replies untouched
        return signed_write(memory, token, [frames[0], bytes(frames[1]).replace(b"StandardScaler", b"Scaler")])

    def calls():
        _scaled(connection, X)
        link = connection.transport._link()
        assert wait_until(lambda: reply_slot.watch_word(link.request_slot.buffer())[0] == link.next_token, 10)
        monkeypatch.setattr(reply_slot, "write", torn)
        return _scaled(connection, X + 1)

    assert_same(_answered_on_a_thread_of_its_own(calls), StandardScaler().fit_transform(X + 1))
    assert worker.session.refused["bad_signature"] == 1 and worker.counts["from_slot"] == 0


@pytest.mark.parametrize("ends", ["copy_after", "spin"])
def test_a_request_that_no_thread_takes_is_sent_through_zeromq(ringing_worker, monkeypatch, ends):
    """A request written into a slot that is neither watched nor armed (a ring nobody hears): no mark comes,
    and the client sends the copy it held back after ``COPY_AFTER`` (2 ms), not at the end of its spin (here a
    minute); or, where the spin is the shorter (here 1 ms, ``COPY_AFTER`` never), when the spin ends, before it
    waits on the socket for a reply to a request that nobody has."""
    if ends == "spin":
        monkeypatch.setattr(reply_slot, "COPY_AFTER", float("inf"))
        monkeypatch.setattr(fastpath, "SPIN_SECONDS", 0.001)
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(6).standard_normal((30, 3))

    def calls():
        _scaled(connection, X)
        _armed(worker, connection)
        with worker._armed_lock:
            worker._armed.clear()  # the ring will name no armed slot
        return _scaled(connection, X + 1)

    assert_same(_answered_on_a_thread_of_its_own(calls), StandardScaler().fit_transform(X + 1))
    assert worker.counts["from_slot"] == 0 and worker.counts["rings"] == 1 and worker.counts["fit"] == 2


def test_a_request_slot_of_a_thread_that_is_gone_never_holds_another_requests_arrays(watching_worker):
    """The worker writes into a request slot (its watch word, its marks) after the slot's thread may be gone;
    a block the client gave back to its pool would hold the next request's arrays, and a watch that ends when
    that request comes would write 0 into them. The slot serves the next thread's requests instead."""
    worker, connect = watching_worker
    connection = connect()
    big = np.arange(1.0, 600_001.0)  # 4.8 MB: the pool's lowest free blocks, the freed slot's among them
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        for _ in range(20):
            thread = threading.Thread(target=lambda: connection.echo(np.ones(3)))
            thread.start()
            thread.join(10)  # its link goes with it, while a worker thread watches its slot
            np.testing.assert_array_equal(connection.echo(big, out_nbytes=0)[0], big)


@pytest.mark.parametrize("way", ["watched", "rung"])
def test_a_request_slot_holding_another_clients_request_is_not_run_for_its_owner(way, request):
    """A key holder that writes a victim's request (its client id, a handle of its own) into its own slot, which
    a worker thread watches or which it rings the doorbell for, gets it refused: a request read from a slot is
    run only as the slot's owner's. Nothing runs, and the victim is answered as before."""
    worker, connect = request.getfixturevalue("watching_worker" if way == "watched" else "ringing_worker")
    victim, hostile = connect(), connect()
    X = np.random.default_rng(5).standard_normal((60, 4)) * 2
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        handle = victim.fit("StandardScaler", {}, "fit", [X], {}).handle
        _scaled(hostile, X)
        link = hostile.transport._link() if way == "watched" else _armed(worker, hostile)
        stolen = hostile.transport.session.pack({"op": "call", "id": new_id(), "client": victim.transport.client_id, "handle": handle,
                                       "method": "transform", "payload": {"args": [], "kwargs": {}}})
        assert reply_slot.write(link.request_slot.buffer(), link.next_token, stolen)
        if way == "rung":
            hostile.transport._doorbell.send(link.ring)
        assert wait_until(lambda: worker.session.refused["slot_not_owner"] == 1, 10)
        assert worker.counts["call"] == 0  # nothing ran
        assert_same(victim.call(handle, "transform", [X], {}), StandardScaler().fit(X).transform(X))


def test_a_request_slot_in_a_pool_its_client_did_not_attach_is_not_watched(watching_worker):
    """A key holder that names a victim's request slot (its pool, its block, even its next token) as its own
    ``next_slot`` gets an error, and no thread watches that block for it: the victim's next request is never
    read on the key holder's behalf (it would be refused as not the owner's, and counted), no watch word is
    written there for it, and the victim is answered."""
    worker, connect = watching_worker
    victim, hostile = connect(), connect()
    X = np.random.default_rng(6).standard_normal((40, 3)) + 2
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(victim, X)
        link = victim.transport._link()
        block = link.request_slot
        slot = {"segment": block.segment, "offset": block.offset, "nbytes": block.nbytes, "token": link.next_token}
        for token in (link.next_token, 12345):  # the victim's own, and one the worker would write as watched
            with pytest.raises(ProtocolError, match="did not attach"):
                hostile.transport._roundtrip({"op": "echo", "pool": victim.pool.name, "next_slot": {**slot, "token": token},
                                    "payload": {"args": [], "kwargs": {}}})
        memory = block.buffer()  # the worker writes into a watched slot: never into this one for the key holder
        assert not wait_until(lambda: reply_slot.watch_word(memory)[0] == 12345, 0.5)
        assert_same(_scaled(victim, X * 3), StandardScaler().fit_transform(X * 3))
    assert not worker.session.refused, worker.session.refused
    assert worker.counts["fit"] == 2


# ---------------------------------------------------------------- the doorbell: armed request slots


def _armed(worker, connection):
    """Wait until the worker has armed ``connection``'s request slot (after its reply), and return its link."""
    link = connection.transport._link()
    assert wait_until(lambda: link.ring in worker._armed, 10)
    return link


def _answer(connection, link, msg_id, timeout=10.0):
    """The reply to ``msg_id`` on ``link``'s socket (the ZeroMQ copies of replies read from the pool before it
    are passed over), or None within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while link.socket.poll(max(0.0, deadline - time.monotonic()) * 1000):
        header, _ = connection.transport.session.unpack(link.socket.recv_multipart())
        if header.get("parent") == msg_id:
            return header
    return None


@pytest.fixture
def two_second_watch(tmp_path, monkeypatch):
    """A worker in this process whose threads watch a request slot for 2 s after each reply."""
    yield from _worker_in_this_process(tmp_path, monkeypatch, 2000.0)


@pytest.mark.parametrize("watch", ["watching_worker", "two_second_watch"])
def test_a_worker_thread_watches_as_long_as_its_watch_ms_says(watch, request):
    """After pauses of 30 ms between calls (ten times the default ``watch_ms``), a worker whose watch is longer
    still has a thread on the slot: it is never armed for the doorbell, nothing rings, and the next requests are
    read from the slot. A watch of 2 s then ends: the slot is armed for the doorbell."""
    worker, connect = request.getfixturevalue(watch)
    connection = connect()
    X = np.random.default_rng(9).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        armed = []
        for k in range(5):
            assert_same(_scaled(connection, X + k), StandardScaler().fit_transform(X + k))
            time.sleep(0.030)
            armed.append(connection.transport._link().ring in worker._armed)
    assert not any(armed), armed
    assert worker.counts["rung"] == 0
    assert 1 <= worker.counts["from_slot"] <= 4  # the reader may still take a ZeroMQ copy first (one process here)
    if watch == "two_second_watch":
        _armed(worker, connection)  # within 10 s


def test_a_request_written_after_the_watch_is_read_when_the_doorbell_rings(ringing_worker):
    """No thread watches; the request is written into the armed slot and the doorbell rung, and no ZeroMQ copy
    is sent: it is answered all the same, and it ran once. Without the doorbell nothing would read it."""
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(7).standard_normal((30, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(connection, X)
        link = _armed(worker, connection)
        msg_id = new_id()
        _ring_with_echo(connection, link, msg_id)
        header = _answer(connection, link, msg_id)
    assert header is not None, "the request in the slot was not read when the doorbell rang"
    assert header["op"] == "reply" and header["payload"]["result"] == [7, "seven"], header["payload"]
    assert worker.counts["rung"] == 1 and worker.counts["echo"] == 1


def _ring_with_echo(connection, link, msg_id):
    """Write an echo request into ``link``'s armed request slot and ring the doorbell, with no ZeroMQ copy."""
    request = connection.transport.session.pack({"op": "echo", "id": msg_id, "client": connection.transport.client_id,
                                       "payload": {"args": [7, "seven"], "kwargs": {}}})
    assert reply_slot.write(link.request_slot.buffer(), link.next_token, request)
    connection.transport._doorbell.send(link.ring)


def _watched_for_next(connection):
    """Whether a worker thread watches ``connection``'s request slot (this thread's) for its next request."""
    link = connection.transport._link()
    return reply_slot.watch_word(link.request_slot.buffer())[0] == link.next_token


def test_an_estimator_call_rings_ahead_and_its_request_is_taken_by_a_thread_already_watching(ringing_worker,
                                                                                               monkeypatch):
    """A call whose slot is armed (no worker thread watches: the watch after the last reply ended) rings as it
    starts, before it checks X; the ring finds the slot empty and a thread watches it from then on, so the
    request written there is taken by that thread, and no ring comes with it. Without the heads-up the worker
    would be woken only by the ring sent with the request."""
    worker, connect = ringing_worker
    connection = connect()
    monkeypatch.setattr(discovery, "_connection", connection)  # the estimators' connection
    X = np.random.default_rng(12).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X)
        _armed(worker, connection)
        worker.watch_ms = 60_000.0  # from now on a watch lasts until the request comes (a slow host included)
        rings = worker.counts["rings"]
        discovery.heads_up()  # what the estimator's call does first
        assert wait_until(lambda: _watched_for_next(connection), 10), "no thread watched after the heads-up"
        assert connection.transport._link().ring not in worker._armed
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))  # rings ahead too: watched, no ring
    assert worker.counts["heads_up"] == 1 and worker.counts["rung"] == 0
    assert worker.counts["rings"] == rings + 1  # the heads-up alone
    assert worker.counts["from_slot"] == 1 and worker.counts["call"] == 1


@pytest.mark.parametrize("kind", ["ndarray", "DataFrame"])
def test_a_call_whose_x_is_copied_on_all_cores_does_not_ring_ahead(ringing_worker, monkeypatch, kind,
                                                                    copies_held_long):
    """An X of PARALLEL_MIN bytes or more is copied into the pool on all cores, for longer than a watch lasts:
    a thread watching meanwhile would only take a core from the copy. Such a call rings with its request; a
    DataFrame (no ``nbytes``) is sized by its shape. Its ZeroMQ copy is held back for a minute, so that only
    the ring can bring the request, however slow the host."""
    from sklearn_gpu_bridge.parallel import PARALLEL_MIN

    worker, connect = ringing_worker
    connection = connect()
    monkeypatch.setattr(discovery, "_connection", connection)
    X = np.random.default_rng(14).standard_normal((PARALLEL_MIN // 8 // 16 + 1, 16))
    if kind == "DataFrame":
        X = pytest.importorskip("pandas").DataFrame(X, columns=[f"f{i}" for i in range(16)])
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X[:50])
        _armed(worker, connection)
        scaled = scaler.transform(X)
    assert_same(scaled, StandardScaler().fit(X[:50]).transform(X))
    assert worker.counts["heads_up"] == 0 and worker.counts["rung"] == 1


def test_a_watch_started_by_a_heads_up_gives_way_to_other_clients(ringing_worker, copies_held_long):
    """A heads-up has the reader itself watch the slot (a thread woken for it would cost what the heads-up
    saves), so the watch must not hold up anyone else: a client (hostile or not) that rings ahead and never
    sends keeps the reader for a minute without it. Another client's request is answered at once, and the
    slot is armed again for its owner's ring; ringing ahead again before a reply starts no second watch (a
    client that rang on and on would keep a core of the worker spinning).

    The owner's requests go through the slot only (copies_held_long): on a busy host the reader, here in the
    test's process, could take a ZeroMQ copy sent after 2 ms before the ring (a CI run did)."""
    worker, connect = ringing_worker
    owner, other = connect(), connect()
    X = np.random.default_rng(13).standard_normal((30, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(owner, X)
        link = _armed(worker, owner)
        worker.watch_ms = 60_000.0
        owner.heads_up()
        assert wait_until(lambda: _watched_for_next(owner), 10)
    with sklearn_gpu_bridge.config_context(reply_wait="sleep"):  # through ZeroMQ: the reader must read it
        scaled = _answered_on_a_thread_of_its_own(lambda: _scaled(other, X + 1), timeout=20)
    assert_same(scaled, StandardScaler().fit_transform(X + 1))
    assert wait_until(lambda: link.ring in worker._armed, 10)  # the watch ended, and the slot is armed again
    assert not _watched_for_next(owner)
    rings = worker.counts["rings"]
    owner.heads_up()  # one heads-up's watch per reply: ringing on, the client keeps no thread busy
    assert wait_until(lambda: worker.counts["rings"] == rings + 1, 10)
    assert not _watched_for_next(owner) and link.ring in worker._armed
    worker.watch_ms = 0.0
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        assert_same(_scaled(owner, X + 2), StandardScaler().fit_transform(X + 2))  # rung, and taken
    assert worker.counts["heads_up"] == 1 and worker.counts["rung"] == 1


def test_a_slot_armed_too_long_ago_is_not_read_when_rung(ringing_worker, monkeypatch):
    """An armed slot whose thread has been idle longer than ARMED_SECONDS is dropped, not read when a ring
    names it (the client's ZeroMQ copy is what counts then)."""
    from sklearn_gpu_bridge.worker import fastpath as worker_fastpath

    monkeypatch.setattr(worker_fastpath, "ARMED_SECONDS", 0.2)
    worker, connect = ringing_worker
    connection = connect()
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(connection, np.random.default_rng(10).standard_normal((30, 3)))
        link = _armed(worker, connection)
        time.sleep(0.5)
        msg_id = new_id()
        _ring_with_echo(connection, link, msg_id)
        assert _answer(connection, link, msg_id, timeout=1.0) is None
    assert worker.counts["rung"] == 0 and worker.counts["echo"] == 0
    assert link.ring not in worker._armed


def test_armed_slots_are_bounded_however_many_threads_a_client_keeps(ringing_worker, monkeypatch):
    """Each thread that calls arms its request slot after its reply; a client (hostile or not) that keeps many
    threads never makes the worker hold more than MAX_ARMED of them: the oldest go."""
    from sklearn_gpu_bridge.worker import fastpath as worker_fastpath

    monkeypatch.setattr(worker_fastpath, "MAX_ARMED", 3)
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(11).standard_normal((30, 3))
    called, done, errors = threading.Barrier(7), threading.Event(), []

    def call():
        try:
            _scaled(connection, X)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        called.wait(30)
        done.wait(30)  # the thread, its link and its slot live until every thread has called

    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        threads = [threading.Thread(target=call) for _ in range(6)]
        for thread in threads:
            thread.start()
        called.wait(30)
        armed = wait_until(lambda: len(worker._armed) >= 3, 10)
        time.sleep(0.2)  # the other threads' slots are armed meanwhile
        kept = len(worker._armed)
        done.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert armed and kept == 3, kept


def test_the_next_requests_come_through_the_doorbell_and_run_once(ringing_worker, copies_held_long):
    """The client rings after writing each next request into its slot, and holds its ZeroMQ copy back until the
    worker marks it: every request is taken from the slot, runs once, with scikit-learn's answers, and none
    is sent twice (before: every request went both ways)."""
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(8).standard_normal((80, 4)) * 2
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        results = []
        for k in range(6):
            results.append(_scaled(connection, X + k))
            _armed(worker, connection)
    for k, result in enumerate(results):
        assert_same(result, StandardScaler().fit_transform(X + k))
    assert worker.counts["rung"] == worker.counts["from_slot"] == 5
    assert connection.ping() and worker.counts["second_copies"] == 0
    assert not worker.session.refused, worker.session.refused
    assert worker.counts["fit"] == 6


def test_rings_alone_read_nothing_and_cost_nothing(ringing_worker):
    """Rings that name no armed slot (noise, other clients' names, as many as the socket's queue holds), a ring
    for one's own slot with nothing written (a heads-up: a watch, here of 0 ms, and the slot armed again), and
    one for a slot holding bytes that are no message: nothing runs,
    nothing is counted against anyone, and the worker answers as before."""
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(10).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(connection, X)
        link = _armed(worker, connection)
        bell = connection.transport._doorbell
        rings = 0
        try:
            while rings < 100_000:
                bell.send(os.urandom(rings % 300) if rings % 2 else b"%024x:0:%d" % (rings, rings))
                rings += 1
        except BlockingIOError:  # the worker's queue is full: it reads them meanwhile
            pass
        bell.setblocking(True)
        bell.send(link.ring)  # nothing written there yet: a heads-up, whose watch (0 ms here) ends armed again
        assert connection.ping() and wait_until(lambda: link.ring in worker._armed, 10)
        memory = link.request_slot.buffer()
        memory[8:64] = os.urandom(56)
        reply_slot.state_word(memory)[0] = link.next_token  # "written": but its lengths are noise
        bell.send(link.ring)
        assert wait_until(lambda: link.ring not in worker._armed, 10)  # it looked at the slot, and let it go
        assert connection.ping()
        assert_same(_scaled(connection, X * 2), StandardScaler().fit_transform(X * 2))
    assert rings >= 10  # the queue a connected datagram socket holds (11 here)
    assert worker.counts["fit"] == 2 and worker.counts["rung"] == 1  # the noise, looked at once; nothing ran
    assert not worker.session.refused, worker.session.refused


_FLOOD = """
import socket, sys, time
bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
bell.connect(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    bell.send(b"%024x:0:0" % 7)  # blocks while the worker's queue is full, and refills it as it is read
"""


def test_a_ring_flood_takes_one_turn_of_rings_at_a_time(ringing_worker, monkeypatch):
    """Three processes of the worker's user ring the doorbell as fast as it reads, with names of no slot: the
    reader takes at most ``RINGS_IN_TURN`` rings before it looks at its socket again, so another client's
    pings are answered throughout (a reader that read rings until none were left took turns of some 50,000)."""
    from sklearn_gpu_bridge.worker import fastpath as worker_fastpath

    worker, connect = ringing_worker
    connection = connect()
    turns = []
    answer_bell = worker._answer_bell

    def counted():
        before = worker.counts["rings"]
        try:
            return answer_bell()
        finally:
            turns.append(worker.counts["rings"] - before)

    monkeypatch.setattr(worker, "_answer_bell", counted)
    path, _ = worker.doorbell
    flooders = [subprocess.Popen([sys.executable, "-c", _FLOOD, str(path), "20"]) for _ in range(3)]
    try:
        assert wait_until(lambda: worker.counts["rings"] > 10 * worker_fastpath.RINGS_IN_TURN, 20), "the flood never came"
        pings = 0
        while pings < 50 or (worker.counts["rings"] < 20 * worker_fastpath.RINGS_IN_TURN
                             and all(flooder.poll() is None for flooder in flooders)):  # until the flood ends
            assert connection.ping(timeout=10), "a ping was not answered during the flood"
            pings += 1
    finally:
        for flooder in flooders:
            flooder.kill()
            flooder.wait()
    assert max(turns) <= worker_fastpath.RINGS_IN_TURN, max(turns)
    assert worker.counts["failed"] == 0 and not worker.session.refused


def test_another_user_cannot_ring_the_doorbell(ringing_worker, other_user):
    """The doorbell is a socket of the worker's user (0600) in that user's private folder: another local user
    cannot send it a ring."""
    worker, _ = ringing_worker
    path, _ = worker.doorbell
    info = os.stat(path)
    assert stat.S_ISSOCK(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o600
    folder = os.stat(Path(path).parent)  # each of the two alone keeps the other user out; both are kept
    assert folder.st_uid == os.getuid() and stat.S_IMODE(folder.st_mode) == 0o700
    probe = ("import socket, sys\nbell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
             "try:\n    bell.sendto(b'ring', sys.argv[1])\n    print('RANG')\n"
             "except PermissionError:\n    print('REFUSED')\n")
    run = other_user.run([other_user.python, "-c", probe, str(path)])
    assert run.stdout.split() == ["REFUSED"], run


def test_a_client_never_rings_a_socket_another_user_put_where_the_doorbell_should_be(other_user, shared_folder):
    """A ring names a client and its request slot. Another local user who binds a socket (writable by all) at
    the path a client is told to ring gets nothing from it: the client rings only a socket of its own user."""
    path = shared_folder() / "worker.bell"  # a folder both users reach (pytest's own is the owner's alone)
    listener = ("import os, socket, sys\nbell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
                "bell.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); print('READY', flush=True)\n"
                "bell.settimeout(3)\ntry:\n    print('GOT', bell.recv(256))\nexcept TimeoutError:\n"
                "    print('NOTHING')\n")
    process = subprocess.Popen([other_user.python, "-c", listener, str(path)], user=other_user.uid,
                               group=other_user.gid, extra_groups=[], stdout=subprocess.PIPE, text=True,
                               env={"PATH": "/usr/bin:/bin", "HOME": "/"}, cwd="/")
    try:
        assert process.stdout.readline().split() == ["READY"]
        bell = fastpath.open_doorbell(str(path))
        if bell is not None:  # what the check keeps from happening
            fastpath.ring_doorbell(bell, b"client:0:4096")
        assert bell is None
        out, _ = process.communicate(timeout=10)
        assert out.split() == ["NOTHING"], out
    finally:
        process.kill()
        process.wait()


def test_a_ring_to_a_worker_that_is_gone_neither_raises_nor_kills(tmp_path):
    """A process that restored SIGPIPE's default (as many command-line tools do) rings a doorbell whose worker
    has gone: the send fails (the socket is refused), and the ring is dropped without an exception; the
    process carries on. (A datagram socket raises no SIGPIPE on Linux; the flag is kept for other systems.)"""
    script = (
        "import signal, socket, sys\n"
        "from sklearn_gpu_bridge.transport import fastpath\n"
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
        "worker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "worker.bind(sys.argv[1])\n"
        "bell = fastpath.open_doorbell(sys.argv[1])\n"
        "assert bell is not None\n"
        "fastpath.ring_doorbell(bell, b'ring')\n"
        "worker.close()\n"
        "fastpath.ring_doorbell(bell, b'ring')\n"
        "print('CARRIED ON')\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "w.bell")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "CARRIED ON" in run.stdout, run


def test_a_request_read_from_its_slot_after_a_reconnect_is_answered_on_the_new_connection(ringing_worker,
                                                                                         monkeypatch):
    """The connection drops and ZeroMQ connects it again, the worker running on, and the client does not see it:
    its next request, read from the slot armed before (rung, with no ZeroMQ copy that could be answered on the
    new connection instead), is answered to the link's own name, which the new connection has taken over.
    Answered to the name of the connection that is gone, it would reach no one."""
    worker, connect = ringing_worker
    connection = connect()
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        _scaled(connection, np.random.default_rng(12).standard_normal((50, 3)))
        link = _armed(worker, connection)
        link.socket.disconnect(connection.info.address)
        link.socket.connect(connection.info.address)
        time.sleep(0.2)
        msg_id = new_id()
        _ring_with_echo(connection, link, msg_id)
        header = _answer(connection, link, msg_id, timeout=5.0)
    assert header is not None, "the request read from the slot was answered to the connection that is gone"
    assert header["payload"]["result"] == [7, "seven"] and worker.counts["rung"] == 1


def test_the_client_imports_where_sockets_have_no_posix_flags():
    """Windows has neither MSG_DONTWAIT nor MSG_NOSIGNAL (and rings no doorbell): the client must import there."""
    script = ("import socket\nfor flag in ('MSG_DONTWAIT', 'MSG_NOSIGNAL'):\n    if hasattr(socket, flag):\n"
              "        delattr(socket, flag)\nimport sklearn_gpu_bridge.transport.fastpath\nprint('IMPORTED')\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "IMPORTED" in run.stdout, run.stderr[-2000:]
