"""GridSearchCV of GPU* estimators over a Dask cluster of GPUs (one worker per GPU), in one run:
against the same search on fewer GPUs, through the bridge without Dask, and with cuML in process.

The search is Pipeline(GPUStandardScaler, GPUSVC) on make_classification float64
data, cv=3, through joblib's dask backend with X and y scattered once. Each
fit records where it ran (pid, the GPU dask-cuda gave its worker, the
execution mode) and a thread samples every GPU's memory during each search.

    python benchmarks/dask_grid.py --gpus 1 2 --candidates 12 48 --out benchmarks/results/gpu-h200/dask-grid.json
    python benchmarks/dask_grid.py --cpu --gpus 1 2 --candidates 12 --rows 2000    # a dry run without GPUs
"""

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import joblib
import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

import sklearn_gpu_bridge as sgb

GRIDS = {
    12: {"svm__C": [0.1, 1, 10, 100], "svm__gamma": ["scale", 0.01, 0.1]},
    48: {"svm__C": [0.1, 0.3, 1, 3, 10, 30, 100, 300], "svm__gamma": ["scale", 0.003, 0.01, 0.03, 0.1, 0.3]},
}


def recording_scorer(record_dir):
    """Accuracy, and a line saying where this fit ran (the scorer runs in the fit's own task)."""

    def score(estimator, X, y):
        from sklearn_gpu_bridge import execution_mode

        mode = execution_mode()
        try:
            from distributed import get_worker

            worker = get_worker().address
        except (ImportError, ValueError):
            worker = None
        line = {"pid": os.getpid(), "gpu": mode["gpu"], "mode": mode["mode"], "worker": worker,
                "at": time.time()}
        with open(Path(record_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return float((estimator.predict(X) == y).mean())

    return score


def search(candidates, scoring, n_jobs):
    pipe = Pipeline([("sc", sgb.GPUStandardScaler()), ("svm", sgb.GPUSVC())])
    return GridSearchCV(pipe, GRIDS[candidates], cv=3, n_jobs=n_jobs, scoring=scoring)


class MemorySampler:
    """Peak memory used per GPU (nvidia-smi every half second) while it runs."""

    def __init__(self, enabled):
        self.enabled, self.peak, self._stop = enabled, {}, threading.Event()

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        for line in out.strip().splitlines():
            index, used = (part.strip() for part in line.split(","))
            self.peak[index] = max(self.peak.get(index, 0), int(used))

    def _run(self):
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a missed sample is a gap, not a failure
                pass
            self._stop.wait(0.5)

    def __exit__(self, *exc):
        self._stop.set()
        if self.enabled:
            self._thread.join(5)


def timed_search(candidates, X, y, *, n_jobs, sample_gpus, backend=None, scatter=True):
    """Seconds, where each fit ran, peak GPU memory (MiB) and the result of one search."""
    with tempfile.TemporaryDirectory() as record_dir, MemorySampler(sample_gpus) as memory:
        config = {"backend": backend, "scatter": [X, y]} if backend == "dask" and scatter else \
            ({"backend": backend} if backend else {})
        start = time.perf_counter()
        with joblib.parallel_config(**config):
            fitted = search(candidates, recording_scorer(record_dir), n_jobs).fit(X, y)
        seconds = time.perf_counter() - start
        where = [json.loads(line) for path in Path(record_dir).glob("*.jsonl") for line in path.read_text().splitlines()]
    by_gpu, by_mode = {}, {}
    for line in where:
        by_gpu[str(line["gpu"])] = by_gpu.get(str(line["gpu"]), 0) + 1
        by_mode[line["mode"]] = by_mode.get(line["mode"], 0) + 1
    return {"seconds": seconds, "scored_fits": len(where), "in_this_process": sum(w["pid"] == os.getpid() for w in where), "fits_per_gpu": by_gpu, "modes": by_mode,
            "pids": sorted({line["pid"] for line in where}), "peak_memory_mib": memory.peak,
            "best_params": fitted.best_params_, "best_score": float(fitted.best_score_)}


def warm(n_rows=2000):
    """In each Dask worker: cuML (or the bridge) imported and warmed up before the timed searches."""
    X, y = make_classification(n_rows, 20, random_state=1)
    sgb.GPUSVC().fit(sgb.GPUStandardScaler().fit_transform(X), y)
    return sgb.execution_mode()


def cluster_for(gpus, cpu, threads):
    """One worker per GPU, ``threads`` each: joblib's dask backend runs a search whose cluster has one
    thread in all in the calling process, so a one-GPU cluster needs two to be used at all."""
    if cpu:
        from distributed import LocalCluster

        return LocalCluster(n_workers=gpus, threads_per_worker=threads, processes=True, dashboard_address=None)
    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(gpus)), threads_per_worker=threads,
                            dashboard_address=None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--candidates", type=int, nargs="+", default=[12, 48], choices=sorted(GRIDS))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cols", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="distributed.LocalCluster on CPUs: a dry run")
    parser.add_argument("--threads-per-worker", type=int, default=2,
                        help="fits at once per GPU worker (default 2: a one-GPU cluster of one thread would "
                             "run the search in this process)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from distributed import Client

    X, y = make_classification(args.rows, args.cols, n_informative=10, random_state=0)
    sample_gpus = not args.cpu
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "shape": [args.rows, args.cols], "dtype": str(X.dtype), "cv": 3,
              "threads_per_worker": args.threads_per_worker, "runs": {}}
    if sample_gpus:
        report["gpus"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines()

    # no Dask: the bridge as a single-GPU user meets it, then cuML in this process (the Dask worker's mode)
    for label, execution in (("bridge, no Dask", "worker"), ("cuML in process, no Dask", "in_process")):
        if args.cpu and execution == "in_process":
            continue
        sgb.reset_connection()
        with sgb.config_context(execution=execution):
            warm()
            for candidates in args.candidates:
                run = timed_search(candidates, X, y, n_jobs=1, sample_gpus=sample_gpus)
                report["runs"][f"{label}, {candidates} candidates"] = run
                print(f"{label:<28} {candidates:>3} candidates: {run['seconds']:7.2f} s  {run['modes']}", flush=True)
        sgb.reset_connection()

    for gpus in args.gpus:
        with cluster_for(gpus, args.cpu, args.threads_per_worker) as cluster, Client(cluster) as client:
            modes = client.run(warm)
            report["runs"][f"dask {gpus} workers: modes"] = modes
            n_jobs = -1  # joblib's dask backend counts the cluster's threads (so one thread runs in this process)
            for candidates in args.candidates:
                run = timed_search(candidates, X, y, n_jobs=n_jobs, sample_gpus=sample_gpus, backend="dask")
                report["runs"][f"dask {gpus} GPUs, {candidates} candidates"] = run
                print(f"dask, {gpus} GPU workers        {candidates:>3} candidates: {run['seconds']:7.2f} s  "
                      f"fits per GPU {run['fits_per_gpu']}  peak MiB {run['peak_memory_mib']}", flush=True)
            if gpus == max(args.gpus):  # what scattering once saves: the same search sending X, y with each task
                run = timed_search(min(args.candidates), X, y, n_jobs=n_jobs, sample_gpus=sample_gpus,
                                   backend="dask", scatter=False)
                report["runs"][f"dask {gpus} GPUs, {min(args.candidates)} candidates, no scatter"] = run
                print(f"  same without scatter: {run['seconds']:.2f} s", flush=True)

    runs = report["runs"]
    for candidates in args.candidates:
        one = runs.get(f"dask 1 GPUs, {candidates} candidates")
        bridge = runs.get(f"bridge, no Dask, {candidates} candidates")
        for gpus in args.gpus:
            many = runs.get(f"dask {gpus} GPUs, {candidates} candidates")
            if one and many and gpus > 1:
                report[f"speedup {gpus} GPUs over 1, {candidates} candidates"] = one["seconds"] / many["seconds"]
        if one and bridge:
            report[f"dask 1 GPU over bridge, {candidates} candidates"] = one["seconds"] / bridge["seconds"]
    print(json.dumps({k: v for k, v in report.items() if k.startswith(("speedup", "dask 1"))}, indent=1))
    out = Path(args.out or f"dask-grid-{platform.node()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
