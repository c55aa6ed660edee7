"""The worker's life: ready, busy, stopped, killed, started by the client itself."""

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC, GPUStandardScaler, VersionMismatch, WorkerLost, WorkerUnavailable
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION
from sklearn_gpu_bridge.runtime.connection_file import ConnectionInfo, new_key, write_connection_file
from sklearn_gpu_bridge.runtime.private_files import pid_alive

from .conftest import BACKEND, WorkerProcess, assert_same, bare_env, use_worker, wait_until


def _long_fit_data():
    """A fit that keeps the CPU backend busy for seconds (a cuML one would be too quick)."""
    return make_classification(n_samples=6000, n_features=50, flip_y=0.4, random_state=0)


def _wait_dead(pid, seconds=10):
    deadline = time.monotonic() + seconds
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_status_counts_the_worker_process_s_own_collections(worker):
    """benchmarks/worker_gc.py reads them: how often the collector runs inside the worker's requests."""
    connection = sklearn_gpu_bridge.get_connection()
    before = connection.status()["collections"]
    assert len(before) == 3 and all(isinstance(n, int) and n >= 0 for n in before)
    assert before[0] > 0  # its imports allocated enough for the young generation's collections
    for _ in range(3):
        gc.collect()  # the caller's full collections are not the worker's
    after = connection.status()["collections"]
    assert all(a >= b for a, b in zip(after, before)) and after[2] < before[2] + 3


@pytest.mark.skipif(BACKEND != "sklearn", reason="needs a fit of seconds; cuML is too fast for that here")
def test_ping_and_status_answer_while_a_long_fit_runs(fresh_worker):
    X, y = _long_fit_data()
    connection = sklearn_gpu_bridge.get_connection()
    fitted = []
    fitting = threading.Thread(target=lambda: fitted.append(GPUSVC(C=100).fit(X, y)))
    fitting.start()
    time.sleep(0.5)
    answered_while_busy = 0
    while fitting.is_alive():
        assert connection.ping(timeout=1.0)
        assert connection.status()["backend"] == BACKEND
        answered_while_busy += 1
        time.sleep(0.2)
    fitting.join()
    assert answered_while_busy >= 2
    assert fitted and fitted[0].predict(X[:5]).shape == (5,)


@pytest.mark.skipif(BACKEND != "sklearn", reason="needs a fit of seconds; cuML is too fast for that here")
def test_killed_worker_mid_call_raises_worker_lost(fresh_worker):
    X, y = _long_fit_data()
    errors = []

    def fit():
        try:
            GPUSVC(C=100).fit(X, y)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    fitting = threading.Thread(target=fit)
    fitting.start()
    time.sleep(1.0)
    fresh_worker.process.kill()
    killed_at = time.monotonic()
    fitting.join(timeout=30)
    assert not fitting.is_alive(), "the client hung on a dead worker"
    assert len(errors) == 1 and isinstance(errors[0], WorkerLost), errors
    print(f"WorkerLost raised {time.monotonic() - killed_at:.2f} s after SIGKILL")


def test_sigterm_stops_cleanly_and_removes_the_connection_file(tmp_path):
    process = WorkerProcess(tmp_path)
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(15) == 0
    assert not process.connection_file.exists()
    assert "worker stopped" in process.log()


def test_shutdown_request(fresh_worker):
    connection = sklearn_gpu_bridge.get_connection()
    connection.transport._roundtrip({"op": "shutdown"}, timeout=5)
    assert fresh_worker.process.wait(15) == 0


def test_protocol_version_mismatch_is_a_clear_error(connection):
    with pytest.raises(VersionMismatch, match="protocol 999"):
        connection.transport._roundtrip({"op": "hello", "protocol_version": 999}, timeout=5)
    assert connection.ping()


def test_missing_connection_file_names_the_command(tmp_path):
    path = tmp_path / "absent.json"
    sklearn_gpu_bridge.reset_connection()
    with sklearn_gpu_bridge.config_context(connection_file=str(path)):
        with pytest.raises(WorkerUnavailable, match=f"sklearn-gpu-bridge worker --connection-file {path}"):
            GPUStandardScaler().fit(np.ones((3, 2)))
    sklearn_gpu_bridge.reset_connection()


