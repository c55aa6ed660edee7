"""One worker, several GPUs: where fits go, where a model's calls go, and one GPU failing alone.

On the CPU backend the GPUs are simulated (``--gpus 0,1`` makes two): each with a memory budget of its own
(``SKLEARN_GPU_BRIDGE_WORKER_SIMULATED_GPU_MEMORY``), and one whose estimator calls all fail as a GPU in a sticky
CUDA error does (``SKLEARN_GPU_BRIDGE_WORKER_SIMULATED_GPU_FAILS``). Real workers, over ZeroMQ.
"""

import pickle
import threading

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC, GPUTSNE, GPUKMeans, GPUStandardScaler, WorkerUnavailable
from sklearn_gpu_bridge.errors import ConfigurationError
from sklearn_gpu_bridge.manage.service import format_status, status
from sklearn_gpu_bridge.worker import check_settings
from sklearn_gpu_bridge.worker.backends import SIMULATED_GPU_FAILS, SIMULATED_GPU_MEMORY
from sklearn_gpu_bridge.worker.devices import ERRORS_TO_GIVE_UP, Devices, DeviceUnusable, device_failure, parse_gpus

from .conftest import BACKEND, RawClient, WorkerProcess, assert_same, own_worker, wait_until

CPU_ONLY = pytest.mark.skipif(BACKEND != "sklearn", reason="simulated GPUs are the CPU backend's")


def _gpus(connection):
    return {gpu["index"]: gpu for gpu in connection.status()["gpus"]}


def _requests(connection):
    return {index: gpu["requests"] for index, gpu in _gpus(connection).items()}


def _idle(connection):
    """Wait until no request runs: a request counts as running until just after its reply was sent, and a fit
    sent at once may find it still there."""
    assert wait_until(lambda: not any(g["running"] for g in _gpus(connection).values()), 30)


def _data(n=200, features=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, features))
    return X, (X[:, 0] + 0.3 * rng.standard_normal(n) > 0).astype(int)


class _SlowFit:
    """A fit of seconds on the CPU backend, in a thread of this process (the connection serves threads), and
    the GPU it runs on once it runs."""

    def __init__(self, connection):
        X = np.random.default_rng(1).standard_normal((1500, 4))
        self.error = None
        self.thread = threading.Thread(target=self._fit, args=(X,), daemon=True)
        self.thread.start()
        found = wait_until(lambda: any(g["running"] for g in _gpus(connection).values()), 60)
        assert found, "the slow fit never ran"
        self.gpu = next(i for i, g in _gpus(connection).items() if g["running"])

    def _fit(self, X):
        try:
            GPUTSNE(max_iter=250).fit(X)
        except Exception as exc:  # noqa: BLE001 - reported by join
            self.error = exc

    def join(self):
        self.thread.join(120)
        assert not self.thread.is_alive() and self.error is None, self.error


# ---------------------------------------------------------------- the placement policy alone


def test_the_gpus_setting_names_all_or_distinct_indices():
    assert parse_gpus("all", 4) == [0, 1, 2, 3]
    assert parse_gpus("ALL", None) == [0]  # the CPU backend: one stand-in
    assert parse_gpus("0, 2", 3) == [0, 2] and parse_gpus([1, 0], None) == [1, 0]
    for bad in ("", "0,0", "-1", "x", "1.5"):
        with pytest.raises(ConfigurationError, match="gpus"):
            parse_gpus(bad, 4)
    with pytest.raises(ConfigurationError, match="sees 2 GPU"):
        parse_gpus("0,2", 2)


def test_a_request_goes_where_the_least_work_is_and_waits_only_for_its_own_gpu():
    devices = Devices([100, 100])
    first, second = devices.all
    assert devices.place(10) is first  # a tie: the first
    first.start(10)
    assert devices.place(10) is second  # one runs on the first
    second.start(80)
    assert devices.place(50) is first  # fits beside 10 of 100, not beside 80
    assert devices.place(95) is None  # fits on neither: waits
    assert devices.place(95, index=0) is None and devices.place(25, index=1) is None  # a model's GPU, full
    assert devices.place(5, index=1) is second
    second.queued += 2  # calls on its models wait: it has more work
    first.start(10)
    assert devices.place(1) is first
    first.finish(10), first.finish(10), second.finish(80)
    assert devices.place(1000) is first  # nothing runs there: anything fits, however large
    assert devices.in_use == 0 and devices.budget == 200 and first.peak_in_use == 20


