"""Do cuML fits from several threads of one process overlap on the GPU?

Issue 15 asks for ``n_jobs=-1`` to be faster than one job on one GPU: the
worker's threads would have to run their fits at the same time. This runs
the fits a GridSearchCV over SVC makes (fit on two folds, predict the third,
20000x20 float64 sent as float32) from 1, 2 and 4 threads of one process,
cuML in process (no bridge), three ways:

- ``default``: as cuML runs by default;
- ``per-thread``: ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` (CuPy's work on
  each thread's own default stream);
- ``streams``: each thread inside its own non-blocking ``cupy.cuda.Stream``;
- ``backend``: through the worker's own backend (``CumlBackend.fit``/``call``),
  in process: what a worker thread does, without the transport;
- ``bridge``: ``GPUSVC`` against a local worker of as many threads, one client
  process per thread (``multiprocessing``), as joblib's processes are.

Each way runs in a fresh interpreter (the variable is read when CuPy loads).
The figure is fits per second; a way that overlaps gains with threads.

    python benchmarks/gpu_concurrency.py --out benchmarks/results/gpu-concurrency.json
"""

import argparse
import json
import os
import subprocess
import sys
import time

WAYS = {"default": {}, "per-thread": {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}, "streams": {}, "backend": {},
        "bridge": {}}


def _data():
    import numpy as np
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=20000, n_features=20, random_state=0)
    return X.astype(np.float32), y


def _bridged(i):
    """One fit+predict through the bridge, from a client process of its own (the pool's initializer connected it)."""
    from sklearn_gpu_bridge import GPUSVC

    X, y = _data()
    GPUSVC(C=[0.1, 1, 10][i % 3], gamma="scale").fit(X[:13334], y[:13334]).predict(X[13334:])


def _bridge_rate(threads, fits):
    """Fits per second from ``threads`` client processes against a background worker of ``threads`` threads."""
    import multiprocessing

    cli = [sys.executable, "-m", "sklearn_gpu_bridge"]
    subprocess.run(cli + ["start", "--backend", "cuml", "--threads", str(threads)], check=True, capture_output=True)
    try:
        with multiprocessing.get_context("spawn").Pool(threads) as pool:
            pool.map(_bridged, range(threads), chunksize=1)  # each child connects and warms up
            started = time.perf_counter()
            pool.map(_bridged, range(fits), chunksize=1)
            return fits / (time.perf_counter() - started)
    finally:
        subprocess.run(cli + ["stop"], capture_output=True)


def _one_way(way, threads, fits):
    """In this interpreter: ``fits`` SVC fit+predict pairs spread over ``threads`` threads; fits per second."""
    from concurrent.futures import ThreadPoolExecutor

    if way == "bridge":
        return _bridge_rate(threads, fits)
    import cupy
    from cuml.svm import SVC

    from sklearn_gpu_bridge.worker.backends import CumlBackend

    X, y = _data()
    train, test = slice(0, 13334), slice(13334, None)
    backend = CumlBackend() if way == "backend" else None

    def fit_and_predict(i):
        if backend is not None:
            model, _, _ = backend.fit("SVC", {"C": [0.1, 1, 10][i % 3]}, "fit", [X[train], y[train]], {}, [], None)
            backend.call("SVC", model, "predict", [X[test]], {})
            return
        context = cupy.cuda.Stream(non_blocking=True) if way == "streams" else None
        if context is not None:
            context.__enter__()
        try:
            SVC(C=[0.1, 1, 10][i % 3], gamma="scale").fit(X[train], y[train]).predict(X[test])
            cupy.cuda.get_current_stream().synchronize()
        finally:
            if context is not None:
                context.__exit__(None, None, None)

    fit_and_predict(0)  # compile and warm up
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fit_and_predict, range(fits)))
    return fits / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fits", type=int, default=24)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # way threads: run in this interpreter
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one_way(args.one[0], int(args.one[1]), args.fits)))
        return
    rows = []
    for way, env in WAYS.items():
        for threads in args.threads:
            run = subprocess.run([sys.executable, __file__, "--fits", str(args.fits), "--one", way, str(threads)],
                                 capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
            rate = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else None
            rows.append({"way": way, "threads": threads, "fits_per_s": rate,
                         "error": None if rate else run.stderr[-500:]})
            print(f"{way:11s} {threads} threads: " + (f"{rate:.2f} fits/s" if rate else "failed"), flush=True)
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"benchmark": "gpu_concurrency", "fits": args.fits, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
