"""Arrays the worker already holds are not sent again (array_cache), against real workers.

An array is named by a fingerprint of its content; the worker keeps a private
copy per client. Tests check the counts (``Connection.stats``, the worker's
status), that results equal those without the cache and scikit-learn's, and
that the miss path (another client filled the worker's cache) resends in full.
"""

import time

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC, GPUStandardScaler, ProtocolError
from sklearn_gpu_bridge.client import connect
from sklearn_gpu_bridge.errors import CacheMiss
from sklearn_gpu_bridge.errors import rebuild as rebuild_error
from sklearn_gpu_bridge.protocol import BoundedLRU, Decoder, Encoder, KnownArrays, Session, fingerprint
from sklearn_gpu_bridge.protocol.session import buffer_digest
from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
from sklearn_gpu_bridge.worker.cache import ArrayCache

from .conftest import BACKEND, RawClient, WorkerProcess, assert_same, assert_ulps, own_worker

MIN_BYTES = 100_000  # arrays of the tests are a few hundred KB: cached from this size on
CACHED = {"transport": "frames", "array_cache": "on", "cache_min_bytes": MIN_BYTES}


def _data(seed=0, n=2000, d=80):
    # float32, so that what travels is this array on every backend (cuML's worker casts float64)
    return np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)  # 640 KB


def _grew(before, after):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


@pytest.fixture
def cached(worker):
    """This process's connection to the session's worker: arrays as frames, the cache on."""
    with sklearn_gpu_bridge.config_context(**CACHED):
        sklearn_gpu_bridge.reset_connection()
        yield sklearn_gpu_bridge.get_connection()
        sklearn_gpu_bridge.reset_connection()


def _connection(worker, **settings):
    """A connection of its own (a second client of the same worker)."""
    return connect(read_connection_file(worker.connection_file), connection_file=str(worker.connection_file),
                      **{"pool": "off", "array_cache": "on", "cache_min_bytes": MIN_BYTES, **settings})


# ---------------------------------------------------------------- the wire format alone


def _raw(a):
    return a.ravel(order="K").view(np.uint8)


def test_fingerprint_is_of_content_dtype_shape_and_order():
    X = _data()
    key = fingerprint(X.dtype.str, X.shape, "C", buffer_digest(_raw(X)))
    assert len(key) == 32 and key == fingerprint(X.dtype.str, X.shape, "C", buffer_digest(_raw(X.copy())))
    assert key != fingerprint(X.dtype.str, (4000, 40), "C", buffer_digest(_raw(X)))
    assert key != fingerprint(X.dtype.str, X.shape, "F", buffer_digest(_raw(X)))
    assert key != fingerprint("<i4", X.shape, "C", buffer_digest(_raw(X)))
    Y = X.copy()
    Y[-1, -1] += 1
    assert key != fingerprint(X.dtype.str, Y.shape, "C", buffer_digest(_raw(Y)))


def test_an_offered_array_is_hashed_once_and_its_frame_digest_is_the_one_signed():
    """The cache key is made from the frame's digest: the header lists that digest, and it is the frame's."""
    X = _data().astype(np.float32)
    encoder = Encoder(cache=KnownArrays(max_bytes=1 << 30, min_bytes=MIN_BYTES))
    encoder.array(X)
    (index, digest), = encoder.digests.items()
    assert digest == buffer_digest(encoder.buffers[index])
    assert encoder.offered[0][0] == fingerprint(X.dtype.str, X.shape, "C", buffer_digest(_raw(X)))
    session = Session(b"k" * 32)
    header = {"op": "echo"}
    frames = session.pack(header, encoder.buffers, encoder.digests)
    assert Session(b"k" * 32).unpack(frames)[0]["digests"] == [digest]


