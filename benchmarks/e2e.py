"""The bridge against in-process cuML and scikit-learn, case by case, in one run.

Each case runs three ways on the same data: scikit-learn in this process (all
CPU cores where the class has ``n_jobs``), cuML in this process, and the
``GPU*`` wrapper through a cuML worker that this script starts. The ways of a
case run in turn, round by round, and each records the median of its calls.
Small cases are timed twice, a row each: after a ``gc.collect()`` before every
call, and as ``timeit`` times (the collector off, calls back to back). Also:
GridSearchCV over a Pipeline with ``n_jobs`` 1, 4 and -1, as users meet it (fresh processes:
the first fit of a script, one search with ``n_jobs``), start-up (worker
start to ready, then the first call), 5-fold accuracies on scikit-learn's
small datasets, and worker memory over many fit/predict/release cycles.

    python benchmarks/e2e.py --parts cases --out benchmarks/results/gpu-h200/e2e-table.json   # GPU machine
    python benchmarks/e2e.py --backend sklearn --quick --out benchmarks/results/cpu/e2e-quick.json  # anywhere
    python benchmarks/e2e.py --markdown benchmarks/results/gpu-h200/e2e-table.json   # the README's table

Without cuML (``--backend sklearn``) the "cuML in process" column is empty
and the bridge runs scikit-learn: that measures the bridge, not a GPU.
"""

import argparse
import gc
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from sklearn import cluster, datasets, decomposition, ensemble, linear_model, neighbors, preprocessing, svm
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline

import sklearn_gpu_bridge
from sklearn_gpu_bridge.manage.launcher import LaunchedWorker


@dataclass
class Case:
    name: str
    shape: tuple  # (n_samples, n_features)
    sklearn: object  # (**params) -> scikit-learn estimator
    cuml: str  # "module.Class" of cuML
    bridge: str  # name in sklearn_gpu_bridge
    params: dict  # given to all three
    run: object  # (estimator, X, y) -> result
    classes: int = 0  # 0: no y; -1: a continuous y; else y with this many classes
    sklearn_params: dict = None  # extra for scikit-learn only (n_jobs, cuML's defaults)
    large: bool = False
    dtype: str = "float32"  # of X as the user has it (float64: the bridge casts it on its way, cuML does not)
    rounds: int = 0  # at least this many rounds

    def sklearn_estimator(self):
        return self.sklearn(**self.params, **(self.sklearn_params or {}))

    @property
    def megabytes(self):
        return self.shape[0] * self.shape[1] * np.dtype(self.dtype).itemsize / 1e6


def _fit_transform(est, X, y):
    return est.fit_transform(X)


def _fit_predict(est, X, y):
    return est.fit(X, y).predict(X)


def _fit_predict_unsupervised(est, X, y):
    return est.fit_predict(X)


def _fit(est, X, y):
    return est.fit(X, y)


def _kneighbors(est, X, y):
    return est.fit(X).kneighbors(X[:10_000])


def _fit_predict_10k(est, X, y):
    return est.fit(X, y).predict(X[:10_000])


# cuML's L-BFGS runs a different number of iterations from call to call on the same data, so this fit's
# median needs more calls than the other large cases to settle
VARYING_ROUNDS = 30

