"""Load: many processes and threads on one worker, and a long soak of fit/predict/release cycles.

The default run is small enough for CI; the full sizes run with ``-m slow``
(docs/reliability.md records their figures and the command).

- Concurrency: P processes x T threads x N random calls (random estimator,
  shape, dtype and memory layout) on one worker with several executor
  threads. Every result is compared with scikit-learn run in the calling
  process; every pool lease taken in every process is checked against all
  leases alive at that moment (no slot is ever held twice); every wait has a
  timeout, so a deadlock fails instead of hanging.
- Soak: fit, predict, drop the wrapper (its handle is released), many times;
  the worker's resident memory must end within 10% of where it was after a
  warm-up, its registry empty, and no pool file of the client left behind.
"""

import gc
import glob
import multiprocessing
import os
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUPCA, GPUSVC, GPUKMeans, GPULogisticRegression, GPUStandardScaler

from .conftest import BACKEND, WorkerProcess, assert_ulps, record, use_worker
from .test_bad_input import _oracle

pytestmark = pytest.mark.skipif(BACKEND != "sklearn", reason="exact comparison with scikit-learn: CPU backend")

RESULT_TIMEOUT = 600


def worker_rss(pid):
    """Resident memory of process ``pid`` in bytes (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def busy_worker(tmp_path_factory, worker):
    """A worker of this module alone, running two estimator calls at once."""
    process = WorkerProcess(tmp_path_factory.mktemp("load"), threads=2)
    yield process
    sklearn_gpu_bridge.reset_connection()
    process.stop()
    use_worker(worker)


# ---------------------------------------------------------------- random calls, checked


SVD_ULPS = 4096  # see _assert_equal


def _random_input(rng):
    n_samples = int(rng.choice([12, 40, 150, 600, 1500]))  # 1500 x 20 float64 = 240 KB: the pool
    n_features = int(rng.integers(2, 21))
    dtype = rng.choice(["float64", "float32", "int64", "bool"])
    X = rng.standard_normal((n_samples, n_features)) * rng.uniform(0.1, 10, n_features)
    X = (X > 0) if dtype == "bool" else (X * 10).astype(dtype) if dtype == "int64" else X.astype(dtype)
    layout = rng.choice(["C", "F", "strided"])
    if layout == "F":
        X = np.asfortranarray(X)
    elif layout == "strided":
        X = np.repeat(X, 2, axis=1)[:, ::2]
    labels = [np.array([0, 1, 2]), np.array(["x", "y"]), np.array([-1.0, 7.0])][rng.integers(3)]
    y = labels[rng.integers(0, len(labels), n_samples)]
    y[: len(labels)] = labels  # every class present
    return X, y


def _case(rng):
    """(wrapper, the scikit-learn estimator the worker builds for it, methods) for a random estimator."""
    kind = rng.choice(["scaler", "pca", "logistic", "svc", "kmeans"])
    if kind == "scaler":
        wrapper, methods = GPUStandardScaler(), ["transform", "inverse_transform"]
    elif kind == "pca":
        wrapper, methods = GPUPCA(n_components=2), ["transform"]
    elif kind == "logistic":
        wrapper, methods = GPULogisticRegression(C=float(rng.choice([0.1, 1.0, 10.0]))), ["predict", "predict_proba"]
    elif kind == "svc":
        wrapper, methods = GPUSVC(C=float(rng.choice([0.5, 1.0]))), ["predict", "decision_function"]
    else:
        wrapper, methods = GPUKMeans(n_clusters=3, random_state=0, n_init=1), ["predict", "transform"]
    return wrapper, _oracle(wrapper), methods


def _check_call(rng):
    wrapper, twin, methods = _case(rng)
    X, y = _random_input(rng)
    X_test = X[: max(3, len(X) // 3)]
    wrapper.fit(X, y)
    twin.fit(X, y)
    previous = None
    for method in methods:
        argument = previous if method == "inverse_transform" else X_test
        got, expected = getattr(wrapper, method)(argument), getattr(twin, method)(argument)
        assert got.shape == expected.shape and got.dtype == expected.dtype, (method, got.dtype, expected.dtype)
        _assert_equal(got, expected, f"{type(wrapper).__name__}.{method}",
                      ulps=SVD_ULPS if isinstance(wrapper, GPUPCA) else 64)
        previous = got
    return 1 + len(methods)


def _assert_equal(got, expected, what, ulps=64):
    """Labels exactly; floats to the last few units in the last place.

    The fit on the worker is bit for bit scikit-learn's (same input bytes), but
    where the wrapper hands the worker a different layout or dtype than the
    user's (a strided view sent contiguous, int64 validated to float64, as
    scikit-learn's own fit does), scikit-learn's predict takes another BLAS
    path on the worker than on the raw input, and rounds differently. PCA's
    components come out of an SVD, whose LAPACK path follows the layout and
    the threads BLAS uses: its projections differ by hundreds of units in the
    last place (``SVD_ULPS``; 9e-12 relative, 1000 x 2, under this test's load).
    """
    assert_ulps(got, expected, ulps=ulps, err_msg=what)


class BlockWatch:
    """Checks, in this process, that no pool slot is ever in two blocks at once."""

    def __init__(self):
        from sklearn_gpu_bridge.shm import pool as pool_module

        self.module = pool_module
        self.live = {}
        self.lock = threading.Lock()
        self.leases = 0
        self.overlaps = []
        lease, release = pool_module.Pool.allocate, pool_module.Block.release
        watch = self

        def watched_lease(pool, nbytes):
            taken = lease(pool, nbytes)
            with watch.lock:
                watch.leases += 1
                for slot in range(taken.start, taken.start + taken.count):
                    key = (id(pool), taken.segment, slot)
                    if key in watch.live:
                        watch.overlaps.append(key)
                    watch.live[key] = id(taken)
            return taken

        def watched_release(taken):
            watch.forget(taken, taken.start, taken.count)  # before the slots are free again
            release(taken)

        pool_module.Pool.allocate = watched_lease
        pool_module.Block.release = watched_release

    def forget(self, taken, start, count):
        with self.lock:
            for slot in range(start, start + count):
                key = (id(taken._pool), taken.segment, slot)
                if self.live.get(key) == id(taken):
                    del self.live[key]


def _client_process(connection_file, seed, threads, calls):
    """One spawned process: ``threads`` threads x ``calls`` checked random calls; returns its counts."""
    warnings.simplefilter("ignore")  # ConvergenceWarning and the like, on both sides alike
    watch = BlockWatch()
    sklearn_gpu_bridge.set_config(connection_file=connection_file, start_local_worker=False)
    try:
        connection = sklearn_gpu_bridge.get_connection()
        pool_paths = connection.pool.paths if connection.pool is not None else []

        def thread(index):
            rng = np.random.default_rng([seed, index])
            return sum(_check_call(rng) for _ in range(calls))

        with ThreadPoolExecutor(threads) as executor:
            requests = sum(f.result(timeout=RESULT_TIMEOUT) for f in [executor.submit(thread, i)
                                                                      for i in range(threads)])
        gc.collect()
        stats = dict(connection.stats)
        pool_paths = connection.pool.paths if connection.pool is not None else []
        return {"pid": os.getpid(), "calls": threads * calls, "requests": requests, "leases": watch.leases,
                "overlaps": watch.overlaps, "stats": stats, "pool_paths": pool_paths}
    finally:
        sklearn_gpu_bridge.reset_connection()


def _run_load(worker, processes, threads, calls):
    use_worker(worker)
    connection = sklearn_gpu_bridge.get_connection()
    before = connection.status()
    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as executor:
        futures = [executor.submit(_client_process, str(worker.connection_file), seed, threads, calls)
                   for seed in range(processes)]
        reports = [f.result(timeout=RESULT_TIMEOUT) for f in futures]
    took = time.monotonic() - started
    after = connection.status()
    assert all(not r["overlaps"] for r in reports), [r["overlaps"][:5] for r in reports]
    assert sum(r["calls"] for r in reports) == processes * threads * calls
    assert sum(r["stats"].get("sent_pool", 0) for r in reports) > 0  # the pool really was used
    assert after["handles"] == before["handles"]  # every child's handles released (goodbye)
    assert after["pid"] == before["pid"] and after["clients"] == before["clients"]
    for report in reports:
        assert not [p for p in report["pool_paths"] if os.path.exists(p)]
        assert not glob.glob(f"/dev/shm/sgb-pool-{report['pid']}-*")
    record("load", processes=processes, threads=threads, calls_per_thread=calls,
           calls=sum(r["calls"] for r in reports), requests=sum(r["requests"] for r in reports),
           leases_checked=sum(r["leases"] for r in reports), seconds=round(took, 1),
           worker_requests=sum(after["requests"].get(op, 0) - before["requests"].get(op, 0)
                               for op in ("fit", "call", "get_state", "set_state", "attribute")))


def test_load_processes_threads_random_calls(busy_worker):
    _run_load(busy_worker, processes=4, threads=4, calls=20)


@pytest.mark.slow
def test_load_full_size(busy_worker):
    _run_load(busy_worker, processes=4, threads=4, calls=200)


# ---------------------------------------------------------------- soak


def _soak(worker, cycles):
    use_worker(worker)
    connection = sklearn_gpu_bridge.get_connection()
    rng = np.random.default_rng(0)
    classes = [GPULogisticRegression, GPUStandardScaler, GPUKMeans]

    def cycle(i):
        n = int(rng.choice([50, 500, 3000]))  # 3000 x 10 float64 = 240 KB: the pool
        X = rng.standard_normal((n, 10))
        y = (X[:, 0] + rng.normal(0, 0.5, n) > 0).astype(int)
        cls = classes[i % len(classes)]
        model = cls(n_clusters=2, n_init=1, random_state=0) if cls is GPUKMeans else cls()
        model.fit(X, y)
        out = model.predict(X[:20]) if hasattr(model, "predict") else model.transform(X[:20])
        assert len(out) == 20
        # the wrapper dies here: its handle goes with the next request

    warm = max(50, cycles // 10)
    for i in range(warm):
        cycle(i)
    gc.collect()
    start_rss = worker_rss(worker.process.pid)
    checkpoints = []
    started = time.monotonic()
    for i in range(warm, warm + cycles):
        cycle(i)
        if (i - warm + 1) % max(1, cycles // 5) == 0:
            checkpoints.append(worker_rss(worker.process.pid))
    took = time.monotonic() - started
    gc.collect()
    status = connection.status()  # carries the last releases
    status = connection.status()
    end_rss = worker_rss(worker.process.pid)
    pool_paths = connection.pool.paths
    sklearn_gpu_bridge.reset_connection()  # goodbye: pool files removed
    growth = (end_rss - start_rss) / start_rss
    record("soak", cycles=cycles, seconds=round(took, 1), rss_start_mb=round(start_rss / 2**20, 1),
           rss_end_mb=round(end_rss / 2**20, 1), growth_percent=round(100 * growth, 2),
           checkpoints_mb=[round(c / 2**20, 1) for c in checkpoints], handles_at_end=status["handles"])
    assert status["handles"] == 0, status
    assert abs(growth) < 0.10, (start_rss, end_rss, checkpoints)
    assert not [p for p in pool_paths if os.path.exists(p)]
    assert not glob.glob(f"/dev/shm/sgb-pool-{os.getpid()}-*")


@pytest.fixture
def soak_worker(tmp_path, worker):
    process = WorkerProcess(tmp_path)
    yield process
    sklearn_gpu_bridge.reset_connection()
    process.stop()
    use_worker(worker)


def test_soak_fit_predict_release(soak_worker):
    _soak(soak_worker, cycles=300)


@pytest.mark.slow
def test_soak_full_size(soak_worker):
    _soak(soak_worker, cycles=5000)
