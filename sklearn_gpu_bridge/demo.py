"""The demo: a Pipeline tuned by GridSearchCV through the bridge, next to scikit-learn.

Runs on whatever worker is configured, or on a local worker started for it
(cuML when importable, otherwise scikit-learn on CPU), and says which.
"""

import tempfile
import time
import warnings
from pathlib import Path

import joblib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from .client import get_connection
from .config import get_config
from .estimators import GPUPCA, GPUSVC, GPUStandardScaler
from .manage.local_worker import is_warm_local_worker

GRID = {"svm__C": [1, 10, 100], "svm__gamma": ["scale", 0.005]}


def _timed(repeats, work):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def run_demo(repeats=3, echo=print):
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    echo(f"digits: {X_train.shape[0]} training and {X_test.shape[0]} test images of {X.shape[1]} pixels")

    start = time.perf_counter()
    with warnings.catch_warnings():  # said once below, in the demo's words
        warnings.filterwarnings("ignore", message=".*running on scikit-learn", category=RuntimeWarning)
        connection = get_connection()
    status = connection.status()
    versions = status["versions"]
    echo(f"worker: backend {status['backend']} at {status['address']} (ready in "
         f"{time.perf_counter() - start:.2f} s); " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    echo(f"arrays travel through: {'the shared-memory pool' if connection.pool else 'ZeroMQ frames'}")
    if status["backend"] != "cuml":
        echo("note: no cuML here, so the worker runs scikit-learn on the CPU (same protocol); "
             "the GPU needs a worker with cuML: sklearn-gpu-bridge doctor")

    bridged = Pipeline([("sc", GPUStandardScaler()), ("pca", GPUPCA(n_components=40)), ("svm", GPUSVC())])
    direct = Pipeline([("sc", StandardScaler()), ("pca", PCA(n_components=40)),
                       ("svm", SVC(cache_size=1024, decision_function_shape="ovo"))])
    rows = []
    for label, pipe in (("bridge", bridged), ("scikit-learn in process", direct)):
        seconds, search = _timed(repeats, lambda p=pipe: GridSearchCV(p, GRID, cv=3).fit(X_train, y_train))
        rows.append((label, seconds, search.best_params_, search.score(X_test, y_test)))
    echo(f"\nGridSearchCV, {len(GRID['svm__C']) * len(GRID['svm__gamma'])} candidates x 3 folds, "
         f"median of {repeats}:")
    for label, seconds, params, accuracy in rows:
        echo(f"  {label:<24} {seconds:7.3f} s   best {params}   test accuracy {accuracy:.4f}")

    best = GridSearchCV(bridged, GRID, cv=3).fit(X_train, y_train).best_estimator_
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.joblib"
        joblib.dump(best, path)
        same = np.array_equal(joblib.load(path).predict(X_test), best.predict(X_test))
        echo(f"\njoblib.dump / joblib.load of the best pipeline: {path.stat().st_size} bytes, "
             f"same predictions after loading: {same}")
    echo(f"transport: {dict(connection.stats)}")
    if is_warm_local_worker(getattr(connection.transport, "connection_file", None)):
        idle = get_config()["local_worker_idle"]
        echo(f"\nthe local worker (pid {connection.info.pid}) stays warm for {idle / 60:.0f} min after this, for your "
             "next script; sklearn-gpu-bridge status shows it, sklearn-gpu-bridge stop ends it")
