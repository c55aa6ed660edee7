"""A worker process per GPU behind one address (``--gpus 0,1``, the default for several GPUs): placement, a model's
calls, releases across GPUs, one GPU's process ending, and what a key holder may and may not make the front do.

On the CPU backend the GPUs are simulated (tests/test_devices.py): each process serves one, and one whose calls
all fail as a GPU in a sticky CUDA error does (``SKLEARN_GPU_BRIDGE_WORKER_SIMULATED_GPU_FAILS``). Real worker
processes, over ZeroMQ.
"""

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC, GPUTSNE, GPURandomForestClassifier, GPUStandardScaler
from sklearn_gpu_bridge.runtime.private_files import pid_alive, runtime_folder
from sklearn_gpu_bridge.worker.backends import SIMULATED_GPU_FAILS
from sklearn_gpu_bridge.worker.devices import ERRORS_TO_GIVE_UP
from sklearn_gpu_bridge.worker.handles import tag_of

from .conftest import BACKEND, RawClient, assert_same, own_worker, wait_until

pytestmark = pytest.mark.skipif(BACKEND != "sklearn", reason="simulated GPUs are the CPU backend's")

WORK_OPS = ("fit", "call", "attribute", "get_state", "set_state", "echo")


def _data(n=200, features=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, features))
    return X, (X[:, 0] + 0.3 * rng.standard_normal(n) > 0).astype(int)


def _gpus(connection):
    return {gpu["index"]: gpu for gpu in connection.status()["gpus"]}


def _running_on(connection):
    """The GPU a request runs on now, once one does."""
    found = wait_until(lambda: any(g["running"] for g in _gpus(connection).values()), 60)
    assert found, "no request ever ran"
    return next(index for index, gpu in _gpus(connection).items() if gpu["running"])


