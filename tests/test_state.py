"""Fitted models that travel: no worker at all, a restarted worker, thousands of fits.

- ``cpu_fallback``: a fitted model that can reach no worker raises
  WorkerUnavailable naming the option (default), or answers with the
  scikit-learn model it carries, with a RuntimeWarning. A fit never falls back.
- ``state_sync="eager"``: the state is on the client right after fit, so a
  model outlives its worker; with the default "lazy" a model whose worker is
  gone before its state was copied says so, and how to avoid it.
- A GridSearchCV of 500 fits leaves the worker's registry where it started.
"""

import gc
import os
import pickle
import time

import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification
from sklearn.model_selection import GridSearchCV

import sklearn_gpu_bridge
from sklearn_gpu_bridge import (
    GPULogisticRegression,
    GPURandomForestClassifier,
    GPURidge,
    GPUStandardScaler,
)
from sklearn_gpu_bridge.errors import WorkerUnavailable
from sklearn_gpu_bridge.estimators.base import StateLost

from .conftest import BACKEND, WorkerProcess, assert_ulps, use_worker

X, Y = load_iris(return_X_y=True)
LABELS = np.array(["setosa", "versicolor", "virginica"])[Y]


@pytest.fixture
def no_worker(tmp_path, worker):
    """Point this process at a worker that does not exist (and start none)."""
    sklearn_gpu_bridge.reset_connection()
    sklearn_gpu_bridge.set_config(connection_file=str(tmp_path / "absent.json"), start_local_worker=False)
    yield
    sklearn_gpu_bridge.set_config(cpu_fallback=None)
    use_worker(worker)


def _fitted_pickles():
    classifier = GPULogisticRegression().fit(X, LABELS)
    scaler = GPUStandardScaler().fit(X)
    expected = {
        "predict": classifier.predict(X), "predict_proba": classifier.predict_proba(X),
        "transform": scaler.transform(X), "inverse_transform": scaler.inverse_transform(X),
    }
    return pickle.dumps(classifier), pickle.dumps(scaler), expected


def test_cpu_fallback_is_off_by_default():
    assert sklearn_gpu_bridge.get_config()["cpu_fallback"] is False
    assert sklearn_gpu_bridge.get_config()["state_sync"] == "lazy"


def test_loaded_model_without_worker_raises_by_default(worker, no_worker):
    use_worker(worker)
    blobs = _fitted_pickles()
    sklearn_gpu_bridge.reset_connection()
    sklearn_gpu_bridge.set_config(connection_file=str(worker.log_file.parent / "absent.json"))
    classifier = pickle.loads(blobs[0])
    with pytest.raises(WorkerUnavailable, match=r"cpu_fallback=True.*SKLEARN_GPU_BRIDGE_CPU_FALLBACK"):
        classifier.predict(X)
    assert classifier.coef_.shape == (3, 4)  # fitted attributes are local all the same


def test_loaded_model_without_worker_answers_on_cpu_when_allowed(worker, no_worker):
    use_worker(worker)
    classifier_blob, scaler_blob, expected = _fitted_pickles()
    sklearn_gpu_bridge.reset_connection()
    sklearn_gpu_bridge.set_config(connection_file=str(worker.log_file.parent / "absent.json"),
                                  cpu_fallback=True)
    classifier, scaler = pickle.loads(classifier_blob), pickle.loads(scaler_blob)
    with pytest.warns(RuntimeWarning, match="on the CPU"):
        predicted = classifier.predict(X)
    np.testing.assert_array_equal(predicted, expected["predict"])  # user labels, not codes
    with pytest.warns(RuntimeWarning):
        proba = classifier.predict_proba(X)
    with pytest.warns(RuntimeWarning):
        scaled = scaler.transform(X)
    with pytest.warns(RuntimeWarning):
        restored = scaler.inverse_transform(X)
    if BACKEND == "sklearn":  # the CPU answer is the backend's own model: exactly the same
        assert_ulps(proba, expected["predict_proba"])
        assert_ulps(scaled, expected["transform"])
        assert_ulps(restored, expected["inverse_transform"])
    else:  # cuML's float32 answer vs scikit-learn's float64 one on the same fitted state
        np.testing.assert_allclose(proba, expected["predict_proba"], atol=1e-3)
        np.testing.assert_allclose(scaled, expected["transform"], rtol=1e-4, atol=1e-4)


def test_a_fit_never_falls_back(no_worker):
    sklearn_gpu_bridge.set_config(cpu_fallback=True)
    with pytest.raises(WorkerUnavailable):
        GPULogisticRegression().fit(X, Y)


