"""Rehearsals (protocol.rehearsal): after an idle gap, each side walks a made-up message's steps while it waits on
the other, against a real worker in this process and real ZeroMQ.

What must hold: a call's answer is the same; a rehearsal never touches a real message (its own key, its own
slot); it gives way to the request it stands in for; ringing on buys no more than one per reply; one that
fails costs the call nothing; ``SKLEARN_GPU_BRIDGE_REHEARSE=0`` turns them off on both sides.
"""

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUStandardScaler, client
from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.protocol import rehearsal, reply_slot

from .conftest import assert_same, wait_until
from .test_reply_slot import _armed, _watched_for_next, _worker_in_this_process


@pytest.fixture
def ringing_worker(tmp_path, monkeypatch):
    """A worker in this process whose threads do not watch after a reply: each call rings (test_reply_slot)."""
    yield from _worker_in_this_process(tmp_path, monkeypatch, 0.0)


def _transform_after_a_heads_up(worker, connection, monkeypatch, X):
    """A GPUStandardScaler fitted, then its transform called with the request slot armed (the worker's watch after
    the fit's reply has ended, as after an idle gap). The heads-up the call rings first is rung here, and the
    call made once a thread watches: the worker runs in this process, and on a busy host its reader could
    otherwise find the request written already (it is then rung, and no heads-up)."""
    monkeypatch.setattr(client, "_connection", connection)  # the estimators' connection
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X)
        _armed(worker, connection)
        worker.watch_ms = 60_000.0  # from now on a watch lasts until the request comes
        client.heads_up()  # what the estimator's call does first
        assert wait_until(lambda: _watched_for_next(connection), 10), "no thread watched after the heads-up"
        return scaler.transform(X)


def test_after_an_idle_gap_both_sides_rehearse_and_the_answer_is_the_same(ringing_worker, monkeypatch):
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(20).standard_normal((40, 3))
    assert_same(_transform_after_a_heads_up(worker, connection, monkeypatch, X), StandardScaler().fit(X).transform(X))
    assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 1
    assert connection._link().rehearsal is not None  # the client rehearsed while the worker ran the call
    assert not worker.session.refused, worker.session.refused


def test_back_to_back_calls_do_not_rehearse(ringing_worker, monkeypatch):
    """A call that finds a worker thread watching (its last reply was a moment ago) rings no heads-up: nothing
    has gone cold, and neither side rehearses."""
    worker, connect = ringing_worker
    worker.watch_ms = 60_000.0
    connection = connect()
    monkeypatch.setattr(client, "_connection", connection)
    X = np.random.default_rng(21).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X)
        assert wait_until(lambda: _watched_for_next(connection), 10)
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))
    assert worker.counts["heads_up"] == 0 and worker.counts["rehearsals"] == 0
    assert connection._link().rehearsal is None


def test_ringing_on_buys_one_rehearsal_a_reply(ringing_worker):
    """A client (or any process of this user) that rings its armed slot again and again, writing nothing, gets
    one heads-up's watch and one rehearsal for it until its next reply: it cannot keep the worker's reader
    rehearsing."""
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(22).standard_normal((30, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        connection.fit("StandardScaler", {}, "fit_transform", [X], {})
        link = _armed(worker, connection)
        for _ in range(10):  # the socket's queue holds about 10: each is read before the next is sent
            rings = worker.counts["rings"]
            connection._doorbell.send(link.ring)
            assert wait_until(lambda: worker.counts["rings"] == rings + 1, 10)
        assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 1
        assert wait_until(lambda: link.ring in worker._armed, 10)  # armed still: its next request is read
        assert_same(connection.fit("StandardScaler", {}, "fit_transform", [X * 3], {}).result,
                    StandardScaler().fit_transform(X * 3))


def test_a_rehearsal_is_signed_with_a_key_of_its_own_and_never_passes_for_a_message(ringing_worker):
    """Its messages are signed with a key of their own: the worker's session refuses them, and nothing the
    rehearsal writes is in a slot anyone else reads."""
    worker, connect = ringing_worker
    connect()
    assert worker._rehearsal is not None
    with pytest.raises(ProtocolError, match="signature"):
        worker.session.unpack(worker._rehearsal.request)
    with pytest.raises(ProtocolError, match="signature"):
        worker._rehearsal.session.unpack(worker.session.pack({"op": "echo", "id": "x", "client": "c"}))


def test_a_rehearsal_stops_for_the_request_it_stands_in_for():
    """Between its steps, ``stop()`` ends it: a request that has come is not kept waiting for the rest."""
    walked = rehearsal.Rehearsal()
    walked.worker()
    stopped = rehearsal.Rehearsal()
    stopped.worker(stop=lambda: True)
    ops = [r.session.unpack(reply_slot.read(r.slot))[0]["op"] for r in (walked, stopped)]
    assert ops == ["reply", "echo"]  # the whole walk ends with the reply written; the stopped one, at the request
    assert walked.client().tolist() == [0, 0, 0, 0]


def test_a_rehearsal_that_fails_costs_the_call_nothing(ringing_worker, monkeypatch):
    worker, connect = ringing_worker
    connection = connect()

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in a rehearsal")

    monkeypatch.setattr(rehearsal.Rehearsal, "worker", broken)
    monkeypatch.setattr(rehearsal.Rehearsal, "client", broken)
    X = np.random.default_rng(23).standard_normal((40, 3))
    assert_same(_transform_after_a_heads_up(worker, connection, monkeypatch, X), StandardScaler().fit(X).transform(X))
    assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 0
    assert connection.ping()


def test_rehearse_0_turns_them_off_on_both_sides(tmp_path, monkeypatch):
    monkeypatch.setenv(rehearsal.REHEARSE_ENV, "0")
    gen = _worker_in_this_process(tmp_path, monkeypatch, 0.0)  # started with the setting in its environment
    worker, connect = next(gen)
    try:
        connection = connect()
        X = np.random.default_rng(24).standard_normal((40, 3))
        assert_same(_transform_after_a_heads_up(worker, connection, monkeypatch, X),
                    StandardScaler().fit(X).transform(X))
        assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 0
        assert worker._rehearsal is None and connection._link().rehearsal is None
    finally:
        next(gen, None)
