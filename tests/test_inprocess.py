"""Execution in this process (inside a dask-cuda worker): the same answers as through a worker, no hop.

The in-process path runs the worker's own backend here. On a machine without
cuML it is exercised with the scikit-learn backend, against a real worker of
the same backend: every result, fitted attribute and saved model must match.
On the GPU machine the same comparison runs with cuML (``gpu`` mark).
"""

import contextlib
import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_classification
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import make_pipeline

import sklearn_gpu_bridge
from sklearn_gpu_bridge import config_context
from sklearn_gpu_bridge.client import Connection
from sklearn_gpu_bridge.client import discovery as client
from sklearn_gpu_bridge.errors import ConfigurationError, ProtocolError
from sklearn_gpu_bridge.estimators import (
    GPUPCA,
    GPUSVC,
    GPUKMeans,
    GPULogisticRegression,
    GPUNearestNeighbors,
    GPUStandardScaler,
)
from sklearn_gpu_bridge.transport.inprocess import InProcessTransport

from .conftest import BACKEND, assert_same

#: a real cuML here (the GPU machine): the tests of a process without one do not apply
REAL_CUML = client._cuml_importable()
without_cuml = pytest.mark.skipif(REAL_CUML, reason="about a process without cuML; this one has it")


def _data():
    X, y = make_classification(300, 8, n_informative=5, n_classes=3, random_state=0)
    return X, y


CASES = [
    ("scaler", lambda: GPUStandardScaler(), lambda m, X, y: m.fit(X).transform(X)),
    ("logreg", lambda: GPULogisticRegression(C=0.5), lambda m, X, y: m.fit(X, y).predict_proba(X)),
    ("svc-ovo", lambda: GPUSVC(), lambda m, X, y: m.fit(X, y).decision_function(X)),
    ("pca", lambda: GPUPCA(n_components=3), lambda m, X, y: m.fit_transform(X)),
    ("kmeans", lambda: GPUKMeans(n_clusters=3, random_state=0, n_init=1), lambda m, X, y: m.fit(X).cluster_centers_),
    ("neighbors", lambda: GPUNearestNeighbors(n_neighbors=4), lambda m, X, y: m.fit(X).kneighbors(X[:20])[1]),
]


@contextlib.contextmanager
def _in_process(backend="sklearn"):
    """This process's connection replaced by the in-process one, then restored."""
    client.reset_connection()
    with client._lock:
        client._connection = Connection(InProcessTransport(backend=backend))
    try:
        yield client._connection
    finally:
        client.reset_connection()


@pytest.fixture
def in_process():
    with _in_process() as connection:
        yield connection


def _through_worker(make, run, X, y):
    client.reset_connection()
    return run(make(), X, y)


@pytest.mark.skipif(BACKEND != "sklearn", reason="compares with a scikit-learn worker; the gpu test below, cuML's")
@pytest.mark.parametrize("name,make,run", CASES, ids=[c[0] for c in CASES])
def test_in_process_answers_as_the_worker_does(name, make, run):
    X, y = _data()
    expected = _through_worker(make, run, X, y)
    with _in_process():
        got = run(make(), X, y)
        assert isinstance(client.get_connection().transport, InProcessTransport)
    assert type(got) is type(expected) and got.dtype == expected.dtype
    assert_same(got, expected)


def test_in_process_models_pickle_and_predict_anywhere(in_process, tmp_path):
    """A model fitted in process carries the same portable state: saved, it predicts in a fresh
    process with no worker and no cuML."""
    X, y = _data()
    model = make_pipeline(GPUStandardScaler(), GPUSVC()).fit(X, y)
    joblib.dump((model, X), tmp_path / "model.joblib")
    code = textwrap.dedent("""
        import sys, warnings
        sys.modules["cuml"] = None
        import joblib, sklearn_gpu_bridge
        sklearn_gpu_bridge.set_config(connection_file=sys.argv[2], start_local_worker=False, cpu_fallback=True)
        warnings.simplefilter("ignore")
        model, X = joblib.load(sys.argv[1])
        joblib.dump(model.predict(X), sys.argv[1] + ".out")
    """)
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "model.joblib"), str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    np.testing.assert_array_equal(joblib.load(tmp_path / "model.joblib.out"), model.predict(X))


def test_in_process_sparse_and_text(in_process):
    docs = ["the cat sat", "the dog sat", "a cat ran", "a dog ran"] * 20
    labels = np.array([0, 1, 0, 1] * 20)
    model = make_pipeline(TfidfVectorizer(), GPULogisticRegression()).fit(docs, labels)
    assert (model.predict(docs) == labels).mean() > 0.9


