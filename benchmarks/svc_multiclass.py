"""Multiclass SVC with scikit-learn's answers on a cuML worker (worker/multiclass_svc.py), against scikit-learn.

Prints, on digits (10 classes, 1797 x 64; fitted on 1347 rows, asked on the 450 others and on all 1797):
1. for decision_function_shape "ovr" and "ovo": GPUSVC(multiclass="sklearn") (cuML's binary SVCs, one per pair,
   on the worker's GPU) against scikit-learn's SVC: the fraction of equal predictions, the max abs difference
   of decision_function, and of the model's portable form (sklearn_model_, scikit-learn's own SVC class);
2. the same pairs fitted by cuML in this process (SklearnSVC around cuml.svm.SVC, no bridge): max abs
   difference of its decision values from the bridge's (the transport should change nothing);
3. seconds of fit + predict (median of 3, after a warm-up): the bridge, scikit-learn on this CPU, the pairs
   with cuML in this process, and cuML's own multiclass SVC in process (its OneVsOneClassifier: other answers);
4. accel, installed in this process: GridSearchCV(SVC(), C in [0.5, 1, 5], cv=3) on digits: how many SVC fits
   ran on the worker and on the CPU (accel's report), best C and score against the same search in plain
   scikit-learn, and accel's table.

Run with PYTHONPATH holding cuML and this package: python benchmarks/svc_multiclass.py
"""

import statistics
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.svm import SVC

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC

sklearn_gpu_bridge.set_config(local_backend="cuml")

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0, stratify=y)


def seconds(make, dtype=np.float64, repeat=3):
    """Median seconds of fit(X_train) + predict(X_test), after one warm-up (X in ``dtype``: the bridge sends
    float32 to a cuML worker; cuML in this process gets float32 too)."""
    fit, ask = X_train.astype(dtype), X_test.astype(dtype)
    make().fit(fit, y_train).predict(ask)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        make().fit(fit, y_train).predict(ask)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process_pairs(shape):
    """The worker's algorithm with cuML's SVC in this process, without the bridge."""
    import cuml

    from sklearn_gpu_bridge.worker.multiclass_svc import SklearnSVC

    params = {"decision_function_shape": shape}
    return SklearnSVC(cuml.svm.SVC(**params), params)


print(f"sklearn-gpu-bridge {sklearn_gpu_bridge.__version__}; worker: "
      f"{sklearn_gpu_bridge.get_connection().capabilities.backend} backend")

# 1-2. answers
for shape in ("ovr", "ovo"):
    direct = SVC(decision_function_shape=shape).fit(X_train, y_train)
    bridged = GPUSVC(multiclass="sklearn", decision_function_shape=shape).fit(X_train, y_train)
    portable = bridged.sklearn_model_
    pairs = in_process_pairs(shape).fit(X_train.astype(np.float32), y_train)
    for name, data in (("test", X_test), ("all", X)):
        expected, expected_dec = direct.predict(data), direct.decision_function(data)
        got, dec = bridged.predict(data), bridged.decision_function(data)
        print(f"[{shape}] {name:4s} ({len(data)} rows): predictions equal to scikit-learn's "
              f"{(got == expected).mean():.4f}; max |decision - scikit-learn's| {np.abs(dec - expected_dec).max():.3g} "
              f"(of values up to {np.abs(expected_dec).max():.3g}); portable form: predictions equal "
              f"{(portable.predict(data) == expected).mean():.4f}, max |decision - bridge's| "
              f"{np.abs(portable.decision_function(data) - dec).max():.3g}; cuML pairs in process: max |decision - "
              f"bridge's| {np.abs(pairs.decision_function(data.astype(np.float32)) - dec).max():.3g}")
    print(f"[{shape}] portable form: {type(portable).__module__}.{type(portable).__name__}, "
          f"{len(portable.support_)} support vectors (scikit-learn's: {len(direct.support_)}), accuracy on test "
          f"bridge {bridged.score(X_test, y_test):.4f} / scikit-learn {direct.score(X_test, y_test):.4f}")

# 3. speed
import cuml  # noqa: E402

timings = {
    "bridge GPUSVC(multiclass='sklearn')": seconds(lambda: GPUSVC(multiclass="sklearn", decision_function_shape="ovr")),
    "scikit-learn SVC (this CPU)": seconds(lambda: SVC()),
    "cuML pairs in process (SklearnSVC)": seconds(lambda: in_process_pairs("ovr"), np.float32),
    "cuML's own multiclass SVC in process": seconds(lambda: cuml.svm.SVC(), np.float32),
}
for name, value in timings.items():
    print(f"fit + predict, digits 1347 + 450 rows: {name:40s} {value * 1000:8.1f} ms")

# 4. accel: a grid search over SVC, every fit on the worker
from sklearn_gpu_bridge import accel  # noqa: E402
from sklearn_gpu_bridge.accel import report  # noqa: E402

grid = {"C": [0.5, 1.0, 5.0]}
start = time.perf_counter()
plain = GridSearchCV(SVC(), grid, cv=3).fit(X, y)
plain_s = time.perf_counter() - start
accel.install()
report.reset()
start = time.perf_counter()
served = GridSearchCV(SVC(), grid, cv=3).fit(X, y)
served_s = time.perf_counter() - start
calls = report.calls()
table = accel.report_table()
accel.uninstall()
fits = calls.get("SVC.fit", {"worker": 0, "cpu": 0})
print(f"accel GridSearchCV(SVC(), C in {grid['C']}, cv=3) on digits: SVC.fit on the worker {fits['worker']}, "
      f"on the CPU {fits['cpu']} (of {3 * 3 + 1}); reasons: {sorted(fits.get('reasons', {})) or 'none'}")
print(f"  best C {served.best_params_['C']} score {served.best_score_:.4f} in {served_s:.2f} s; plain scikit-learn: "
      f"best C {plain.best_params_['C']} score {plain.best_score_:.4f} in {plain_s:.2f} s; mean test scores "
      f"{np.round(served.cv_results_['mean_test_score'], 4).tolist()} vs "
      f"{np.round(plain.cv_results_['mean_test_score'], 4).tolist()}")
print(table)