def test_bounded_lru_keeps_the_most_recently_used_within_its_bytes():
    lru = BoundedLRU(max_bytes=10)
    for key in "abc":
        lru.put(key, key.upper(), 3)
    assert lru.get("a") == "A"  # now the most recently used
    lru.put("d", "D", 3)  # 12 bytes: "b", the least recently used, goes
    assert lru.keys() == ["c", "a", "d"] and lru.nbytes == 9
    lru.put("c", "C2", 1)  # a new value for a key replaces its bytes too
    assert lru.nbytes == 7 and lru.get("c") == "C2"
    assert lru.pop("a") == "A" and lru.pop("a") is None and lru.nbytes == 4 and len(lru) == 2


def test_decoder_serves_only_an_array_of_the_described_dtype_shape_and_order():
    cache = ArrayCache(10 << 20)
    known = KnownArrays(10 << 20, min_bytes=0)
    X = np.asfortranarray(_data(n=300))
    first = Encoder(cache=known)
    payload = first.encode([X])
    kept = []
    out = Decoder({"arrays": first.arrays}, first.buffers, cache=cache.for_client("a", kept)).decode(payload)
    np.testing.assert_array_equal(out[0], X)
    assert not out[0].flags.writeable and out[0].flags.f_contiguous and kept == [first.offered[0][0]]
    for key, nbytes in first.offered:
        known.put(key, True, nbytes)
    again = Encoder(cache=known)
    payload = again.encode([X])
    assert again.arrays[0]["where"] == "cached" and again.buffers == []

    def decode(desc, client="a"):
        return Decoder({"arrays": [desc]}, [], cache=cache.for_client(client, [])).decode(payload)[0]

    np.testing.assert_array_equal(decode(again.arrays[0]), X)
    with pytest.raises(CacheMiss):
        decode(again.arrays[0], client="b")
    for field, value in [("shape", [150, 160]), ("dtype", "<i4"), ("order", "C")]:
        with pytest.raises(ProtocolError, match="not of the dtype, shape and order"):
            decode({**again.arrays[0], field: value})


# ---------------------------------------------------------------- against the session's worker


def test_a_repeated_array_travels_once_and_results_are_the_same(cached):
    X = _data()
    direct = StandardScaler().fit_transform(X)
    first = GPUStandardScaler().fit_transform(X)
    before = dict(cached.stats)
    again = GPUStandardScaler().fit_transform(X.copy())  # another object, the same content
    grew = _grew(before, cached.stats)
    assert grew["cache_hits"] == 1 and grew["cache_bytes_saved"] == X.nbytes and "sent_frame" not in grew, grew
    assert_same(first, direct)
    assert_same(again, direct)


def test_an_array_changed_in_place_is_sent_again(cached):
    X = _data(1)
    cached.echo(X)
    X[0, 0] += 1.0  # the same object, the same shape: other content
    before = dict(cached.stats)
    (back,) = cached.echo(X)
    grew = _grew(before, cached.stats)
    assert grew.get("cache_hits", 0) == 0 and grew["sent_frame"] == 1, grew
    np.testing.assert_array_equal(back, X)
    (back,) = cached.echo(X)
    assert cached.stats["cache_hits"] == before.get("cache_hits", 0) + 1
    np.testing.assert_array_equal(back, X)


def test_small_arrays_and_the_cache_off_send_everything(worker):
    X = _data(2)
    for settings in ({"array_cache": "off"}, {"cache_min_bytes": X.nbytes + 1}):
        connection = _connection(worker, **settings)
        try:
            connection.echo(X)
            connection.echo(X)
            assert connection.stats["sent_frame"] == 2 and connection.stats["cache_hits"] == 0
        finally:
            connection.close()


def test_auto_is_on_with_frames_and_off_with_the_pool(worker):
    for transport, on in (("frames", True), ("pool", False), ("auto", False)):
        with sklearn_gpu_bridge.config_context(transport=transport, array_cache="auto"):
            sklearn_gpu_bridge.reset_connection()
            connection = sklearn_gpu_bridge.get_connection()
            assert (connection.pool is None) is on
            assert (connection.cache is not None) is on, transport
    sklearn_gpu_bridge.reset_connection()
    with pytest.raises(ValueError, match="array_cache must be one of"):
        _connection(worker, array_cache="yes")