CASES = [
    # small: the bridge's per-call cost is a large share of the call
    Case("StandardScaler fit_transform 5000x20", (5000, 20), preprocessing.StandardScaler,
         "cuml.preprocessing.StandardScaler", "GPUStandardScaler", {}, _fit_transform),
    Case("PCA(5) fit_transform 5000x20", (5000, 20), decomposition.PCA, "cuml.decomposition.PCA",
         "GPUPCA", {"n_components": 5}, _fit_transform),
    Case("LinearRegression fit+predict 5000x20", (5000, 20), linear_model.LinearRegression,
         "cuml.linear_model.LinearRegression", "GPULinearRegression", {}, _fit_predict, classes=-1),
    Case("LogisticRegression fit+predict 5000x20", (5000, 20), linear_model.LogisticRegression,
         "cuml.linear_model.LogisticRegression", "GPULogisticRegression", {}, _fit_predict, classes=2,
         sklearn_params={"max_iter": 1000}),
    Case("KMeans(3) fit_predict 5000x20", (5000, 20), cluster.KMeans, "cuml.cluster.KMeans", "GPUKMeans",
         {"n_clusters": 3, "n_init": 1, "random_state": 0}, _fit_predict_unsupervised),
    Case("RandomForestClassifier(100) fit+predict 500x20", (500, 20), ensemble.RandomForestClassifier,
         "cuml.ensemble.RandomForestClassifier", "GPURandomForestClassifier",
         {"n_estimators": 100, "random_state": 0}, _fit_predict, classes=2, sklearn_params={"n_jobs": -1}),
    Case("SVC(rbf) fit+predict 500x20", (500, 20), svm.SVC, "cuml.svm.SVC", "GPUSVC", {}, _fit_predict,
         classes=2),
    # large: 50 MB and more of data, or seconds of work, where a GPU earns its keep
    Case("StandardScaler fit_transform 10000x1280 (51 MB)", (10000, 1280), preprocessing.StandardScaler,
         "cuml.preprocessing.StandardScaler", "GPUStandardScaler", {}, _fit_transform, large=True),
    Case("KMeans(8) fit_predict 1M x 50", (1_000_000, 50), cluster.KMeans, "cuml.cluster.KMeans", "GPUKMeans",
         {"n_clusters": 8, "n_init": 1, "random_state": 0}, _fit_predict_unsupervised, large=True),
    Case("PCA(10) fit_transform 1M x 100", (1_000_000, 100), decomposition.PCA, "cuml.decomposition.PCA",
         "GPUPCA", {"n_components": 10}, _fit_transform, large=True),
    Case("LogisticRegression fit 1M x 50", (1_000_000, 50), linear_model.LogisticRegression,
         "cuml.linear_model.LogisticRegression", "GPULogisticRegression", {}, _fit, classes=2, large=True,
         sklearn_params={"max_iter": 1000}, rounds=VARYING_ROUNDS),
    Case("RandomForestClassifier(100, depth 16) fit 200k x 20", (200_000, 20), ensemble.RandomForestClassifier,
         "cuml.ensemble.RandomForestClassifier", "GPURandomForestClassifier",
         {"n_estimators": 100, "max_depth": 16, "random_state": 0}, _fit, classes=2, large=True,
         sklearn_params={"n_jobs": -1}),
    Case("SVC(rbf) fit 20k x 20", (20_000, 20), svm.SVC, "cuml.svm.SVC", "GPUSVC", {}, _fit, classes=2,
         large=True),
    Case("NearestNeighbors(5) 10k queries on 100k x 32", (100_000, 32), neighbors.NearestNeighbors,
         "cuml.neighbors.NearestNeighbors", "GPUNearestNeighbors", {"n_neighbors": 5}, _kneighbors,
         large=True, sklearn_params={"n_jobs": -1}),
    # float64, as most users' arrays are
    Case("StandardScaler fit_transform 5000x20 float64", (5000, 20), preprocessing.StandardScaler,
         "cuml.preprocessing.StandardScaler", "GPUStandardScaler", {}, _fit_transform, dtype="float64"),
    Case("SVC(rbf) fit+predict 500x20 float64", (500, 20), svm.SVC, "cuml.svm.SVC", "GPUSVC", {}, _fit_predict,
         classes=2, dtype="float64"),
    Case("LogisticRegression fit+predict 5000x20 float64", (5000, 20), linear_model.LogisticRegression,
         "cuml.linear_model.LogisticRegression", "GPULogisticRegression", {}, _fit_predict, classes=2,
         sklearn_params={"max_iter": 1000}, dtype="float64"),
    Case("LogisticRegression fit 1M x 50 float64", (1_000_000, 50), linear_model.LogisticRegression,
         "cuml.linear_model.LogisticRegression", "GPULogisticRegression", {}, _fit, classes=2, large=True,
         sklearn_params={"max_iter": 1000}, dtype="float64"),
    Case("SVC(rbf) fit+predict 20000x20 float64", (20_000, 20), svm.SVC, "cuml.svm.SVC", "GPUSVC", {},
         _fit_predict, classes=2, large=True, dtype="float64"),
    Case("KNeighborsClassifier fit+predict 100k / 10k x 32", (100_000, 32), neighbors.KNeighborsClassifier,
         "cuml.neighbors.KNeighborsClassifier", "GPUKNeighborsClassifier", {}, _fit_predict_10k, classes=2,
         large=True, sklearn_params={"n_jobs": -1}),
]