def test_stale_connection_file_is_refused_without_waiting_for_the_hello_timeout(tmp_path):
    """A worker gone, its file left: the refused connect says so (before: 10 s of silence)."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "stale.json"
    write_connection_file(path, ConnectionInfo(address=f"tcp://127.0.0.1:{port}", key=new_key(),
                                               protocol_version=PROTOCOL_VERSION, pid=1, backend="cuml",
                                               worker_id="0" * 24))
    sklearn_gpu_bridge.reset_connection()
    with sklearn_gpu_bridge.config_context(connection_file=str(path), start_local_worker=False):
        with pytest.raises(WorkerUnavailable, match="nothing listens there") as raised:
            GPUStandardScaler().fit(np.ones((3, 2)))
    assert f"--connection-file {path}" in str(raised.value)
    sklearn_gpu_bridge.reset_connection()


def test_unknown_operation_gets_an_error_not_a_crash(connection):
    with pytest.raises(sklearn_gpu_bridge.ProtocolError, match="unknown operation"):
        connection.transport._roundtrip({"op": "format_disk"}, timeout=5)
    assert connection.ping()


def test_local_worker_is_started_shared_with_joblib_children_and_stopped(tmp_path):
    """No worker configured: the first call starts one; n_jobs=2 children use it; exit stops it."""
    script = textwrap.dedent("""
        import json, warnings
        import joblib
        import numpy as np
        from sklearn.datasets import load_iris
        from sklearn.model_selection import GridSearchCV
        from sklearn.pipeline import Pipeline
        import sklearn_gpu_bridge
        from sklearn_gpu_bridge import GPUStandardScaler, GPUSVC
        X, y = load_iris(return_X_y=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipe = Pipeline([("sc", GPUStandardScaler()), ("svm", GPUSVC())])
            with joblib.parallel_config(backend="loky"):  # processes, not the threads a search would use
                GridSearchCV(pipe, {"svm__C": [0.1, 1, 10]}, cv=3, n_jobs=2).fit(X, y)
        connection = sklearn_gpu_bridge.get_connection()
        status = connection.status()
        print(json.dumps({
            "worker_pid": connection.info.pid, "backend": status["backend"],
            "hellos": status["requests"]["hello"], "pool_files": connection.pool.paths,
            "warnings": [str(w.message) for w in caught if "running on scikit-learn" in str(w.message)],
        }))
    """)
    env = bare_env()
    env.update(SKLEARN_GPU_BRIDGE_LOCAL_BACKEND="auto", XDG_RUNTIME_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["hellos"] >= 2, "the joblib children did not reach the parent's worker"
    if report["backend"] == "sklearn":
        assert len(report["warnings"]) == 1  # said once, not per call or per child
    assert _wait_dead(report["worker_pid"]), "the local worker outlived its client"
    assert not any(os.path.exists(p) for p in report["pool_files"])


def test_a_reply_says_when_its_request_arrived_and_when_it_was_answered():
    """``worker_span`` ([arrived, replied] on the worker's CLOCK_MONOTONIC, which a client on the same host
    shares) splits a call's time into the way to the worker, the worker's part, and the way back."""
    GPUStandardScaler().fit_transform(np.ones((100, 3)))
    to_worker, on_worker, back = sklearn_gpu_bridge.get_connection().last_timing
    assert to_worker > 0 and on_worker > 0 and back > 0


_SEARCH_IN_CHILDREN = textwrap.dedent("""
    import sys
    import numpy as np
    import sklearn_gpu_bridge
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn_gpu_bridge import GPULogisticRegression, GPUStandardScaler

    sklearn_gpu_bridge.set_config(connection_file=sys.argv[1], start_local_worker=False)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4))
    y = (X[:, 0] > 0).astype(int)
    print(cross_val_score(make_pipeline(GPUStandardScaler(), GPULogisticRegression()), X, y, cv=4, n_jobs=2).size)