def test_the_pool_with_the_cache_on_still_gives_the_same_results(worker):
    with sklearn_gpu_bridge.config_context(transport="pool", array_cache="on", cache_min_bytes=MIN_BYTES):
        sklearn_gpu_bridge.reset_connection()
        connection = sklearn_gpu_bridge.get_connection()
        assert connection.pool is not None and connection.cache is not None
        X = _data(3)
        model = GPUStandardScaler().fit(X)
        assert_same(model.transform(X), StandardScaler().fit(X).transform(X))
        assert connection.stats["cache_hits"] == 1 and connection.stats["sent_pool"] == 1
    sklearn_gpu_bridge.reset_connection()


def test_goodbye_frees_the_clients_arrays(worker):
    first = _connection(worker)
    before = first.status()["array_cache"]
    first.echo(_data(4), _data(5))
    status = first.status()["array_cache"]
    assert status["entries"] == before["entries"] + 2 and status["bytes"] == before["bytes"] + 2 * _data().nbytes
    first.close()
    other = _connection(worker)
    try:
        assert other.status()["array_cache"] == before
    finally:
        other.close()


def _echo(raw, desc, buffers=()):
    reply, frames = raw.request(raw.header("echo", arrays=[desc], payload={"args": [{"__array__": 0}], "kwargs": {}}),
                                buffers)
    if reply["op"] == "error":
        return rebuild_error(reply)
    return reply, Decoder(reply, frames).decode(reply["payload"])["result"][0]


def test_hostile_cache_descriptors_get_an_error_reply_and_the_worker_carries_on(worker):
    X = _data(6, n=100, d=10)
    inline = {"dtype": X.dtype.str, "shape": [100, 10], "order": "C", "where": "inline", "data": X.tobytes()}
    key = "0123456789abcdef" * 2
    owner, other = RawClient(worker), RawClient(worker)
    try:
        reply, back = _echo(owner, {**inline, "cache": key})
        assert reply["cache_kept"] == [key]
        np.testing.assert_array_equal(back, X)
        cached = {"dtype": X.dtype.str, "shape": [100, 10], "order": "C", "where": "cached", "key": key}
        np.testing.assert_array_equal(_echo(owner, cached)[1], X)
        for bad in ["0123456789ABCDEF" * 2, key[:31], key + "0", "zz" * 16, 12, None, [key], b"0" * 32]:
            assert isinstance(_echo(owner, {**cached, "key": bad}), ProtocolError), bad
            assert isinstance(_echo(owner, {**inline, "cache": bad}), ProtocolError), bad
        assert isinstance(_echo(other, cached), CacheMiss)  # another client's key: not found, never served
        assert isinstance(_echo(owner, {**cached, "key": "f" * 32}), CacheMiss)
        for field, value in [("shape", [10, 100]), ("shape", [50, 10]), ("dtype", "<i4"), ("dtype", "<f8"),
                             ("order", "F")]:
            assert isinstance(_echo(owner, {**cached, field: value}), ProtocolError), (field, value)
        np.testing.assert_array_equal(_echo(owner, cached)[1], X)
        for client in (owner, other):
            client.request(client.header("goodbye"))
    finally:
        owner.close()
        other.close()
    connection = sklearn_gpu_bridge.get_connection()
    assert "failed" not in connection.status()["requests"]
    assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))