def make_data(case, seed=0):
    rng = np.random.default_rng(seed)
    n, d = case.shape
    X = rng.standard_normal((n, d), dtype=np.float32).astype(case.dtype, copy=False)
    if case.classes == 0:
        return X, None
    score = X[:, : min(d, 5)].sum(axis=1) + 0.5 * rng.standard_normal(n, dtype=np.float32)
    if case.classes < 0:
        return X, score.astype(case.dtype)
    return X, (score > 0).astype(np.int32)


# ---------------------------------------------------------------- timing

# A small case runs until its slowest way has been timed this long, at least MIN_SMALL_ROUNDS and at most
# MAX_SMALL_ROUNDS rounds: the median of a few calls of milliseconds moves by more than the bridge's cost.
SMALL_SECONDS = 0.5
MIN_SMALL_ROUNDS = 20
MAX_SMALL_ROUNDS = 100
# A large case runs --repeats rounds, and more (at most MAX_LARGE_ROUNDS) until its slowest way has run this long.
LARGE_SECONDS = 8.0
MAX_LARGE_ROUNDS = 11

# What comes before each timed call of a small case (--between), a row each.
BETWEEN = {
    "collect": "gc.collect() before each call: no call pays for a collection of the caller's garbage",
    "timeit": "as timeit: one collection, then the collector off and the calls back to back",
}


def round_order(names, index):
    """The ways of round ``index``: the rotations of ``names``, then the rotations of their reverse, so that
    over 2 x len(names) rounds each way comes straight after each other way equally often."""
    shift = index % len(names)
    if (index // len(names)) % 2:
        names = names[:1] + names[:0:-1]
    return names[shift:] + names[:shift]


def timed_together(runs, rounds, between="collect", seconds=SMALL_SECONDS, most=MAX_SMALL_ROUNDS):
    """Time the ways of one case (``runs``: {way: () -> result}) in turn, round by round.

    Run in turn, a machine whose speed drifts (GPU clocks, other processes)
    moves every way alike, and the ratios between them hold. Each way runs
    ``rounds`` times after one warm-up, and more until the slowest has run
    ``seconds`` (at most ``most`` rounds).
    """
    names = list(runs)
    for name in names:
        runs[name]()
    times = {name: [] for name in names}
    done = 0
    collector_was_on = gc.isenabled()
    if between == "timeit":
        gc.collect()
        gc.disable()
    try:
        while done < rounds or (max(sum(t) for t in times.values()) < seconds and done < most):
            for name in round_order(names, done):
                if between == "collect":
                    gc.collect()
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
            done += 1
    finally:
        if collector_was_on:
            gc.enable()
    return {name: {"median": float(np.median(t)), "min": float(min(t)), "n": len(t), "times": t}
            for name, t in times.items()}


def timed(run, repeats):
    """Median, min and all times of ``repeats`` runs after one warm-up, each after a ``gc.collect()``."""
    run()
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"median": float(np.median(times)), "min": float(min(times)), "n": len(times), "times": times}


def paired_difference(times, others):
    """The median of the round-by-round differences ``times[i] - others[i]``: a drift of the machine over
    a case moves both sides of each difference alike, where it can move the two medians apart."""
    rounds = min(len(times), len(others))
    return float(np.median(np.subtract(times[:rounds], others[:rounds])))


# ---------------------------------------------------------------- the worker


class WorkerProcess(LaunchedWorker):
    """A worker in a temp folder that goes when it stops (or when this process ends, however it ends); how long
    it took to be ready, its memory."""

    def __init__(self, backend, **options):
        super().__init__(tempfile.mkdtemp(prefix="sgb-e2e-"), backend=backend, log_level="WARNING",
                         parent_pid=os.getpid(), **options)
        weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)  # at exit too

    def rss_mb(self):
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return None

    def gpu_mb(self):
        """GPU memory the worker process holds (nvidia-smi), or None without a GPU."""
        if not shutil.which("nvidia-smi"):
            return None
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            pid, used = (part.strip() for part in line.split(","))
            if pid == str(self.process.pid):
                return float(used)
        return 0.0

    def stop(self):
        super().stop(wait=15)
        shutil.rmtree(self.folder, ignore_errors=True)


def cuml_class(path):
    import cuml

    cuml.set_global_output_type("numpy")
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------- the parts


