"""One bridge worker driving every GPU of a 2-GPU box, against the same worker on one GPU.

GridSearchCV(Pipeline(GPUStandardScaler, GPUSVC)), 48 candidates (C x gamma) x 3 folds, on 20000 x 20
float64, n_jobs=-1 (threads of this process, over one connection). Two cuML workers are started at once (their
warm-ups overlap): ``--gpus all`` (a worker process per GPU behind one address, the default) and the default
(one GPU). For each: the search's time, its best parameters,
the requests each GPU ran (fits and the calls on their models: each fitted model's calls run where it was fitted),
the models each holds after, and the peak device memory seen on each (the status polled every 0.1 s:
``memory_used``, any process's, less what was in use before the search; ``peak_in_use``, what admission charged).
Then the two searches' results against each other.

``--one-process``: also the same search on a worker that drives every GPU from its one process
(``--gpus all --no-gpu-processes``), whose GPUs share one interpreter lock.

``--dask``: also the Dask route (dask_cuda's LocalCUDACluster, a worker per GPU, the GPU* wrappers running cuML
in each worker process, joblib's dask backend); it starts a cluster, so it takes longer than the 60 s above.

    python benchmarks/multi_gpu.py [--one-process] [--dask] [--out multi-gpu.json]   # 2 GPUs or more, cuML
"""

import argparse
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

import sklearn_gpu_bridge as sgb
from sklearn_gpu_bridge import GPUSVC, GPUStandardScaler
from sklearn_gpu_bridge.manage.launcher import LaunchedWorker

GRID = {"svc__C": [float(c) for c in np.logspace(-1, 1.5, 8)],
        "svc__gamma": [0.01, 0.02, 0.05, 0.1, 0.2, "scale"]}  # 48 candidates
MiB = 1 << 20


def pipeline():
    return Pipeline([("scaler", GPUStandardScaler()), ("svc", GPUSVC())])


def data():
    X, y = make_classification(n_samples=20000, n_features=20, n_informative=10, flip_y=0.05, random_state=0)
    return X.astype(np.float64), y


class Peaks(threading.Thread):
    """The status every 0.1 s while a search runs: the most device memory in use on each GPU."""

    def __init__(self, connection):
        super().__init__(daemon=True)
        self.connection, self.stop, self.peak = connection, threading.Event(), {}

    def run(self):
        while not self.stop.wait(0.1):
            for gpu in self.connection.status()["gpus"]:
                used = gpu["memory_used"] or 0
                self.peak[gpu["index"]] = max(self.peak.get(gpu["index"], 0), used)


def search_on(worker, label, X, y):
    sgb.reset_connection()
    sgb.set_config(connection_file=str(worker.connection_file), start_local_worker=False)
    connection = sgb.get_connection()
    before = {g["index"]: g for g in connection.status()["gpus"]}
    peaks = Peaks(connection)
    peaks.start()
    started = time.perf_counter()
    search = GridSearchCV(pipeline(), GRID, cv=3, n_jobs=-1).fit(X, y)
    elapsed = time.perf_counter() - started
    peaks.stop.set()
    peaks.join()
    after = connection.status()
    print(f"\n== {label}: {elapsed:.2f} s for {len(search.cv_results_['params'])} candidates x 3 folds "
          f"(worker threads {after['threads']}, peak running {after['peak_running']})")
    print(f"   best {search.best_params_}  score {search.best_score_:.4f}")
    for gpu in after["gpus"]:
        i, was = gpu["index"], before[gpu["index"]]
        print(f"   GPU {i}: requests {gpu['requests'] - was['requests']} (fits and their calls), "
              f"handles now {gpu['handles']}, failed {gpu['failed']}, budget {(gpu['budget'] or 0) / 2**30:.1f} GiB, "
              f"peak admitted {gpu['peak_in_use'] / MiB:.0f} MiB, peak in use "
              f"{(peaks.peak.get(i, 0) - (was['memory_used'] or 0)) / MiB:.0f} MiB above the {(was['memory_used'] or 0) / MiB:.0f} MiB before"
              + (f", UNUSABLE: {gpu['unusable']}" if gpu["unusable"] else ""))
    sgb.reset_connection()
    figures = {"seconds": elapsed, "best_params": {k: str(v) for k, v in search.best_params_.items()},
               "gpus": [{**gpu, "requests": gpu["requests"] - before[gpu["index"]]["requests"]} for gpu in after["gpus"]]}
    return search, elapsed, figures