""")


def test_the_processes_of_a_search_use_the_worker_the_caller_was_pointed_at(worker, connection, tmp_path):
    """set_config(connection_file=...) in the caller reaches joblib's processes (before, they found no worker)."""
    env = {k: v for k, v in os.environ.items() if k != "SKLEARN_GPU_BRIDGE_CONNECTION_FILE"}
    before = connection.status()["requests"].get("fit", 0)
    run = subprocess.run([sys.executable, "-c", _SEARCH_IN_CHILDREN, str(worker.connection_file)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["4"]
    assert connection.status()["requests"].get("fit", 0) - before >= 2 * 4  # each fold's scaler and model


def test_set_config_sets_the_connection_file_for_children_and_puts_the_environment_back(monkeypatch):
    variable = "SKLEARN_GPU_BRIDGE_CONNECTION_FILE"
    sklearn_gpu_bridge.set_config(connection_file=None)  # what the environment said before this session's worker
    monkeypatch.setenv(variable, "/from/the/environment.json")
    sklearn_gpu_bridge.set_config(connection_file="/from/code.json")
    assert os.environ[variable] == "/from/code.json"
    with sklearn_gpu_bridge.config_context(connection_file="/in/a/block.json"):
        assert os.environ[variable] == "/in/a/block.json"
    assert os.environ[variable] == "/from/code.json"
    sklearn_gpu_bridge.set_config(connection_file=None)
    assert os.environ[variable] == "/from/the/environment.json"


def test_a_config_context_puts_back_only_the_settings_it_changed():
    """A block that ends puts back the settings it changed, not a copy of all of them taken when it began:
    that copy undid a ``set_config`` made meanwhile, here in another thread, and outside any block."""
    before = sklearn_gpu_bridge.get_config()
    entered, leave = threading.Event(), threading.Event()

    def block():
        with sklearn_gpu_bridge.config_context(reply_wait="sleep"):
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=block)
    thread.start()
    try:
        assert entered.wait(10)
        sklearn_gpu_bridge.set_config(precision="native")
        leave.set()
        thread.join(10)
        config = sklearn_gpu_bridge.get_config()
        assert (config["precision"], config["reply_wait"]) == ("native", before["reply_wait"])
    finally:
        leave.set()
        sklearn_gpu_bridge.set_config(precision=None)


def test_a_worker_closed_from_another_thread_stops_serving_and_closes_once(tmp_path):
    """close() from another thread ends serve_forever, whose own close() then does nothing more (a second
    close once the context is gone would raise), and every thread that took turns reading has stopped."""
    from sklearn_gpu_bridge.client import connect
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
    from sklearn_gpu_bridge.worker.backends import SklearnBackend
    from sklearn_gpu_bridge.worker.server import Worker

    worker = Worker(SklearnBackend(), connection_file=str(tmp_path / "worker.json"), threads=2).start()
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    connection = connect(read_connection_file(tmp_path / "worker.json"))
    try:
        assert connection.status()["threads"] == 2
        worker.close()
        thread.join(timeout=10)
        assert not thread.is_alive()
        worker.close()  # again: nothing to do, nothing raised
        for reader in worker.queue._threads:
            reader.join(timeout=10)
        assert not any(reader.is_alive() for reader in worker.queue._threads)
    finally:
        connection.close()


@pytest.mark.gpu
@pytest.mark.parametrize("kind, resource, cupy_allocator", [
    ("async", "CudaAsyncMemoryResource", "rmm_cupy_allocator"),
    ("async-cupy", "CudaAsyncMemoryResource", "MemoryAsyncPool.malloc"),
    ("cuda", "CudaMemoryResource", "rmm_cupy_allocator"),
])
def test_a_cuml_worker_allocates_device_memory_as_its_setting_says(tmp_path, worker, kind, resource, cupy_allocator):
    X = np.random.default_rng(0).standard_normal((5000, 20))
    process = WorkerProcess(tmp_path, device_memory=kind)
    try:
        use_worker(process)
        versions = sklearn_gpu_bridge.get_connection().status()["versions"]
        assert (versions["device_memory"], versions["cupy_allocator"]) == (resource, cupy_allocator)
        assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))
    finally:
        sklearn_gpu_bridge.reset_connection()
        process.stop()
        use_worker(worker)


@pytest.mark.parametrize("how, expected", [("option", 7.5), ("environment", 7.5), ("default", 3.0)])
def test_a_workers_watch_is_set_by_its_option_or_its_environment_variable(tmp_path, worker, how, expected,
                                                                          monkeypatch):
    """``--watch-ms`` and SKLEARN_GPU_BRIDGE_WORKER_WATCH_MS reach the worker (its status says what it uses);
    without either it watches 3 ms, as the README says."""
    monkeypatch.delenv("SKLEARN_GPU_BRIDGE_WORKER_WATCH_MS", raising=False)
    if how == "environment":
        monkeypatch.setenv("SKLEARN_GPU_BRIDGE_WORKER_WATCH_MS", "7.5")
    process = WorkerProcess(tmp_path, **({"watch_ms": 7.5} if how == "option" else {}))
    try:
        use_worker(process)
        assert sklearn_gpu_bridge.get_connection().status()["watch_ms"] == expected  # the number given, as given
    finally:
        sklearn_gpu_bridge.reset_connection()
        process.stop()
        use_worker(worker)