def run_cases(cases, repeats, use_cuml, skip_large_sklearn, between):
    rows = []
    for case in cases:
        X, y = make_data(case)
        for way_between in ("collect",) if case.large else between:
            rows.append(run_case(case, X, y, repeats, use_cuml, skip_large_sklearn, way_between))
    return rows


def run_case(case, X, y, repeats, use_cuml, skip_large_sklearn, between):
    """One case's row: its ways timed in turn, each call after what ``between`` says (BETWEEN)."""
    row = {"case": case.name, "shape": list(case.shape), "megabytes": round(case.megabytes, 2), "large": case.large,
           "between": between}
    makers = {}
    if not (case.large and skip_large_sklearn):
        makers["sklearn"] = case.sklearn_estimator
    if use_cuml:
        makers["cuml"] = lambda: cuml_class(case.cuml)(**case.params)
    wrapper = getattr(sklearn_gpu_bridge, case.bridge)
    makers["bridge"] = lambda: wrapper(**case.params)
    runs = {way: lambda make=make: case.run(make(), X, y) for way, make in makers.items()}
    if case.large:
        row.update(timed_together(runs, max(repeats, case.rounds), between, LARGE_SECONDS, MAX_LARGE_ROUNDS))
    else:
        row.update(timed_together(runs, max(repeats, MIN_SMALL_ROUNDS, case.rounds), between))
    if "cuml" in row:
        row["bridge_over_cuml"] = row["bridge"]["median"] / row["cuml"]["median"]
        row["bridge_minus_cuml_ms"] = (row["bridge"]["median"] - row["cuml"]["median"]) * 1e3
        row["bridge_minus_cuml_paired_ms"] = paired_difference(row["bridge"]["times"], row["cuml"]["times"]) * 1e3
    if "sklearn" in row:
        row["speedup_vs_sklearn"] = row["sklearn"]["median"] / row["bridge"]["median"]
    print(_line(row), flush=True)
    return row


def _line(row):
    name = row["case"] + ("" if row["between"] == "collect" else f" [{row['between']}]")
    cells = [f"{name:<58}"]
    for way in ("sklearn", "cuml", "bridge"):
        cells.append(f"{row[way]['median']:9.4f}" if way in row else f"{'-':>9}")
    if "bridge_over_cuml" in row:
        cells.append(f"{row['bridge_over_cuml']:6.2f}x  bridge {row['bridge_minus_cuml_ms']:+.2f} ms over cuML "
                     f"(round by round {row['bridge_minus_cuml_paired_ms']:+.2f})")
    return "  ".join(cells)


def run_grid_search(repeats, use_cuml, skip_sklearn, n=20_000):
    """GridSearchCV over Pipeline(scaler, SVC): 12 candidates x cv=3 on n x 20 float64, and the bridge with
    n_jobs 4 and -1 (the worker runs several fits at once)."""
    X, y = make_data(Case("grid", (n, 20), None, "", "", {}, None, classes=2, dtype="float64"))
    grid = {"svm__C": [0.1, 1, 10, 100], "svm__gamma": ["scale", 0.01, 0.1]}

    def bridged(n_jobs=None):
        return GridSearchCV(
            Pipeline([("sc", sklearn_gpu_bridge.GPUStandardScaler()), ("svm", sklearn_gpu_bridge.GPUSVC())]),
            grid, cv=3, n_jobs=n_jobs)

    ways = {}
    if not skip_sklearn:
        ways["sklearn (n_jobs=-1)"] = lambda: GridSearchCV(
            Pipeline([("sc", preprocessing.StandardScaler()), ("svm", svm.SVC())]), grid, cv=3, n_jobs=-1)
    ways.update({"bridge": bridged, "bridge n_jobs=4": lambda: bridged(4), "bridge n_jobs=-1": lambda: bridged(-1)})
    if use_cuml:
        ways["cuml"] = lambda: GridSearchCV(
            Pipeline([("sc", cuml_class("cuml.preprocessing.StandardScaler")()),
                      ("svm", cuml_class("cuml.svm.SVC")())]), grid, cv=3)
    result = {"candidates": 12, "cv": 3, "shape": [n, 20], "dtype": "float64"}
    connection = sklearn_gpu_bridge.get_connection()
    for way, make in ways.items():
        before = dict(connection.stats)
        last = {}
        result[way] = timed(lambda make=make: last.update(search=make().fit(X, y)), repeats)
        result[way]["best_params"] = last["search"].best_params_
        if way.startswith("bridge"):  # the client's counters: which transport the arrays took
            result[way]["transport"] = {k: v - before.get(k, 0) for k, v in connection.stats.items()
                                        if v != before.get(k, 0)}
        print(f"  GridSearchCV {way:<22} {result[way]['median']:8.3f} s  {result[way].get('transport', '')}",
              flush=True)
    if "sklearn (n_jobs=-1)" in result:
        result["speedup_vs_sklearn"] = result["sklearn (n_jobs=-1)"]["median"] / result["bridge"]["median"]
    for jobs in ("4", "-1"):
        result[f"n_jobs={jobs} speedup over n_jobs=1"] = \
            result["bridge"]["median"] / result[f"bridge n_jobs={jobs}"]["median"]
    return result