def dask_route(X, y):
    try:
        import joblib
        from dask_cuda import LocalCUDACluster
        from distributed import Client
    except ImportError as exc:
        print(f"\n== Dask route: skipped ({exc})")
        return None
    started = time.perf_counter()
    with LocalCUDACluster(threads_per_worker=2) as cluster, Client(cluster) as client:
        modes = client.run(sgb.execution_mode)
        ready = time.perf_counter() - started
        # the fits run in the Dask workers; the refit of the best candidate runs here, with cuML in this process
        with joblib.parallel_config(backend="dask", scatter=[X, y]), sgb.config_context(execution="in_process"):
            began = time.perf_counter()
            search = GridSearchCV(pipeline(), GRID, cv=3, n_jobs=-1).fit(X, y)
            elapsed = time.perf_counter() - began
    print(f"\n== Dask route (LocalCUDACluster, {len(modes)} workers x 2 threads, cuML in each): {elapsed:.2f} s "
          f"(cluster ready in {ready:.1f} s); modes {sorted({m['mode'] for m in modes.values()})}")
    print(f"   best {search.best_params_}  score {search.best_score_:.4f}")
    return search, elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-process", action="store_true",
                        help="also the search on a worker that drives every GPU from one process")
    parser.add_argument("--dask", action="store_true", help="also the Dask route (slower to start)")
    parser.add_argument("--out", default=None, help="JSON file of the figures")
    args = parser.parse_args()
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    print(f"GPUs seen: {count}; cuML worker backend; X 20000 x 20 float64, grid {len(GRID['svc__C'])} C x "
          f"{len(GRID['svc__gamma'])} gamma = 48, cv=3, n_jobs=-1")
    if count < 2:
        print("note: one GPU only: the 'all' worker drives just that one")
    X, y = data()
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(3) as pool:
        starting = time.perf_counter()
        every = pool.submit(LaunchedWorker, Path(folder) / "all", backend="cuml", gpus="all", timeout=300)
        one = pool.submit(LaunchedWorker, Path(folder) / "one", backend="cuml", timeout=300)
        shared = pool.submit(LaunchedWorker, Path(folder) / "shared", backend="cuml", gpus="all", gpu_processes=False,
                             timeout=300) if args.one_process else None
        workers = [every.result(), one.result()] + ([shared.result()] if shared else [])
        print(f"the workers ready in {time.perf_counter() - starting:.1f} s")
        try:
            multi, t_multi, f_multi = search_on(workers[0], "worker --gpus all", X, y)
            single, t_single, f_single = search_on(workers[1], "worker, one GPU (default)", X, y)
            if args.one_process:
                _, t_shared, f_shared = search_on(workers[2], "worker --gpus all --no-gpu-processes", X, y)
        except Exception:
            for name, worker in zip(("--gpus all", "one GPU", "--gpus all --no-gpu-processes"), workers):  # the logs go with the folder
                print(f"\n== the end of the log of the worker {name} (exit code {worker.process.poll()}):\n"
                      + "\n".join(worker.log().splitlines()[-40:]), flush=True)
            raise
        finally:
            for worker in workers:
                worker.stop()
    same = multi.best_params_ == single.best_params_
    diff = float(np.max(np.abs(multi.cv_results_["mean_test_score"] - single.cv_results_["mean_test_score"])))
    print(f"\nspeed-up of --gpus all over one GPU: {t_single / t_multi:.2f}x ({t_single:.2f} s -> {t_multi:.2f} s)")
    print(f"same best params: {same}; largest difference of mean test scores: {diff:.2e}")
    report = {"gpus_seen": count, "all": f_multi, "one": f_single, "speedup": t_single / t_multi,
              "same_best_params": same, "largest_score_difference": diff}
    if args.one_process:
        print(f"every GPU in one process: {t_single / t_shared:.2f}x over one GPU ({t_shared:.2f} s); "
              f"a process per GPU is {t_shared / t_multi:.2f}x faster")
        report["one_process"] = f_shared
    if args.dask:
        result = dask_route(X, y)
        if result is not None:
            print(f"   vs --gpus all: {result[1] / t_multi:.2f}x its time; same best params: "
                  f"{result[0].best_params_ == multi.best_params_}")
            report["dask_seconds"] = result[1]
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