def test_an_unusable_gpu_gets_no_new_work_and_its_models_calls_fail_at_once():
    devices = Devices([None, None])
    first, second = devices.all
    error = RuntimeError("CUDA error encountered at: x.cu:12 call='k' Reason=cudaErrorIllegalAddress")
    assert device_failure(error) == "cuda"
    assert device_failure(MemoryError("std::bad_alloc: out_of_memory")) == "memory"
    assert device_failure(MemoryError("std::bad_alloc: out_of_memory: CUDA error at: cuda_async_memory_resource.hpp:"
                                      "70: cudaErrorMemoryAllocation out of memory")) == "memory"
    # RMM meets a sticky error of an earlier kernel while it allocates: a CUDA error, not a want of memory
    assert device_failure(MemoryError("std::bad_alloc: CUDA error (failed to allocate 1066640 bytes) at: "
                                      "cuda_async_view_memory_resource.cpp:43: cudaErrorIllegalAddress an illegal "
                                      "memory access was encountered")) == "cuda"
    assert device_failure(ValueError("C must be positive")) is None
    assert device_failure(_raised_while_handling(error, AssertionError())) == "cuda"  # CuPy's allocator on the way out
    assert device_failure(_raised_while_handling(error, ValueError("y has one class"))) is None  # words of its own
    assert device_failure(_raised_while_handling(ValueError("bad y"), AssertionError())) is None
    silenced = _raised_while_handling(error, AssertionError())
    silenced.__suppress_context__ = True  # raise ... from None
    assert device_failure(silenced) is None
    gone = DeviceUnusable("GPU 0 of this worker is unusable (3 CUDA errors in a row, the last: ...)")
    assert device_failure(gone) is None and device_failure(_raised_while_handling(gone, AssertionError())) is None
    looped = AssertionError()
    looped.__context__ = looped
    assert device_failure(looped) is None
    for n in range(1, ERRORS_TO_GIVE_UP + 1):
        assert first.failure("cuda", error) is (n == ERRORS_TO_GIVE_UP)
    assert "cudaErrorIllegalAddress" in first.unusable
    second.start(0)
    assert devices.place(0) is second  # busy, but the only usable one
    assert devices.place(0, index=0) is first  # a call on its model: refused there at once (Device.check)
    with pytest.raises(RuntimeError, match="GPU 0 of this worker is unusable"):
        first.check()


def test_out_of_memory_and_a_success_between_errors_do_not_make_a_gpu_unusable():
    device = Devices([None]).all[0]
    for _ in range(ERRORS_TO_GIVE_UP + 1):
        assert not device.failure("memory", MemoryError())
    for _ in range(3 * ERRORS_TO_GIVE_UP):
        device.failure("cuda", RuntimeError("CUDA error"))
        device.served()
    assert device.unusable is None and device.failed == 4 * ERRORS_TO_GIVE_UP + 1


# ---------------------------------------------------------------- real workers with simulated GPUs


@CPU_ONLY
def test_by_default_each_of_several_gpus_runs_more_calls_at_once_than_one_gpu(tmp_path, worker):
    """threads=0 (the default): 4 calls at once on one GPU, 8 on each GPU of a worker that drives several, from
    one process or from a process each."""
    with own_worker(tmp_path / "one", worker):
        assert sklearn_gpu_bridge.get_connection().status()["threads"] == 4
    with own_worker(tmp_path / "front", worker, gpus="0,1"):
        assert sklearn_gpu_bridge.get_connection().status()["threads"] == 16
    with own_worker(tmp_path / "two", worker, gpus="0,1", gpu_processes=False):
        assert sklearn_gpu_bridge.get_connection().status()["threads"] == 16
    with own_worker(tmp_path / "set", worker, gpus="0,1", threads=3, gpu_processes=False):
        assert sklearn_gpu_bridge.get_connection().status()["threads"] == 6


def test_a_negative_number_of_threads_is_refused_before_the_backend_warms_up():
    with pytest.raises(ConfigurationError, match="threads must be 0"):
        check_settings(threads=-1)