# ---------------------------------------------------------------- as users meet it: fresh processes

_FIRST_FIT = """
import json, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
X = np.random.default_rng(0).standard_normal((5000, 20)).astype(np.float32)
if sys.argv[1] == "cuml":
    started = time.perf_counter()
    from cuml.preprocessing import StandardScaler
else:
    from sklearn_gpu_bridge import GPUStandardScaler as StandardScaler
    started = time.perf_counter()
StandardScaler().fit_transform(X)
print(json.dumps({"first_fit_s": time.perf_counter() - started}))
"""

_ONE_SEARCH = """
import json, sys, time, warnings
import numpy as np
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
warnings.simplefilter("ignore")
from sklearn_gpu_bridge import GPUStandardScaler, GPUSVC
n_jobs, candidates, n = map(int, sys.argv[1:4])
rng = np.random.default_rng(0)
X = rng.standard_normal((n, 20))
y = (X[:, 0] + 0.5 * X[:, 1] + 0.3 * rng.standard_normal(len(X)) > 0).astype(int)
grid = {"svm__C": list(np.logspace(-1, 2, candidates // 3)), "svm__gamma": ["scale", 0.01, 0.1]}
started = time.perf_counter()
search = GridSearchCV(Pipeline([("sc", GPUStandardScaler()), ("svm", GPUSVC())]), grid, cv=3, n_jobs=n_jobs)
search.fit(X, y)
print(json.dumps({"seconds": time.perf_counter() - started, "best": {k: str(v) for k, v in search.best_params_.items()}}))
"""


