"""Rehearsals (protocol.rehearsal): after an idle gap, each side walks a made-up message's steps while it waits on
the other, against a real worker in this process and real ZeroMQ.

What must hold: a call's answer is the same; a rehearsal never touches a real message (its own key, its own
slot); it gives way to the request it stands in for; ringing on buys no more than one per reply; one that
fails costs the call nothing.
"""

import numpy as np
import pytest
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUStandardScaler
from sklearn_gpu_bridge.client import discovery
from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.transport import rehearsal, reply_slot

from .conftest import assert_same, wait_until
from .test_reply_slot import _armed, _watched_for_next, _worker_in_this_process


@pytest.fixture
def ringing_worker(tmp_path, monkeypatch):
    """A worker in this process whose threads do not watch after a reply: each call rings (test_reply_slot)."""
    yield from _worker_in_this_process(tmp_path, monkeypatch, 0.0)


def _scaled_after_a_heads_up(worker, connection, X):
    """``fit_transform`` of a StandardScaler on the worker with the request slot armed (the worker's watch after
    the last reply has ended, as after an idle gap), after the heads-up an estimator's call rings first, once a
    thread watches: the worker runs in this process, and on a busy host its reader could otherwise find the
    request written already (it is then rung, and no heads-up). The call itself is the connection's, which
    rings nothing more."""
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        connection.fit("StandardScaler", {}, "fit", [X], {})
        _armed(worker, connection)
        worker.watch_ms = 60_000.0  # from now on a watch lasts until the request comes
        connection.heads_up()
        assert wait_until(lambda: _watched_for_next(connection), 10), "no thread watched after the heads-up"
        return connection.fit("StandardScaler", {}, "fit_transform", [X], {}).result


@pytest.fixture
def client_rehearsals(monkeypatch):
    """The client's rehearsals, counted as they run."""
    walked = []
    real = rehearsal.Rehearsal.client

    def counted(self):
        walked.append(self)
        return real(self)

    monkeypatch.setattr(rehearsal.Rehearsal, "client", counted)
    return walked


def test_after_an_idle_gap_both_sides_rehearse_and_the_answer_is_the_same(ringing_worker, client_rehearsals):
    worker, connect = ringing_worker
    connection = connect()
    X = np.random.default_rng(20).standard_normal((40, 3))
    assert_same(_scaled_after_a_heads_up(worker, connection, X), StandardScaler().fit_transform(X))
    assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 1
    assert len(client_rehearsals) == 1 and not connection.transport._link().rehearse_reply  # while the worker ran the call
    assert worker.counts["from_slot"] == 1 and worker.counts["failed"] == 0
    assert not worker.session.refused, worker.session.refused


def test_a_heads_up_whose_call_failed_its_check_leaves_no_rehearsal_to_the_next(ringing_worker, monkeypatch,
                                                                                 client_rehearsals):
    """A call rings ahead and then fails scikit-learn's check (nothing is sent): the next call, back to back,
    finds a thread watching, rings nothing, and reads its reply without a rehearsal."""
    worker, connect = ringing_worker
    connection = connect()
    monkeypatch.setattr(discovery, "_connection", connection)  # the estimators' connection
    X = np.random.default_rng(25).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X)
        _armed(worker, connection)
        worker.watch_ms = 60_000.0
        with pytest.raises(ValueError, match="features"):
            scaler.transform(X[:, :2])
        assert connection.transport._link().rehearse_reply  # it rang: its heads-up's rehearsal was due
        assert wait_until(lambda: _watched_for_next(connection), 10)
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))
    assert client_rehearsals == [] and not connection.transport._link().rehearse_reply
    assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 1


def test_back_to_back_calls_do_not_rehearse(ringing_worker, monkeypatch):
    """A call that finds a worker thread watching (its last reply was a moment ago) rings no heads-up: nothing
    has gone cold, and neither side rehearses."""
    worker, connect = ringing_worker
    worker.watch_ms = 60_000.0
    connection = connect()
    monkeypatch.setattr(discovery, "_connection", connection)
    X = np.random.default_rng(21).standard_normal((40, 3))
    with sklearn_gpu_bridge.config_context(reply_wait="spin"):
        scaler = GPUStandardScaler().fit(X)
        assert wait_until(lambda: _watched_for_next(connection), 10)
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))
    assert worker.counts["heads_up"] == 0 and worker.counts["rehearsals"] == 0
    assert connection.transport._link().rehearsal is None


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
            connection.transport._doorbell.send(link.ring)
            assert wait_until(lambda: worker.counts["rings"] == rings + 1, 10)
        assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 1
        assert wait_until(lambda: link.ring in worker._armed, 10)  # armed still: its next request is read
        assert_same(connection.fit("StandardScaler", {}, "fit_transform", [X * 3], {}).result,
                    StandardScaler().fit_transform(X * 3))


def test_a_rehearsal_is_signed_with_a_key_of_its_own_and_never_passes_for_a_message(ringing_worker):
    """Its messages are signed with a key of their own: the worker's session refuses them, and the rehearsal's
    session refuses the worker's (its slot is a buffer of its own, in no pool)."""
    worker, connect = ringing_worker
    connect()
    assert worker._rehearsal is not None
    with pytest.raises(ProtocolError, match="signature"):
        worker.session.unpack(worker._rehearsal.request)
    with pytest.raises(ProtocolError, match="signature"):
        worker._rehearsal.session.unpack(worker.session.pack({"op": "echo", "id": "x", "client": "c"}))


@pytest.mark.parametrize("steps, written", [(0, None), (1, "echo"), (2, "echo"), (None, "reply")])
def test_a_rehearsal_stops_for_the_request_it_stands_in_for(steps, written):
    """``stop()`` is asked before each step: a request that has come (or other work, before it began) is not
    kept waiting for the rest. What the slot holds says how far it went."""
    asked = []

    def stop():
        asked.append(True)
        return steps is not None and len(asked) > steps

    walked = rehearsal.Rehearsal()
    walked.worker(stop=stop)
    frames = reply_slot.read(walked.slot)
    assert (None if frames is None else walked.session.unpack(frames)[0]["op"]) == written
    assert walked.client().tolist() == [0, 0, 0, 0]


def test_a_rehearsal_that_fails_costs_the_call_nothing_and_turns_them_off(ringing_worker):
    worker, connect = ringing_worker
    connection = connect()
    failed = []

    def broken(*args, **kwargs):
        failed.append(args[0])
        raise RuntimeError("a bug in a rehearsal")

    X = np.random.default_rng(23).standard_normal((40, 3))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rehearsal.Rehearsal, "worker", broken)
        patch.setattr(rehearsal.Rehearsal, "client", broken)
        assert_same(_scaled_after_a_heads_up(worker, connection, X), StandardScaler().fit_transform(X))
    assert len(failed) == 2  # the worker's, then the client's
    assert worker.counts["heads_up"] == 1 and worker.counts["rehearsals"] == 0
    assert worker.counts["from_slot"] == 1 and worker.counts["failed"] == 0  # taken from its slot all the same
    assert worker._rehearsal is None and not connection.transport._rehearsals_on  # said once, then no more
    assert connection.ping()