def test_in_process_refuses_what_the_worker_refuses(in_process):
    X, _ = make_blobs(50, 4, random_state=0)
    with pytest.raises(AttributeError, match="no method"):
        in_process.call(in_process.fit("KMeans", {"n_clusters": 2}, "fit", [X], {}).handle, "__reduce__", [], {})
    with pytest.raises(AttributeError, match="public fitted attribute"):
        in_process.attribute(in_process.fit("KMeans", {"n_clusters": 2}, "fit", [X], {}).handle, "__dict__")
    with pytest.raises(ProtocolError, match="not a fitting method"):
        in_process.fit("KMeans", {}, "predict", [X], {})


def test_in_process_inputs_are_not_kept_by_reference(in_process):
    """A CPU model that keeps its input (neighbors) keeps a copy: the caller's array may change after."""
    X, _ = make_blobs(60, 3, random_state=1)
    model = GPUNearestNeighbors(n_neighbors=2).fit(X)
    query = X[:5].copy()
    before = model.kneighbors(query)[1]
    X[:] = 0
    np.testing.assert_array_equal(model.kneighbors(query)[1], before)


def test_execution_mode_setting():
    assert sklearn_gpu_bridge.execution_mode() == {"mode": "worker", "reason": "not in a Dask worker", "gpu": None}
    with config_context(execution="worker"):
        assert sklearn_gpu_bridge.execution_mode()["mode"] == "worker"
    with config_context(execution="in_process"):
        assert sklearn_gpu_bridge.execution_mode()["mode"] == "in_process"
    with config_context(execution="gpu"):
        with pytest.raises(ConfigurationError, match="choose one of"):
            sklearn_gpu_bridge.execution_mode()


def test_forcing_in_process_without_cuml_says_so():
    from sklearn_gpu_bridge.client.discovery import _cuml_importable

    if _cuml_importable():
        pytest.skip("cuML is importable here")
    client.reset_connection()
    try:
        with config_context(execution="in_process"):
            with pytest.raises(ConfigurationError, match="cuML in this process .* is not usable"):
                GPUStandardScaler().fit(np.ones((4, 2)))
    finally:
        client.reset_connection()


@without_cuml
def test_a_dask_worker_without_cuml_goes_through_a_bridge_worker():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as dask:
        mode = dask.submit(sklearn_gpu_bridge.execution_mode, pure=False).result()
    assert mode["mode"] == "worker" and "has no cuML" in mode["reason"]


@pytest.mark.gpu
def test_cuml_in_process_answers_as_a_cuml_worker():
    """On the GPU machine: cuML in this process gives what a cuML worker gives (cuML's float32 tolerances)."""
    pytest.importorskip("cuml")
    X, y = _data()
    for name, make, run in CASES:
        expected = _through_worker(make, run, X, y)
        with _in_process("cuml"):
            got = run(make(), X, y)
        if name == "neighbors":
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.gpu
def test_cuml_in_process_keeps_the_device_memory_its_process_chose(tmp_path):
    """The worker's ``device_memory`` is the worker's: cuML run in a user's own process (a Dask worker's, here
    forced) allocates from whatever resource that process set, before and after a call."""
    code = textwrap.dedent("""
        import numpy as np, rmm, sklearn_gpu_bridge
        rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), 1 << 26))
        sklearn_gpu_bridge.set_config(execution="in_process")
        sklearn_gpu_bridge.GPUStandardScaler().fit_transform(np.ones((100, 3)))
        print(type(rmm.mr.get_current_device_resource()).__name__)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == "PoolMemoryResource"


@without_cuml
def test_the_cuml_alias_is_not_taken_for_cuml(tmp_path):
    """A process with the alias enabled (and no real cuML) still goes through a bridge worker in Dask."""
    code = textwrap.dedent("""
        import sys
        sys.modules.pop("cuml", None)
        import sklearn_gpu_bridge.accel.cuml_alias as alias; alias.enable()
        import cuml
        from sklearn_gpu_bridge.client import discovery
        print(cuml.__sklearn_gpu_bridge__, discovery._cuml_importable())
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"]


@without_cuml
def test_a_worker_in_an_environment_with_the_alias_runs_scikit_learn_not_the_alias(tmp_path):
    """`alias install` in the worker's environment must not make the worker call itself through the alias."""
    code = textwrap.dedent("""
        import sklearn_gpu_bridge.accel.cuml_alias as alias; alias.enable()
        from sklearn_gpu_bridge.worker.backends import make_backend
        backend, reason = make_backend("auto")
        print(backend.name, "alias" in reason)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["sklearn", "True"]