@pytest.mark.parametrize("option, value, message", [
    ("--device-memory", "pool", "'pool' is not one of 'async', 'async-cupy', 'cuda'"),
    ("--watch-ms", "-1", "-1.0 is not in the range x>=0"),
    ("--watch-ms", "nan", "watch_ms must be a number of milliseconds from 0 to 60000, not nan"),
    ("--watch-ms", "inf", "watch_ms must be a number of milliseconds from 0 to 60000, not inf"),
])
@pytest.mark.parametrize("backend", ["auto", "cuml"])
def test_a_bad_setting_is_refused_before_the_worker_starts(tmp_path, option, value, message, backend):
    """A watch that never ends (NaN compares false with every deadline) would keep a core busy for a client that
    may be gone: refused, as a negative one is; before the backend is made (here without cuML, ``--backend cuml``
    would fail on the import instead; on the GPU machine, cuML would warm up first)."""
    run = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", backend, option, value,
                          "--connection-file", str(tmp_path / "w.json")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode in (1, 2) and message in run.stderr, run.stderr
    assert not (tmp_path / "w.json").exists()


@pytest.mark.parametrize("backend", ["auto", "cuml", "sklearn"])
def test_an_unknown_device_memory_setting_is_an_error_not_a_fallback_to_the_cpu(backend):
    from sklearn_gpu_bridge.worker.backends import make_backend

    with pytest.raises(ValueError, match="device_memory must be one of async, async-cupy, cuda, not 'pool'"):
        make_backend(backend, device_memory="pool")


def test_a_gpu_without_memory_pools_keeps_cumls_allocator_and_says_so(monkeypatch, caplog):
    """CUDA's memory pools are not on every GPU or driver (some vGPU and TCC set-ups have none). There RMM's
    async resource refuses to be made, and the worker must keep cuML's own allocator and say why, not stop or
    fall back to the CPU. RMM and CuPy are stood in for by modules that behave as they do on such a driver:
    no GPU here has none."""
    made = []

    def refused(**kwargs):
        raise RuntimeError("cudaErrorNotSupported: memory pools are not supported on this device")

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(mem_info=(8 << 30, 16 << 30))))
    fake_rmm = types.SimpleNamespace(mr=types.SimpleNamespace(CudaAsyncMemoryResource=refused,
                                                              set_current_device_resource=made.append))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "rmm", fake_rmm)
    from sklearn_gpu_bridge.worker.device_memory import use_device_memory

    with caplog.at_level("WARNING", logger="sklearn_gpu_bridge.worker.device_memory"):
        use_device_memory("async")
    assert made == []
    assert "CUDA's stream-ordered pool is not usable here (RuntimeError: cudaErrorNotSupported" in caplog.text


def _with_stand_ins(monkeypatch, runtime, memory_async_pool, set_allocator, set_resource):
    """``use_device_memory`` with CuPy and RMM stood in for: CuPy's ``runtime``, ``MemoryAsyncPool`` and
    ``set_allocator`` as given, one GPU of 16 GiB current; RMM's resource set with ``set_resource``."""
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0, mem_info=(8 << 30, 16 << 30)), runtime=runtime,
        MemoryAsyncPool=memory_async_pool, set_allocator=set_allocator))
    fake_rmm = types.SimpleNamespace(mr=types.SimpleNamespace(CudaAsyncMemoryResource=lambda **kwargs: kwargs,
                                                              set_current_device_resource=set_resource))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "rmm", fake_rmm)
    from sklearn_gpu_bridge.worker.device_memory import use_device_memory

    return use_device_memory


def test_a_cupy_without_its_own_stream_ordered_allocator_keeps_rmms_and_says_so(monkeypatch, caplog):
    """``async-cupy`` where CuPy cannot make its own stream-ordered pool (an older driver, HIP): RMM's resource is
    still set, CuPy's arrays keep coming through RMM's allocator, and the log says why (stand-ins as above)."""
    made, allocators = [], []

    def refused(pool):
        raise RuntimeError("cudaErrorNotSupported: memory pools are not supported on this device")

    runtime = types.SimpleNamespace(deviceGetDefaultMemPool=lambda device: 1234, getDeviceCount=lambda: 1,
                                    memPoolSetAttribute=lambda pool, attribute, value: None)
    use_device_memory = _with_stand_ins(monkeypatch, runtime, refused, allocators.append, made.append)

    with caplog.at_level("WARNING", logger="sklearn_gpu_bridge.worker.device_memory"):
        use_device_memory("async-cupy")
    assert made == [{"release_threshold": 1 << 30}] and allocators == []
    assert "CuPy's stream-ordered allocator is not usable here (RuntimeError: cudaErrorNotSupported" in caplog.text