@CPU_ONLY
def test_a_fit_goes_to_the_idle_gpu_and_the_model_s_calls_follow_it(tmp_path, worker):
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1, gpu_processes=False):
        connection = sklearn_gpu_bridge.get_connection()
        assert connection.status()["threads"] == 2  # threads per GPU
        slow = _SlowFit(connection)
        assert slow.gpu == 0  # both idle: the first
        scaler = GPUStandardScaler().fit(X)  # GPU 0 is busy: GPU 1
        gpus = _gpus(connection)
        assert gpus[1]["handles"] == 1 and gpus[1]["requests"] == 1 and gpus[0]["requests"] == 1
        slow.join()
        before = _requests(connection)
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))  # both idle, yet on GPU 1
        assert scaler.mean_.shape == (5,)  # an attribute read (state_sync lazy: from the worker), also there
        after = _requests(connection)
        assert after[0] == before[0] and after[1] > before[1]
        _idle(connection)
        GPUStandardScaler().fit(X)  # a new fit, both idle: the first again
        assert _requests(connection)[0] == after[0] + 1


def test_a_kmeans_runs_on_the_first_gpu_even_while_another_is_idle(tmp_path, worker):
    """cuML's KMeans runs only on the first GPU it ran on in a process (on another GPU: an illegal memory access,
    which loses that GPU): its fit waits for the worker's first GPU, and its model's calls run there; other
    fits still go where the least work is."""
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1, gpu_processes=False):
        connection = sklearn_gpu_bridge.get_connection()
        slow = _SlowFit(connection)
        assert slow.gpu == 0
        scaler = GPUStandardScaler().fit(X)  # GPU 0 is busy: GPU 1
        labels = GPUKMeans(n_clusters=2, random_state=0).fit(X).predict(X)  # GPU 1 is idle, yet GPU 0
        slow.join()
        assert labels.shape == (len(X),) and scaler.mean_.shape == (5,)
        gpus = _gpus(connection)
        assert gpus[0]["requests"] == 3 and gpus[1]["requests"] == 2  # the slow fit, KMeans' fit and predict; the
        # scaler's fit and its mean_


@pytest.mark.parametrize("name", [["KMeans"], {"KMeans": 1}, 7])
def test_a_key_holders_fit_naming_an_estimator_oddly_leaves_a_worker_of_several_gpus_serving(tmp_path, worker, name):
    """Placement reads the request's estimator name before anything checks it: a list, a dict or a number there
    (a key holder may send any) gets an error, and the worker and its GPUs carry on."""
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1, gpu_processes=False) as process:
        hostile = RawClient(process)
        try:
            reply, _ = hostile.request(hostile.header("fit", estimator=name, method="fit", params={},
                                                      payload={"args": [], "kwargs": {}}))
        finally:
            hostile.close()
        assert reply["op"] == "error" and "unknown estimator" in reply["message"]
        assert GPUKMeans(n_clusters=2, random_state=0).fit(X).cluster_centers_.shape == (2, 5)
        assert "Traceback" not in process.log()  # no thread of the worker met it unprepared


@CPU_ONLY
def test_a_model_pushed_from_a_pickle_goes_to_the_least_loaded_gpu(tmp_path, worker):
    X, y = _data()
    fitted = pickle.dumps(GPUSVC(C=2.0).fit(X, y))  # on the session's worker
    with own_worker(tmp_path, worker, gpus="0,1", threads=1, gpu_processes=False):
        connection = sklearn_gpu_bridge.get_connection()
        slow = _SlowFit(connection)
        model = pickle.loads(fitted)
        assert_same(model.predict(X), SVC(C=2.0).fit(X, y).predict(X))  # its state pushed, then the call
        gpus = _gpus(connection)
        assert gpus[1 - slow.gpu]["handles"] == 1 and gpus[1 - slow.gpu]["requests"] == 2  # set_state, predict
        assert gpus[slow.gpu]["requests"] == 1
        slow.join()


