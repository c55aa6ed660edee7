"""Do cuML fits from several threads of one process overlap on the GPU?

Issue 15 asks for ``n_jobs=-1`` to be faster than one job on one GPU: the
worker's threads would have to run their fits at the same time. This runs
the fits a GridSearchCV over SVC makes (fit on two folds, predict the third,
20000x20 float64 sent as float32) from 1, 2 and 4 threads of one process,
cuML in process (no bridge), three ways:

- ``default``: as cuML runs by default;
- ``per-thread``: ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` (CuPy's work on
  each thread's own default stream);
- ``streams``: each thread inside its own non-blocking ``cupy.cuda.Stream``.

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

WAYS = {"default": {}, "per-thread": {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}, "streams": {}}


def _one_way(way, threads, fits):
    """In this interpreter: ``fits`` SVC fit+predict pairs spread over ``threads`` threads; fits per second."""
    from concurrent.futures import ThreadPoolExecutor

    import cupy
    import numpy as np
    from cuml.svm import SVC
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=20000, n_features=20, random_state=0)
    X = X.astype(np.float32)
    train, test = slice(0, 13334), slice(13334, None)

    def fit_and_predict(i):
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
