"""The bridge against cuML in this process, on the GPU machine: the answers issues 13 and 14 promise.

Each check fits the same data through a cuML worker (``GPU*``) and with cuML
here, and records the largest difference (cuML's float32 tolerances), or what
ran where. One JSON; a failed check is recorded, not raised.

    python benchmarks/gpu_checks.py --out benchmarks/results/gpu-h200/gpu-checks.json
"""

import argparse
import json
import pickle
import resource
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import make_blobs, make_classification

import sklearn_gpu_bridge as sgb

CHECKS = {}


def check(function):
    CHECKS[function.__name__] = function
    return function


def _diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


@check
def kmeans_ndarray_init():
    import cuml

    X, _ = make_blobs(20_000, 16, centers=5, random_state=0)
    init = X[:5].copy()
    bridged = sgb.GPUKMeans(n_clusters=5, init=init, n_init=1, max_iter=50).fit(X).cluster_centers_
    direct = cuml.cluster.KMeans(n_clusters=5, init=init, n_init=1, max_iter=50, output_type="numpy").fit(X)
    diff = _diff(bridged, direct.cluster_centers_)
    return {"ok": diff < 1e-3, "max_abs_diff": diff}


@check
def logistic_regression_class_weight():
    import cuml

    X, y = make_classification(5000, 20, n_informative=8, n_classes=3, random_state=1)
    weights = {0: 1.0, 1: 5.0, 2: 1.0}
    bridged = sgb.GPULogisticRegression(class_weight=weights).fit(X, y).predict_proba(X)
    direct = cuml.linear_model.LogisticRegression(class_weight=weights, output_type="numpy").fit(
        X.astype(np.float32), y).predict_proba(X.astype(np.float32))
    diff = _diff(bridged, direct)
    return {"ok": diff < 1e-3, "max_abs_diff": diff}


@check
def gaussian_nb_string_labels():
    from sklearn.naive_bayes import GaussianNB

    X, y = make_classification(3000, 10, random_state=2)
    labels = np.array(["no", "yes"])[y]
    got = sgb.GPUGaussianNB().fit(X, labels).predict(X)
    want = GaussianNB().fit(X, labels).predict(X)
    return {"ok": got.dtype == want.dtype and float((got == want).mean()) > 0.99,
            "dtype": str(got.dtype), "agreement": float((got == want).mean())}


@check
def min_max_scaler_feature_range():
    import cuml

    X = np.random.default_rng(3).standard_normal((5000, 8))
    got = sgb.GPUMinMaxScaler(feature_range=(-1, 1)).fit_transform(X)
    want = cuml.preprocessing.MinMaxScaler(feature_range=(-1, 1), output_type="numpy").fit_transform(
        X.astype(np.float32))
    diff = _diff(got, want)
    return {"ok": diff < 1e-5 and abs(got.min() + 1) < 1e-5 and abs(got.max() - 1) < 1e-5, "max_abs_diff": diff}


@check
def precision_native_is_cuml_in_float64():
    import cuml

    X, y = make_classification(20_000, 20, random_state=4)
    with sgb.config_context(precision="native"):
        got = sgb.GPULogisticRegression().fit(X, y)
        got_coef = got.coef_
    want = cuml.linear_model.LogisticRegression(output_type="numpy").fit(X, y)
    diff = _diff(got_coef, want.coef_)
    with sgb.config_context(precision="float32"):
        narrow = sgb.GPULogisticRegression().fit(X, y).coef_
    return {"ok": diff < 1e-8, "max_abs_diff_native": diff, "max_abs_diff_float32": _diff(narrow, want.coef_)}


@check
def tfidf_1m_by_100k_sparse():
    """1M x 100k at 0.1% (100M values): dense it would be 400 GB in float32; it travels as its arrays."""
    rng = np.random.default_rng(5)
    n, d, per_row = 1_000_000, 100_000, 100
    indptr = np.arange(0, n * per_row + 1, per_row, dtype=np.int64)
    indices = rng.integers(0, d, n * per_row, dtype=np.int32)
    data = rng.random(n * per_row, dtype=np.float32)
    X = sp.csr_matrix((data, indices, indptr), shape=(n, d))
    y = (np.asarray(X[:, :50].sum(axis=1)).ravel() > np.median(np.asarray(X[:, :50].sum(axis=1)))).astype(int)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    connection = sgb.get_connection()
    stats = dict(connection.stats)
    start = time.perf_counter()
    model = sgb.GPULogisticRegression(max_iter=50).fit(X, y)
    seconds = time.perf_counter() - start
    accuracy = float((model.predict(X[:100_000]) == y[:100_000]).mean())
    sent = {k: v - stats.get(k, 0) for k, v in connection.stats.items() if k.startswith("sent_")}
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ok": rss_after - rss_before < 4096, "fit_seconds": seconds, "accuracy_first_100k": accuracy,
            "nnz": int(X.nnz), "arrays_sent_by_fit": sent, "client_peak_rss_mb_before": rss_before,
            "client_peak_rss_mb_after": rss_after, "dense_would_be_gb": n * d * 4 / 1e9}


@check
def in_process_matches_worker():
    """execution="in_process" (a dask-cuda worker's mode) against the worker, on the same data."""
    X, y = make_classification(20_000, 20, random_state=6)
    through = sgb.GPUSVC().fit(X, y).decision_function(X)
    sgb.reset_connection()
    with sgb.config_context(execution="in_process"):
        start = time.perf_counter()
        model = sgb.GPUSVC().fit(X, y)
        here = model.decision_function(X)
        seconds = time.perf_counter() - start
        kind = type(sgb.get_connection()).__name__
        saved = len(pickle.dumps(model))  # its state comes along, as through a worker
    sgb.reset_connection()
    diff = _diff(through, here)
    return {"ok": diff < 1e-3 and kind == "InProcess", "max_abs_diff": diff, "connection": kind,
            "seconds": seconds, "pickled_bytes": saved}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    results = {}
    for name, function in CHECKS.items():
        if args.only and args.only not in name:
            continue
        start = time.perf_counter()
        try:
            results[name] = function()
        except Exception as exc:  # noqa: BLE001 - recorded, the others still run
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-2000:]}
        results[name]["seconds_total"] = time.perf_counter() - start
        print(f"{name:<40} {'ok' if results[name]['ok'] else 'FAILED'}  "
              f"{ {k: v for k, v in results[name].items() if k not in ('traceback', 'ok')} }", flush=True)
    versions = sgb.get_connection().status()["versions"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"versions": versions, "python": sys.version, "checks": results}, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    sgb.reset_connection()


if __name__ == "__main__":
    main()