@CPU_ONLY
def test_one_gpu_failing_fails_its_requests_alone_and_is_given_up(tmp_path, worker, monkeypatch):
    X, y = _data()
    fitted = pickle.dumps(GPUStandardScaler().fit(X))  # on the session's worker
    monkeypatch.setenv(SIMULATED_GPU_FAILS, "0")
    with own_worker(tmp_path, worker, gpus="0,1", threads=1, gpu_processes=False) as process:
        connection = sklearn_gpu_bridge.get_connection()
        model = pickle.loads(fitted)
        with pytest.raises(RuntimeError, match=r"cudaErrorIllegalAddress.*a CUDA error on GPU 0; its other GPUs"):
            model.transform(X)  # its state went to GPU 0 (both idle), and transform fails there
        for _ in range(2, ERRORS_TO_GIVE_UP + 1):
            _idle(connection)
            with pytest.raises(RuntimeError, match="GPU 0") as failed:
                GPUSVC().fit(X, y)
        assert "now counts as unusable" in str(failed.value)
        gpus = _gpus(connection)
        assert "CUDA errors in a row" in gpus[0]["unusable"] and gpus[0]["failed"] == ERRORS_TO_GIVE_UP
        assert gpus[1]["requests"] == 0 and gpus[1]["unusable"] is None
        svc = GPUSVC().fit(X, y)
        assert_same(svc.predict(X), SVC().fit(X, y).predict(X))  # GPU 1 serves
        with pytest.raises(RuntimeError, match="GPU 0 of this worker is unusable.*fit them again"):
            model.transform(X)  # its model is lost with its GPU
        gpus = _gpus(connection)
        assert gpus[1]["requests"] == 2 and gpus[1]["handles"] == 1 and gpus[0]["handles"] == 1
        assert connection.ping()
        assert "GPU 0 is unusable from now on" in process.log()


@CPU_ONLY
def test_each_gpu_has_its_own_memory_budget_and_the_status_shows_each(tmp_path, worker, monkeypatch):
    X, y = _data(n=2000, features=20)  # 320 kB: 4 x 320 kB charged, more than a budget, alone on a GPU it runs
    monkeypatch.setenv(SIMULATED_GPU_MEMORY, str(1 << 20))
    with own_worker(tmp_path, worker, gpus="0,1,2", threads=1, gpu_processes=False) as process:
        connection = sklearn_gpu_bridge.get_connection()
        svc = GPUSVC().fit(X, y)
        _idle(connection)  # what a request was admitted with is given back just after its reply
        reply = connection.status()
        assert [g["budget"] for g in reply["gpus"]] == [1 << 20] * 3 and reply["device_budget"] == 3 << 20
        assert reply["gpus"][0]["peak_in_use"] > 0 and reply["device_in_use"] == 0
        text = format_status(status(connection_file=process.connection_file))
        for index in range(3):
            assert f"GPU {index}" in text
        assert "admitted 0.0 GiB of 0.0 GiB" in text and "1 handles" in text and svc.n_features_in_ == 20


@CPU_ONLY
def test_a_search_in_threads_over_several_gpus_gives_scikit_learns_answer(tmp_path, worker):
    X, y = _data(n=150)
    grid = {"m__C": [0.5, 1.0, 4.0], "m__gamma": ["scale", 0.1]}
    expected = GridSearchCV(Pipeline([("s", StandardScaler()), ("m", SVC())]), grid, cv=3).fit(X, y)
    with own_worker(tmp_path, worker, gpus="0,1", threads=2, gpu_processes=False):
        connection = sklearn_gpu_bridge.get_connection()
        pipe = Pipeline([("s", GPUStandardScaler()), ("m", GPUSVC())])
        search = GridSearchCV(pipe, grid, cv=3, n_jobs=4).fit(X, y)
        assert search.best_params_ == expected.best_params_
        np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected.cv_results_["mean_test_score"])
        reply = connection.status()
        work = sum(n for op, n in reply["requests"].items() if op in ("fit", "call", "attribute", "get_state", "set_state", "echo"))
        assert sum(g["requests"] for g in reply["gpus"]) == work and reply["queued"] == 0


def test_a_worker_refuses_gpus_it_cannot_name(tmp_path):
    with pytest.raises(WorkerUnavailable, match="gpus must be 'all' or distinct GPU indices"):
        WorkerProcess(tmp_path, gpus="0,0", timeout=60)


def _raised_while_handling(first, second):
    """``second`` as raised in an ``except`` block that handles ``first`` (its ``__context__``)."""
    try:
        try:
            raise first
        except Exception:
            raise second  # noqa: B904 - the implicit chain is what this builds
    except Exception as exc:  # noqa: BLE001
        return exc