def test_gridsearch_sends_each_fold_once_and_finds_the_same_model(worker):
    X = _data(7, n=1500)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    searches, stats = {}, {}
    for mode in ("off", "on"):
        with sklearn_gpu_bridge.config_context(transport="frames", array_cache=mode, cache_min_bytes=MIN_BYTES):
            sklearn_gpu_bridge.reset_connection()
            pipe = Pipeline([("sc", GPUStandardScaler()), ("svm", GPUSVC())])
            searches[mode] = GridSearchCV(pipe, {"svm__C": [0.1, 1, 10]}, cv=3).fit(X, y)
            stats[mode] = dict(sklearn_gpu_bridge.get_connection().stats)
            sklearn_gpu_bridge.reset_connection()
    direct = GridSearchCV(Pipeline([("sc", StandardScaler()), ("svm", SVC())]), {"svm__C": [0.1, 1, 10]}, cv=3)
    direct.fit(X, y)
    assert searches["on"].best_params_ == searches["off"].best_params_ == direct.best_params_
    assert_ulps(searches["on"].cv_results_["mean_test_score"], searches["off"].cv_results_["mean_test_score"])
    assert stats["off"].get("cache_hits", 0) == 0
    # per fold: the training data to the scaler, its scaled copy to the SVC, the test data to the scaler and its
    # scaled copy to the SVC travel for the first candidate; the two other candidates send only keys
    if BACKEND == "sklearn":
        assert stats["on"]["cache_hits"] == 2 * 3 * 4, stats["on"]
        assert stats["on"]["sent_frame"] < stats["off"]["sent_frame"] - 20
        assert stats["on"]["cache_bytes_saved"] == 2 * 3 * 2 * X.nbytes  # candidates x folds x (raw, scaled)
    else:  # the GPU's scaled copies need not be the same bits twice (parallel sums): the raw folds hit
        assert stats["on"]["cache_hits"] >= 2 * 3 * 2, stats["on"]
        assert stats["on"]["cache_bytes_saved"] >= 2 * 3 * X.nbytes


# ---------------------------------------------------------------- a worker with a small cache


@pytest.fixture
def small_cache_worker(tmp_path, worker):
    with own_worker(tmp_path, worker, array_cache_mb=1, client_timeout=1) as process:
        yield process


def test_an_evicted_array_is_sent_again_and_results_are_right(small_cache_worker):
    X, Y = _data(8), _data(9)  # 640 KB each: the worker (1 MiB for all clients) keeps one
    with sklearn_gpu_bridge.config_context(**CACHED):
        connection = sklearn_gpu_bridge.get_connection()
        assert connection.capabilities.array_cache == 1 << 20
        direct = StandardScaler().fit_transform(X)
        assert_same(GPUStandardScaler().fit_transform(X), direct)
        assert_same(GPUStandardScaler().fit_transform(X), direct)
        assert connection.stats["cache_hits"] == 1
        other = _connection(small_cache_worker)
        try:
            other.echo(Y)  # the worker drops X to keep Y
        finally:
            other.close()
        assert_same(GPUStandardScaler().fit_transform(X), direct)  # sent as its key, missed, sent in full
        assert connection.stats["cache_misses"] == 1 and connection.stats["cache_hits"] == 1
        assert_same(GPUStandardScaler().fit_transform(X), direct)  # kept again
        assert connection.stats["cache_hits"] == 2
        assert connection.status()["array_cache"]["entries"] == 1
    sklearn_gpu_bridge.reset_connection()


def test_a_silent_clients_arrays_are_freed_by_the_sweep(small_cache_worker):
    connection = _connection(small_cache_worker)
    watcher = _connection(small_cache_worker, array_cache="off")
    try:
        connection.echo(_data(10))
        assert watcher.status()["array_cache"]["entries"] == 1
        connection.transport._stop_keepalive_thread()  # as if it died: no more pings (--client-timeout 1)
        deadline = time.monotonic() + 10
        while watcher.status()["array_cache"]["entries"] and time.monotonic() < deadline:
            time.sleep(0.2)
        status = watcher.status()
        assert status["array_cache"]["entries"] == 0 and status["swept"].get("idle", 0) >= 1
    finally:
        watcher.close()
        connection.close()


def test_a_worker_that_keeps_nothing_is_never_sent_a_key(tmp_path, worker):
    process = WorkerProcess(tmp_path, array_cache_mb=0)
    try:
        connection = _connection(process)
        assert connection.capabilities.array_cache == 0 and connection.cache is None
        X = _data(11)
        connection.echo(X)
        np.testing.assert_array_equal(connection.echo(X)[0], X)
        assert connection.stats["sent_frame"] == 2
        connection.close()
    finally:
        process.stop()