def _fresh(script, *args, env):
    run = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                         env=env, timeout=600)
    if run.returncode:
        raise RuntimeError(run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_as_users_meet_it(backend, use_cuml, worker, rounds=3, n=20_000):
    """Each way in a fresh process. The first fit of a script with nothing configured: the first script
    starts the local worker, the next ones find it warm (and cuML in process pays its import in each).
    One GridSearchCV of 12 and 48 candidates x cv=3 on n x 20 float64 in a fresh process, through
    ``worker``: n_jobs=1, n_jobs=-1 (threads) and n_jobs=-1 in joblib's processes (search_threads=off)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SKLEARN_GPU_BRIDGE_")}
    result = {}
    with tempfile.TemporaryDirectory(prefix="sgb-e2e-run-") as run_dir:
        os.chmod(run_dir, 0o700)
        fresh_user = {**base, "XDG_RUNTIME_DIR": run_dir, "SKLEARN_GPU_BRIDGE_LOCAL_BACKEND": backend}
        try:
            firsts = [_fresh(_FIRST_FIT, "bridge", env=fresh_user)["first_fit_s"] for _ in range(rounds + 1)]
        finally:
            subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge", "stop"], env=fresh_user,
                           capture_output=True, timeout=60)
    result["first_fit"] = {"starts the worker": firsts[0], "finds it warm": firsts[1:]}
    if use_cuml:
        result["first_fit"]["cuML in process"] = [_fresh(_FIRST_FIT, "cuml", env=base)["first_fit_s"]
                                                  for _ in range(rounds)]
    print(f"  first fit: starts the worker {firsts[0]:.2f} s, finds it warm "
          f"{', '.join(f'{t:.3f}' for t in firsts[1:])} s; cuML in process "
          f"{result['first_fit'].get('cuML in process', '-')}", flush=True)
    configured = {**base, "SKLEARN_GPU_BRIDGE_CONNECTION_FILE": str(worker.connection_file)}
    ways = {"n_jobs=1": (1, configured), "n_jobs=-1": (-1, configured),
            "n_jobs=-1, processes": (-1, {**configured, "SKLEARN_GPU_BRIDGE_SEARCH_THREADS": "off"})}
    for candidates in (12, 48):
        rows = result[f"one search, {candidates}x3"] = {}
        for way, (n_jobs, env) in ways.items():
            runs = [_fresh(_ONE_SEARCH, n_jobs, candidates, n, env=env) for _ in range(rounds)]
            rows[way] = {"median": float(np.median([r["seconds"] for r in runs])),
                         "times": [r["seconds"] for r in runs], "best": runs[0]["best"]}
        rows["n_jobs=-1 speedup over n_jobs=1"] = rows["n_jobs=1"]["median"] / rows["n_jobs=-1"]["median"]
        print(f"  one search {candidates}x3 on {n}x20 in a fresh process: "
              + ", ".join(f"{way} {rows[way]['median']:.2f} s" for way in ways)
              + f"; n_jobs=-1 {rows['n_jobs=-1 speedup over n_jobs=1']:.2f}x n_jobs=1", flush=True)
    return result


def run_accuracy():
    """5-fold accuracy through the bridge next to scikit-learn's, on its small datasets."""
    loaders = {"iris": datasets.load_iris, "digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer}
    models = {
        "SVC": (svm.SVC, "GPUSVC", {}, {}),
        "RandomForestClassifier": (ensemble.RandomForestClassifier, "GPURandomForestClassifier",
                                   {"random_state": 0}, {}),
        "KNeighborsClassifier": (neighbors.KNeighborsClassifier, "GPUKNeighborsClassifier", {}, {}),
        "LogisticRegression": (linear_model.LogisticRegression, "GPULogisticRegression", {}, {"max_iter": 1000}),
    }
    table = {}
    for data_name, load in loaders.items():
        X, y = load(return_X_y=True)
        X = preprocessing.StandardScaler().fit_transform(X)
        for model_name, (sk, bridged, params, sklearn_only) in models.items():
            entry = {"sklearn": float(cross_val_score(sk(**params, **sklearn_only), X, y, cv=5).mean()),
                     "bridge": float(cross_val_score(getattr(sklearn_gpu_bridge, bridged)(**params), X, y,
                                                     cv=5).mean())}
            table[f"{data_name} / {model_name}"] = entry
            print(f"  {data_name:<14} {model_name:<24} " + "  ".join(f"{k} {v:.3f}" for k, v in entry.items()),
                  flush=True)
    return table


def run_memory(worker, cycles):
    """Worker RSS and GPU memory, and the models it holds, before and after fit/predict/release cycles."""
    X, y = make_data(Case("mem", (2000, 20), None, "", "", {}, None, classes=2))
    sklearn_gpu_bridge.GPULogisticRegression().fit(X, y).predict(X)  # warm
    connection = sklearn_gpu_bridge.get_connection()
    before = {"rss_mb": worker.rss_mb(), "gpu_mb": worker.gpu_mb(), "handles": connection.status()["handles"]}
    for _ in range(cycles):
        model = sklearn_gpu_bridge.GPULogisticRegression().fit(X, y)
        model.predict(X)
        del model
    gc.collect()
    connection.status()  # carries the last release
    after = {"rss_mb": worker.rss_mb(), "gpu_mb": worker.gpu_mb(), "handles": connection.status()["handles"]}
    print(f"  memory over {cycles} cycles: before {before}  after {after}", flush=True)
    return {"cycles": cycles, "before": before, "after": after}


# ---------------------------------------------------------------- the markdown tables

HEADER = ("| case | MB | scikit-learn | cuML in process | bridge | bridge / cuML | bridge - cuML "
          "| the same, timeit's way | bridge vs scikit-learn |")
INTERVALS_HEADER = "| case | rounds | bridge - cuML, by the medians | bridge - cuML, round by round |"


def _cell(row, way):
    return f"{row[way]['median']:#.3g}" if way in row else "-"


def _megabytes(row):
    """X's size: the case's own where this script has it (the JSON's is rounded), else the JSON's."""
    case = next((case for case in CASES if case.name == row["case"]), None)
    return case.megabytes if case is not None else row["megabytes"]


def case_rows(cases):
    """One row a case: median seconds of each way after a ``gc.collect()``, bridge / cuML, and for the small
    cases the difference of the medians in ms after a collection and timeit's way."""
    timeit = {c["case"]: c for c in cases if c.get("between") == "timeit"}
    for row in cases:
        if row.get("between") == "timeit":
            continue
        other = timeit.get(row["case"], {})
        ratio = f"{row['bridge_over_cuml']:.2f}x" if "bridge_over_cuml" in row else "-"
        minus = f"{row['bridge_minus_cuml_ms']:+.1f} ms" if not row["large"] and "bridge_minus_cuml_ms" in row else ""
        minus_timeit = f"{other['bridge_minus_cuml_ms']:+.1f} ms" if "bridge_minus_cuml_ms" in other else ""
        speedup = row.get("speedup_vs_sklearn")
        speedup = "-" if speedup is None else f"{speedup:.1f}x" if speedup < 10 else f"{speedup:.0f}x"
        yield (f"| {row['case']} | {_megabytes(row):g} | {_cell(row, 'sklearn')} | {_cell(row, 'cuml')} "
               f"| {_cell(row, 'bridge')} | {ratio} | {minus} | {minus_timeit} | {speedup} |")


def bootstrap_interval(statistic, rng, level=90, resamples=2000):
    """The central ``level`` % interval of ``statistic(rng)`` over ``resamples`` draws, in ms."""
    draws = [statistic(rng) for _ in range(resamples)]
    return np.percentile(draws, [50 - level / 2, 50 + level / 2]) * 1e3


def interval_rows(cases, seed=0):
    """Bridge minus cuML in ms with 90% bootstrap intervals: the difference of the medians (each way's calls
    resampled on their own) and the median of the round-by-round differences (the rounds resampled)."""
    for row in cases:
        if "bridge" not in row or "cuml" not in row:
            continue
        rng = np.random.default_rng(seed)
        bridge, cuml = np.asarray(row["bridge"]["times"]), np.asarray(row["cuml"]["times"])
        rounds = min(bridge.size, cuml.size)
        differences = bridge[:rounds] - cuml[:rounds]
        low, high = bootstrap_interval(
            lambda r: np.median(r.choice(bridge, bridge.size)) - np.median(r.choice(cuml, cuml.size)), rng)
        paired_low, paired_high = bootstrap_interval(lambda r: np.median(r.choice(differences, rounds)), rng)
        name = row["case"] + ("" if row.get("between", "collect") == "collect" else f" [{row['between']}]")
        yield (f"| {name} | {rounds} | {(np.median(bridge) - np.median(cuml)) * 1e3:+.2f} [{low:+.2f}, {high:+.2f}] "
               f"| {np.median(differences) * 1e3:+.2f} [{paired_low:+.2f}, {paired_high:+.2f}] |")


def print_markdown(path, intervals=False):
    """The tables of an e2e.py JSON file: the cases, the intervals (``intervals``), the grid, the accuracies."""
    report = json.loads(Path(path).read_text())

    def table(header, rows):
        rows = list(rows)
        if rows:
            print(header, "| --- " * header.count(" | ") + "| --- |", *rows, "", sep="\n")

    cases = report.get("cases", [])
    table(HEADER, case_rows(cases))
    if intervals:
        table(INTERVALS_HEADER, interval_rows(cases))
    grid = report.get("grid_search")
    if grid:
        ways = [way for way, value in grid.items() if isinstance(value, dict) and "median" in value]
        table("| GridSearchCV, 12 candidates x cv=3 | seconds | bridge (n_jobs=1) / this | best parameters |",
              (f"| {way} | {grid[way]['median']:#.3g} | {grid['bridge']['median'] / grid[way]['median']:.2f}x "
               f"| {grid[way]['best_params']} |" for way in ways))
    if "accuracy" in report:
        table("| dataset / model | scikit-learn | bridge |",
              (f"| {name} | {a['sklearn']:.3f} | {a['bridge']:.3f} |" for name, a in report["accuracy"].items()))


# ---------------------------------------------------------------- main


def _named(case, only):
    """Whether ``--only``'s ``only`` picks ``case``: a part of its name, or all of it where it ends in ``$``."""
    return case.name == only[:-1] if only.endswith("$") else only in case.name


def machine(status):
    return {"platform": platform.platform(), "host": platform.node(), "cpus": os.cpu_count(),
            "python": platform.python_version(), **status["versions"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuml", choices=["cuml", "sklearn"],
                        help="the worker's backend; cuml also times cuML in this process (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds at least (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="only the small cases, no scikit-learn large runs, the grid on 2000 rows")
    parser.add_argument("--transport", default="auto", choices=["auto", "frames"],
                        help="frames: the worker on TCP loopback and arrays as ZeroMQ frames, no shared memory "
                             "(the path from Windows to WSL2)")
    parser.add_argument("--array-cache", default="auto", choices=["auto", "on", "off"],
                        help="the client setting array_cache (off: every send is a first send)")
    parser.add_argument("--parts", default="cases,grid,accuracy,memory",
                        help="comma-separated: cases, grid, users (fresh processes), accuracy, memory (default: %(default)s)")
    parser.add_argument("--only", default=None,
                        help="cases whose name contains this, or one of these (a|b); NAME$: that case alone")
    parser.add_argument("--no-sklearn-large", action="store_true",
                        help="leave scikit-learn out of the large cases and the grid (they take minutes)")
    parser.add_argument("--between", default="collect,timeit",
                        help="small cases, a row each (default: %(default)s): "
                             + "; ".join(f"{k}: {v}" for k, v in BETWEEN.items()))
    parser.add_argument("--cycles", type=int, default=1000, help="fit/predict cycles of the memory part")
    parser.add_argument("--out", default=None, help="JSON file (default: e2e-<backend>-<host>.json here)")
    parser.add_argument("--markdown", metavar="FILE", help="print the markdown tables of this results file, and exit")
    parser.add_argument("--intervals", action="store_true",
                        help="with --markdown: bridge - cuML with 90%% bootstrap intervals too")
    args = parser.parse_args()
    if args.markdown:
        print_markdown(args.markdown, args.intervals)
        return
    between = args.between.split(",")
    if not set(between) <= set(BETWEEN):
        parser.error(f"--between takes {', '.join(BETWEEN)}")
    parts = set(args.parts.split(","))
    use_cuml = args.backend == "cuml"

    started = time.perf_counter()
    frames = args.transport == "frames"
    worker = WorkerProcess(args.backend, **({"bind": "127.0.0.1"} if frames else {}))
    sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False,
                                  pool="off" if frames else "auto", array_cache=args.array_cache)
    start = time.perf_counter()
    sklearn_gpu_bridge.GPUStandardScaler().fit_transform(np.ones((5000, 20), np.float32))
    first_call = time.perf_counter() - start
    status = sklearn_gpu_bridge.get_connection().status()
    report = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:], "machine": machine(status), "backend": args.backend, "repeats": args.repeats,
        "worker_threads": status.get("threads"),
        "startup": {"worker_ready_s": worker.ready_seconds, "first_call_after_ready_s": first_call},
    }
    print(f"worker ready in {worker.ready_seconds:.2f} s, first call {first_call * 1e3:.1f} ms; "
          f"{status['versions']}\n", flush=True)
    try:
        only = args.only.split("|") if args.only else None
        cases = [c for c in CASES if not (args.quick and c.large) and (not only or any(_named(c, o) for o in only))]
        if "cases" in parts:
            print(f"{'case':<58}  {'sklearn':>9}  {'cuML':>9}  {'bridge':>9}  bridge/cuML  (median s)")
            report["cases"] = run_cases(cases, args.repeats, use_cuml, args.quick or args.no_sklearn_large, between)
        if "grid" in parts:
            report["grid_search"] = run_grid_search(args.repeats, use_cuml, args.no_sklearn_large,
                                                    n=2000 if args.quick else 20_000)
        if "users" in parts:
            report["as_users_meet_it"] = run_as_users_meet_it(args.backend, use_cuml, worker,
                                                              rounds=2 if args.quick else 3,
                                                              n=2000 if args.quick else 20_000)
        if "accuracy" in parts:
            report["accuracy"] = run_accuracy()
        if "memory" in parts:
            report["memory"] = run_memory(worker, args.cycles)
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
    report["total_seconds"] = time.perf_counter() - started
    out = Path(args.out or f"e2e-{args.backend}-{platform.node()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