class _SlowFit(threading.Thread):
    """A fit of seconds on the CPU backend, in a thread of this process (the connection serves threads)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.error = None
        self.start()

    def run(self):
        try:
            GPUTSNE(max_iter=250).fit(np.random.default_rng(1).standard_normal((1500, 4)))
        except Exception as exc:  # noqa: BLE001 - read by the test
            self.error = exc


@pytest.mark.parametrize("transport, bind", [("pool", "ipc"), ("frames", "127.0.0.1")])
def test_a_search_spreads_over_a_process_per_gpu_and_gives_scikit_learns_answer(tmp_path, worker, transport, bind):
    X, y = _data(n=150)
    grid = {"m__C": [0.5, 1.0, 4.0], "m__gamma": ["scale", 0.1]}
    expected = GridSearchCV(Pipeline([("s", StandardScaler()), ("m", SVC())]), grid, cv=3).fit(X, y)
    with own_worker(tmp_path, worker, gpus="0,1", threads=2, bind=bind) as front:
        with sklearn_gpu_bridge.config_context(transport=transport):
            connection = sklearn_gpu_bridge.get_connection()
            pipe = Pipeline([("s", GPUStandardScaler()), ("m", GPUSVC())])
            search = GridSearchCV(pipe, grid, cv=3, n_jobs=4).fit(X, y)
            assert search.best_params_ == expected.best_params_
            np.testing.assert_allclose(search.cv_results_["mean_test_score"],
                                       expected.cv_results_["mean_test_score"])
            reply = connection.status()
        gpus = {gpu["index"]: gpu for gpu in reply["gpus"]}
        assert reply["processes"] == 2 and sorted(gpus) == [0, 1] and gpus[0]["pid"] != gpus[1]["pid"]
        assert all(gpus[i]["requests"] > 0 for i in (0, 1)), gpus  # both GPUs served
        work = sum(n for op, n in reply["requests"].items() if op in WORK_OPS)
        assert sum(gpu["requests"] for gpu in gpus.values()) == work and reply["queued"] == 0
        assert reply["threads"] == 4  # 2 calls at once on each
        assert "[GPU 0]" in front.log() and "[GPU 1]" in front.log()  # one log, each line says whose
        assert front.info.address.startswith("tcp://" if bind != "ipc" else "ipc://")
        assert not list(runtime_folder().glob("front-*.key"))  # the key the GPUs' processes read is gone once ready


def test_a_fit_goes_to_the_idle_gpu_and_the_model_s_calls_follow_it(tmp_path, worker):
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1):
        connection = sklearn_gpu_bridge.get_connection()
        slow = _SlowFit()
        busy = _running_on(connection)
        scaler = GPUStandardScaler().fit(X)  # the other GPU: nothing in flight there
        assert tag_of(scaler._remote.handle) == 1 - busy
        slow.join(120)
        assert slow.error is None
        before = {i: g["requests"] for i, g in _gpus(connection).items()}
        assert_same(scaler.transform(X), StandardScaler().fit(X).transform(X))
        after = {i: g["requests"] for i, g in _gpus(connection).items()}
        assert after[1 - busy] == before[1 - busy] + 1 and after[busy] == before[busy]


def test_a_model_released_is_freed_on_its_own_gpu(tmp_path, worker):
    """A release rides on the client's next request, which may go to another GPU: the front frees it where the
    model is."""
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1):
        connection = sklearn_gpu_bridge.get_connection()
        slow = _SlowFit()
        busy = _running_on(connection)
        kept = GPUStandardScaler().fit(X)  # the idle GPU
        slow.join(120)
        assert _gpus(connection)[1 - busy]["handles"] == 1
        del kept
        gc.collect()
        second = GPUStandardScaler().fit(X)  # carries the release; goes to GPU 0 (both idle)
        handles = {i: g["handles"] for i, g in _gpus(connection).items()}
        assert tag_of(second._remote.handle) == 0 and handles == {0: 1, 1: 0}, handles
        sklearn_gpu_bridge.reset_connection()  # goodbye: every GPU frees what this client left
        assert wait_until(lambda: sum(g["handles"] for g in _gpus(sklearn_gpu_bridge.get_connection()).values()) == 0,
                          10)


def test_a_call_for_one_gpu_is_never_taken_up_by_another(tmp_path, worker):
    """A client on this host that spins for its replies writes each request into a slot of its pool as well, where
    a worker of one GPU may look for it once it has replied to that client's thread. Behind a front, the GPU that
    answered the last call need not be the one of the next call: it must leave the slot alone. Here the GPU that
    answered is kept busy past its reply (it frees a large forest that the call released), so that the next
    call, for the other GPU, is in the slot by the time it could look."""
    X, y = _data()
    big, labels = _data(n=5000)
    with own_worker(tmp_path, worker, gpus="0,1", threads=1), sklearn_gpu_bridge.config_context(reply_wait="spin"):
        connection = sklearn_gpu_bridge.get_connection()
        slow = _SlowFit()
        _running_on(connection)
        scalers = {}
        for _ in range(50):  # one model on each GPU (a fit goes where the fewest requests are in flight)
            scaler = GPUStandardScaler().fit(X)
            scalers.setdefault(tag_of(scaler._remote.handle), scaler)
            if len(scalers) == 2:
                break
        slow.join(120)
        assert slow.error is None and sorted(scalers) == [0, 1]  # a GPU taking calls from the slot keeps them all
        expected = StandardScaler().fit(X).transform(X)
        for _ in range(5):
            forest = GPURandomForestClassifier(n_estimators=200, random_state=0).fit(big, labels)
            gpu = tag_of(forest._remote.handle)
            del forest  # released with the next call, and freed after its reply
            assert_same(scalers[gpu].transform(X), expected)
            assert_same(scalers[1 - gpu].transform(X), expected)  # in the slot while that GPU frees the forest


def test_a_gpu_whose_process_ends_fails_its_requests_alone(tmp_path, worker):
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1", threads=1) as front:
        connection = sklearn_gpu_bridge.get_connection()
        on_zero = GPUStandardScaler().fit(X)  # both idle: GPU 0
        assert tag_of(on_zero._remote.handle) == 0
        pid = _gpus(connection)[0]["pid"]
        os.kill(pid, signal.SIGKILL)  # what a GPU in a sticky CUDA error may do to its process
        assert wait_until(lambda: _gpus(connection)[0]["unusable"] is not None, 10)
        assert "ended with code -9" in _gpus(connection)[0]["unusable"]
        with pytest.raises(RuntimeError, match="GPU 0 of this worker is unusable.*fit them again"):
            on_zero.transform(X)
        svc = GPUSVC().fit(X, y)  # GPU 1 serves
        assert tag_of(svc._remote.handle) == 1
        assert_same(svc.predict(X), SVC().fit(X, y).predict(X))
        assert connection.ping() and "GPU 0: its worker process ended" in front.log()


def test_a_gpu_in_sticky_cuda_errors_ends_its_process_and_the_others_serve(tmp_path, worker, monkeypatch):
    X, y = _data()
    monkeypatch.setenv(SIMULATED_GPU_FAILS, "0")
    with own_worker(tmp_path, worker, gpus="0,1", threads=1):
        connection = sklearn_gpu_bridge.get_connection()
        for _ in range(ERRORS_TO_GIVE_UP):
            with pytest.raises(RuntimeError, match="a CUDA error on GPU 0; its other GPUs carry on"):
                GPUSVC().fit(X, y)  # both idle: GPU 0, which fails
        assert wait_until(lambda: "process ended" in (_gpus(connection)[0]["unusable"] or ""), 10)
        svc = GPUSVC().fit(X, y)
        assert tag_of(svc._remote.handle) == 1 and svc.predict(X).shape == (len(X),)


def test_the_front_and_its_processes_end_together(tmp_path, worker):
    with own_worker(tmp_path, worker, gpus="0,1", threads=1) as front:
        pids = [gpu["pid"] for gpu in sklearn_gpu_bridge.get_connection().status()["gpus"]]
        sklearn_gpu_bridge.reset_connection()
        front.process.kill()  # no clean stop: each GPU's process sees its parent gone
        front.process.wait()
        assert wait_until(lambda: not any(pid_alive(pid) for pid in pids), 15)


def _started_by(pid):
    """The pids of the live processes started with ``--parent-pid pid`` (a front's, for its GPUs)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--parent-pid" in argv and argv[argv.index(b"--parent-pid") + 1:][:1] == [str(pid).encode()]:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the processes' command lines in /proc")
def test_a_front_that_cannot_start_leaves_no_process_behind(tmp_path):
    with socket.socket() as taken:  # the port the front is told to bind is taken
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        front = subprocess.Popen([sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", "sklearn",
                                  "--gpus", "0,1", "--bind", "127.0.0.1", "--port", str(port),
                                  "--connection-file", str(tmp_path / "w.json")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
        _, err = front.communicate(timeout=120)
    assert front.returncode == 1 and b"Error: Address already in use" in err and b"Traceback" not in err
    assert _started_by(front.pid) == []  # stopped before the front ended, not a second later by themselves
    assert not (tmp_path / "w.json").exists()


# ---------------------------------------------------------------- a key holder against the front


def test_a_key_holder_cannot_make_the_front_or_a_worker_attach_a_pool_unproven(tmp_path, worker):
    """``adopt`` attaches a pool without its challenge: only a front's own request to its GPUs' processes may ask
    it. The front never passes it on, and a worker that serves behind no front refuses it."""
    pool = {"name": "sgb-not-mine", "kind": "file", "segment": 0, "pid": os.getpid()}
    for target in (worker, None):
        with own_worker(tmp_path / "front", worker, gpus="0,1") if target is None else nullcontext() as front:
            hostile = RawClient(front or worker)
            try:
                reply, _ = hostile.request(hostile.header("adopt", pool=pool, pid=os.getpid()))
            finally:
                hostile.close()
            assert reply["op"] == "error"
            assert ("unknown operation 'adopt'" if target is None else "serves behind no front") in reply["message"]


def test_a_key_holder_reads_no_other_clients_model_through_the_front(tmp_path, worker):
    """The front routes by the GPU a handle names; the process there still answers only the client that made it."""
    X, y = _data()
    with own_worker(tmp_path, worker, gpus="0,1") as front:
        model = GPUStandardScaler().fit(X)
        hostile = RawClient(front)
        try:
            reply, _ = hostile.request(hostile.header("attribute", handle=model._remote.handle, name="mean_"))
            assert reply["op"] == "error" and "no estimator with handle" in reply["message"]
            for odd in ([1, 2], {"a": 1}, 3.5):  # an id the front cannot key its table by: refused, and it serves on
                reply = hostile.request(hostile.header("echo", payload={"args": [], "kwargs": {}}) | {"id": odd})
                assert reply[0]["op"] == "error" and "needs an id of its own" in reply[0]["message"]
        finally:
            hostile.close()
        assert model.transform(X).shape == X.shape