def test_eager_state_survives_a_worker_restart(tmp_path, fresh_worker):
    with sklearn_gpu_bridge.config_context(state_sync="eager"):
        classifier = GPULogisticRegression().fit(X, LABELS)
        scaler = GPUStandardScaler().partial_fit(X[:70]).partial_fit(X[70:])
    assert "_sklearn_model" in classifier.__dict__ or "_backend_state" in classifier.__dict__
    expected = classifier.predict_proba(X), scaler.transform(X)
    status = sklearn_gpu_bridge.get_connection().status()
    assert status["requests"]["get_state"] >= 3  # one per fit (and per partial_fit)
    fresh_worker.stop()
    (tmp_path / "second").mkdir()
    replacement = WorkerProcess(tmp_path / "second")
    try:
        use_worker(replacement)
        same = assert_ulps if BACKEND == "sklearn" else \
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # via as_sklearn()
        same(classifier.predict_proba(X), expected[0])
        same(scaler.transform(X), expected[1])
        assert sklearn_gpu_bridge.get_connection().status()["requests"]["set_state"] == 2
    finally:
        sklearn_gpu_bridge.reset_connection()
        replacement.stop()


def test_lazy_state_lost_with_its_worker_says_how_to_keep_it(tmp_path, fresh_worker):
    classifier = GPULogisticRegression().fit(X, Y)
    fresh_worker.stop()
    (tmp_path / "second").mkdir()
    replacement = WorkerProcess(tmp_path / "second")
    try:
        use_worker(replacement)
        with pytest.raises(StateLost, match="state_sync='eager'"):
            classifier.predict(X)
        with pytest.raises(StateLost):
            classifier.coef_  # noqa: B018 - the read is the test
    finally:
        sklearn_gpu_bridge.reset_connection()
        replacement.stop()


def test_state_sync_is_checked():
    with sklearn_gpu_bridge.config_context(state_sync="sometimes"), pytest.raises(ValueError, match="state_sync"):
        GPUStandardScaler().fit(X)


def _rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_grid_search_of_500_fits_leaves_the_registry_where_it_started(worker, connection):
    X_small, y_small = make_classification(n_samples=60, n_features=4, random_state=0)
    gc.collect()
    before = connection.status()
    rss_before = _rss_bytes(worker.process.pid) if os.path.exists("/proc") else 0
    search = GridSearchCV(GPURidge(), {"alpha": np.logspace(-3, 3, 100)}, cv=5, refit=False)
    search.fit(X_small, y_small)
    assert len(search.cv_results_["mean_test_score"]) == 100
    gc.collect()
    connection.status()  # carries the releases of the last wrappers
    after = connection.status()
    assert after["requests"]["fit"] - before["requests"].get("fit", 0) == 500
    assert after["handles"] == before["handles"]
    assert after["requests"].get("get_state", 0) == before["requests"].get("get_state", 0)  # lazy: none
    if rss_before:
        assert _rss_bytes(worker.process.pid) - rss_before < 50 * 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SKLEARN_GPU_BRIDGE_MEASURE"),
                    reason="a measurement, not a test: set SKLEARN_GPU_BRIDGE_MEASURE=1 to run it")
def test_measure_state_transfer(connection, capsys):
    """Not an assertion of speed: prints the figures docs/estimators.md quotes.

    SKLEARN_GPU_BRIDGE_MEASURE=1 python -m pytest -s tests/test_state.py -k measure
    """
    import cloudpickle

    X_big, y_big = make_classification(n_samples=20000, n_features=20, n_informative=10, random_state=0)
    lines = []
    for label, model in [
        ("RandomForestClassifier(100 trees, max_depth=16) 20000x20",
         GPURandomForestClassifier(n_estimators=100, max_depth=16, random_state=0)),
        ("RandomForestClassifier(100 trees, max_depth=None) 20000x20",
         GPURandomForestClassifier(n_estimators=100, max_depth=None, random_state=0)),
        ("LogisticRegression 20000x20", GPULogisticRegression()),
        ("StandardScaler 20000x20", GPUStandardScaler()),
    ]:
        start = time.perf_counter()
        model.fit(X_big, y_big) if model._target else model.fit(X_big)
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        fmt, backend, blob = connection.get_state(model._remote.handle)  # what _pull_state does
        state = cloudpickle.loads(blob)
        pull_s = time.perf_counter() - start
        start = time.perf_counter()
        connection.set_state(model._remote_name, fmt, cloudpickle.dumps(state))  # what a push does
        push_s = time.perf_counter() - start
        lines.append(f"{label} [{backend}]: fit {fit_s:.3f} s, state {len(blob) / 1e6:.2f} MB ({fmt}), "
                     f"pull {pull_s:.3f} s, push {push_s:.3f} s")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