def test_on_a_host_of_several_gpus_cupys_own_allocator_never_touches_the_others(monkeypatch, caplog):
    """``async-cupy`` where the process sees two GPUs: RMM's pool is made for the current one, and CuPy's own
    allocator is not made at all. Its constructor would make each GPU current in turn (a context on each) and
    make the one pool it is given the current pool of all of them, so that another GPU's ``cudaMallocAsync``
    would hand out the first GPU's memory (stand-ins for CuPy and RMM that record what they are asked)."""
    made, asked = [], []
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 2, deviceGetDefaultMemPool=asked.append,
                                    setDevice=asked.append, deviceSetMemPool=lambda *args: asked.append(args))
    use_device_memory = _with_stand_ins(monkeypatch, runtime, lambda pool: asked.append(("MemoryAsyncPool", pool)),
                                        asked.append, made.append)

    with caplog.at_level("INFO", logger="sklearn_gpu_bridge.worker.device_memory"):
        use_device_memory("async-cupy")
    assert made == [{"release_threshold": 1 << 30}] and asked == []
    assert "CuPy's arrays: through RMM (this process sees several GPUs)" in caplog.text


def test_a_worker_of_several_gpus_gives_cupys_arrays_through_rmm(monkeypatch):
    """``async-cupy`` on GPUs 0 and 1: each GPU gets RMM's stream-ordered pool, made while it is current, and
    CuPy's allocator is RMM's (its buffers are freed on their own device); on the current GPU alone, CuPy's
    own allocator stays as the start set it (stand-ins for CuPy and RMM, as above)."""
    current, made, allocators = [0], [], []

    class Device:
        def __init__(self, index=None):
            self.index = current[0] if index is None else index
            self.mem_info = (8 << 30, 16 << 30)

        def __enter__(self):
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.previous

    runtime = types.SimpleNamespace(getDevice=lambda: current[0])
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device, runtime=runtime,
                                                                 set_allocator=allocators.append))
    fake_rmm = types.SimpleNamespace(mr=types.SimpleNamespace(
        CudaAsyncMemoryResource=lambda **kwargs: ("pool of GPU", current[0]),
        set_current_device_resource=made.append))
    rmm_allocator = object()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "rmm", fake_rmm)
    monkeypatch.setitem(sys.modules, "rmm.allocators", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "rmm.allocators.cupy", types.SimpleNamespace(rmm_cupy_allocator=rmm_allocator))
    from sklearn_gpu_bridge.worker.device_memory import use_device_memory_on

    use_device_memory_on([0], "async-cupy")
    assert made == [] and allocators == []
    use_device_memory_on([0, 1], "async-cupy")
    assert made == [("pool of GPU", 1)] and allocators == [rmm_allocator] and current == [0]


# ---------------------------------------------------------------- warnings of requests that run at once


def test_a_warning_on_the_worker_is_warned_again_by_the_call_that_caused_it_each_time():
    """A ConvergenceWarning of the worker's estimator comes back with the reply and is warned on the client, in
    its category, at every call that causes it (the worker shows every warning; the client's filters decide)."""
    from sklearn.exceptions import ConvergenceWarning

    X, y = make_classification(n_samples=200, n_features=8, random_state=0)
    if BACKEND != "sklearn":
        pytest.skip("scikit-learn's LogisticRegression warns of max_iter=1; cuML's may not")
    for _ in range(2):
        with pytest.warns(ConvergenceWarning):
            sklearn_gpu_bridge.GPULogisticRegression(max_iter=1).fit(X, y)


def test_warnings_of_requests_that_overlap_on_two_threads_stay_with_their_request():
    """Two requests run at once on two of the worker's threads (two clients' requests may): A starts, B starts,
    A warns, A ends, B warns. Each reply must carry its own warning, and only it. Caught with
    ``warnings.catch_warnings``, which swaps the process's state, A's warning went into B's reply (B entered
    last) and B's to stderr (A's exit put back what was there before either)."""
    from sklearn_gpu_bridge.worker.caught_warnings import caught_warnings

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    got = {}

    def request(name, entered, wait_for, then):
        with caught_warnings() as caught:
            entered.set()
            assert wait_for.wait(10)
            warnings.warn(f"from {name}", RuntimeWarning)
        got[name] = caught
        then.set()

    a = threading.Thread(target=request, args=("A", a_in, b_in, a_out))
    b = threading.Thread(target=request, args=("B", b_in, a_out, threading.Event()))
    a.start()
    assert a_in.wait(10)
    b.start()
    a.join(10)
    b.join(10)
    assert got == {"A": [("builtins", "RuntimeWarning", "from A")], "B": [("builtins", "RuntimeWarning", "from B")]}


def test_a_warning_outside_any_request_goes_the_processs_way_and_its_filters_come_back(monkeypatch):
    """While a request runs on one thread, a warning of another thread (the worker's own) goes where the process
    shows warnings, not into the reply; once no request runs, the process's filters and its way of showing
    warnings are what they were (a request's "always" is for requests only)."""
    from sklearn_gpu_bridge.worker.caught_warnings import caught_warnings

    shown = []

    def show(message, *rest):
        shown.append(str(message))

    monkeypatch.setattr(warnings, "showwarning", show)
    filters = list(warnings.filters)
    inside, go_on, got = threading.Event(), threading.Event(), []

    def request():
        with caught_warnings() as caught:
            inside.set()
            assert go_on.wait(10)
            warnings.warn("the request's", UserWarning)
        got.extend(caught)

    thread = threading.Thread(target=request)
    thread.start()
    assert inside.wait(10)
    warnings.warn("not a request's", UserWarning)
    go_on.set()
    thread.join(10)
    assert shown == ["not a request's"] and got == [("builtins", "UserWarning", "the request's")]
    assert warnings.filters == filters and warnings.showwarning is show


def test_a_request_inside_a_request_on_one_thread_keeps_each_ones_warnings():
    from sklearn_gpu_bridge.worker.caught_warnings import caught_warnings

    with caught_warnings() as outer:
        warnings.warn("outer, first", UserWarning)
        with caught_warnings() as inner:
            warnings.warn("inner", UserWarning)
        warnings.warn("outer, after", UserWarning)
    assert [m for _, _, m in outer] == ["outer, first", "outer, after"] and [m for _, _, m in inner] == ["inner"]


def _init_that_waits(mine, theirs, say):
    """A KMeans ``init`` (sent by value, as cloudpickle) that touches ``mine``, waits for ``theirs``, warns ``say``
    and starts from the first rows: a fit whose warning comes at a moment the test chooses."""
    def init(X, n_clusters, random_state):
        open(mine, "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(theirs) and time.monotonic() < deadline:
            time.sleep(0.01)
        warnings.warn(say, UserWarning)
        return X[:n_clusters].copy()
    return init


@pytest.mark.skipif(BACKEND != "sklearn", reason="a callable init runs in scikit-learn's KMeans (the CPU worker)")
def test_a_clients_warnings_never_reach_another_clients_reply(fresh_worker, tmp_path, monkeypatch):
    """Two clients (key holders both) fit at once on two of the worker's threads: A's fit starts, B's starts, A's
    warns and ends, then B's warns. Each client is warned of its own warning alone: with the process-wide
    ``catch_warnings`` of before, A's warning went to B and B's to the worker's stderr."""
    from sklearn_gpu_bridge.client import connect
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file

    X = np.random.default_rng(0).standard_normal((60, 3))
    a_in, b_in, a_done = (str(tmp_path / name) for name in ("a-in", "b-in", "a-done"))
    clients = {name: connect(read_connection_file(fresh_worker.connection_file)) for name in "AB"}
    heard = []  # (the client's thread, the warning) as each client warns again what its reply carried
    monkeypatch.setattr(warnings, "showwarning", lambda message, *rest: heard.append(
        (threading.current_thread().name, str(message))))
    warnings.simplefilter("always")  # inside the test's own catch_warnings: put back after it

    def fit(name, init):
        clients[name].fit("KMeans", {"n_clusters": 2, "n_init": 1, "init": init}, "fit", [X], {})

    try:
        a = threading.Thread(name="A", target=lambda: (fit("A", _init_that_waits(a_in, b_in, "init of A")),
                                                       open(a_done, "w").close()))
        b = threading.Thread(name="B", target=fit, args=("B", _init_that_waits(b_in, a_done, "init of B")))
        a.start()
        assert wait_until(lambda: os.path.exists(a_in), 30)
        b.start()
        a.join(60)
        b.join(60)
    finally:
        for connection in clients.values():
            connection.close()
    assert sorted(entry for entry in heard if "init of" in entry[1]) == [("A", "init of A"), ("B", "init of B")]
