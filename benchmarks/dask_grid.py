"""GridSearchCV of GPU* estimators over a Dask cluster of GPUs (one worker per GPU), in one run:
against the same search on fewer GPUs, through the bridge without Dask, and with cuML in process.

The search is Pipeline(GPUStandardScaler, GPUSVC) on make_classification float64
data, cv=3, n_jobs=-1, through joblib's dask backend with X and y scattered
once. Before the timed searches each Dask worker warms up in a task of its own
(cuML imported, a first fit) and a tiny search runs through the backend. Each
fit records where it ran (pid, Dask worker, the first entry of the worker's
CUDA_VISIBLE_DEVICES, the execution mode) and a thread samples every GPU's
memory (nvidia-smi, every 0.5 s) during each search.

    python benchmarks/dask_grid.py --gpus 1 2 --candidates 12 48 --out benchmarks/results/gpu-h200/dask-grid.json
    python benchmarks/dask_grid.py --cpu --gpus 1 2 --candidates 12 --rows 2000    # a dry run without GPUs

The JSON has, per (GPUs, candidates), "dask N GPUs, C candidates": seconds
(the median of --repeats), every repeat's seconds, fits per GPU, the fits that
ran outside the cluster's workers (0 expected), peak memory per device (MiB),
best_params and best_score; "scaling": t(1 GPU) / t(N GPUs) per candidates;
and the two baselines without Dask.
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import joblib
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

import sklearn_gpu_bridge as sgb

GRIDS = {
    12: {"svm__C": [0.1, 1, 10, 100], "svm__gamma": ["scale", 0.01, 0.1]},
    48: {"svm__C": [0.1, 0.3, 1, 3, 10, 30, 100, 300], "svm__gamma": ["scale", 0.003, 0.01, 0.03, 0.1, 0.3]},
}
WARM_GRID = {"svm__C": [1, 10]}  # the tiny search before the timed ones: 2 candidates x cv=2
ENV_EXECUTION = "SKLEARN_GPU_BRIDGE_EXECUTION"


def where_am_i():
    """This process: pid, Dask worker, its GPU (dask-cuda puts the worker's own first) and execution mode."""
    mode = sgb.execution_mode()
    try:
        from distributed import get_worker

        worker = get_worker().address
    except (ImportError, ValueError):
        worker = None
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or None
    return {"pid": os.getpid(), "worker": worker, "gpu": gpu, "mode": mode["mode"], "reason": mode.get("reason")}


def recording_scorer(record_dir):
    """Accuracy, and a line saying where this fit ran (the scorer runs in the fit's own task)."""

    def score(estimator, X, y):
        line = {**where_am_i(), "at": time.time()}
        with open(Path(record_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return float((estimator.predict(X) == y).mean())

    return score


def search(grid, scoring, n_jobs, cv=3):
    pipe = Pipeline([("sc", sgb.GPUStandardScaler()), ("svm", sgb.GPUSVC())])
    return GridSearchCV(pipe, grid, cv=cv, n_jobs=n_jobs, scoring=scoring)


class MemorySampler:
    """Peak memory used per GPU (nvidia-smi every half second) while it runs."""

    def __init__(self, enabled):
        self.enabled, self.peak, self.samples, self._stop = enabled, {}, 0, threading.Event()

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
        self.samples += 1

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


def _count(lines, field):
    counts = {}
    for line in lines:
        counts[str(line[field])] = counts.get(str(line[field]), 0) + 1
    return dict(sorted(counts.items()))


def timed_search(candidates, X, y, *, n_jobs, sample_gpus, repeats=1, backend=None, scatter=True,
                 worker_pids=None):
    """The median seconds of ``repeats`` searches, where each fit ran, peak GPU memory (MiB) and the result."""
    config = {"backend": backend, "scatter": [X, y]} if backend == "dask" and scatter else \
        ({"backend": backend} if backend else {})
    seconds, runs = [], []
    with MemorySampler(sample_gpus) as memory:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as record_dir:
                start = time.perf_counter()
                with joblib.parallel_config(**config):
                    fitted = search(GRIDS[candidates], recording_scorer(record_dir), n_jobs).fit(X, y)
                seconds.append(time.perf_counter() - start)
                runs.append([json.loads(line) for path in Path(record_dir).glob("*.jsonl")
                             for line in path.read_text().splitlines()])
    where = runs[-1]  # one search's fits (every repeat runs the same ones)
    result = {"seconds": statistics.median(seconds), "all_seconds": seconds, "repeats": repeats,
              "scored_fits": len(where), "fits_per_gpu": _count(where, "gpu"),
              "fits_per_worker": _count(where, "worker"),
              "modes": _count(where, "mode"), "in_this_process": sum(w["pid"] == os.getpid() for w in where),
              "pids": sorted({line["pid"] for line in where}), "peak_memory_mib": memory.peak,
              "memory_samples": memory.samples, "best_params": fitted.best_params_,
              "best_score": float(fitted.best_score_)}
    if worker_pids is not None:
        result["fits_outside_workers"] = sum(w["pid"] not in worker_pids for w in where)
    return result


def warm(n_rows=2000, n_cols=20):
    """cuML (or the bridge) imported and warmed up in this process; says where it is."""
    X, y = make_classification(n_rows, n_cols, random_state=1)
    sgb.GPUSVC().fit(sgb.GPUStandardScaler().fit_transform(X), y)
    return where_am_i()


def warm_cluster(client, n_cols):
    """A warm-up task pinned to each worker (the task threads the fits use), then a tiny search."""
    workers = sorted(client.scheduler_info()["workers"])
    futures = [client.submit(warm, 2000, n_cols, workers=[w], allow_other_workers=False, pure=False) for w in workers]
    where = dict(zip(workers, client.gather(futures)))
    X, y = make_classification(600, n_cols, random_state=2)
    with joblib.parallel_config(backend="dask"):
        search(WARM_GRID, None, -1, cv=2).fit(X, y)
    return where


def cuml_in_this_process():
    """Whether a real cuML (not the bridge's alias of it) imports here."""
    from sklearn_gpu_bridge.client.discovery import _cuml_importable

    return bool(_cuml_importable())


@contextlib.contextmanager
def environment(**values):
    """Variables set for the worker processes a cluster starts (LocalCUDACluster sets its own env option)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cluster_for(gpus, cpu, threads):
    """One worker per GPU, ``threads`` each: joblib's dask backend runs a search whose cluster has one
    thread in all in the calling process, so a one-GPU cluster needs two to be used at all."""
    if cpu:
        from distributed import LocalCluster

        return LocalCluster(n_workers=gpus, threads_per_worker=threads, processes=True, dashboard_address=None)
    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(gpus)), threads_per_worker=threads,
                            dashboard_address=None)


def summary(report, args):
    runs = report["runs"]
    rows = []
    for candidates in args.candidates:
        row = [f"{candidates:>3}"]
        for label in ("bridge, no Dask", "cuML in process, no Dask"):
            run = runs.get(f"{label}, {candidates} candidates")
            row.append(f"{run['seconds']:8.2f}" if run else f"{'-':>8}")
        for gpus in args.gpus:
            run = runs.get(f"dask {gpus} GPUs, {candidates} candidates")
            row.append(f"{run['seconds']:8.2f}" if run else f"{'-':>8}")
        scaling = report["scaling"].get(str(candidates), {})
        row.append(" ".join(f"{g}:{s:.2f}x" for g, s in scaling.items()) or "-")
        rows.append(row)
    head = ["cand", "  bridge", "  in-proc"] + [f"  dask {g}" for g in args.gpus] + ["t(1)/t(N)"]
    lines = ["  ".join(head)] + ["  ".join(row) for row in rows]
    for gpus in args.gpus:
        for candidates in args.candidates:
            run = runs.get(f"dask {gpus} GPUs, {candidates} candidates")
            if run:
                lines.append(f"dask {gpus} x {candidates}: fits per GPU {run['fits_per_gpu']}, outside workers "
                             f"{run.get('fits_outside_workers')}, modes {run['modes']}, "
                             f"peak MiB {run['peak_memory_mib']}, best {run['best_params']} {run['best_score']:.4f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts, one cluster each")
    parser.add_argument("--candidates", type=int, nargs="+", default=[12, 48], choices=sorted(GRIDS))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cols", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="searches timed per case (the median is reported)")
    parser.add_argument("--cpu", action="store_true", help="distributed.LocalCluster on CPUs: a dry run")
    parser.add_argument("--threads-per-worker", type=int, default=2,
                        help="fits at once per GPU worker (default 2: a one-GPU cluster of one thread would "
                             "run the search in this process)")
    parser.add_argument("--dask-execution", choices=["auto", "worker", "in_process"], default="auto",
                        help=f"{ENV_EXECUTION} for the Dask workers (auto: cuML in their process where it imports)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the searches without Dask")
    parser.add_argument("--no-scatter-run", action="store_true",
                        help="skip the extra search with X and y not scattered up front")
    parser.add_argument("--out", default=None, help="JSON file (default: dask-grid-<host>.json here)")
    args = parser.parse_args()
    from distributed import Client

    X, y = make_classification(args.rows, args.cols, n_informative=min(10, args.cols), random_state=0)
    sample_gpus = not args.cpu
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
              "argv": vars(args), "shape": [args.rows, args.cols], "dtype": str(X.dtype), "cv": 3,
              "threads_per_worker": args.threads_per_worker, "dask_execution": args.dask_execution,
              "versions": _versions(), "runs": {}, "scaling": {}}
    if sample_gpus:
        report["gpus"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines()

    # no Dask: the bridge as a single-GPU user meets it, then cuML in this process (the Dask worker's mode)
    ways = [("bridge, no Dask", "worker")]
    if not args.cpu and cuml_in_this_process():
        ways.append(("cuML in process, no Dask", "in_process"))
    else:
        report["in_process_skipped"] = "--cpu" if args.cpu else "no cuML here"
    for label, execution in ([] if args.no_baselines else ways):
        sgb.reset_connection()
        with sgb.config_context(execution=execution):
            warm(n_cols=args.cols)
            for candidates in args.candidates:
                run = timed_search(candidates, X, y, n_jobs=1, sample_gpus=sample_gpus, repeats=args.repeats)
                report["runs"][f"{label}, {candidates} candidates"] = run
                print(f"{label:<28} {candidates:>3} candidates: {run['seconds']:7.2f} s  {run['modes']}", flush=True)
        sgb.reset_connection()

    forced = None if args.dask_execution == "auto" else args.dask_execution
    for gpus in args.gpus:
        with environment(**{ENV_EXECUTION: forced}):
            cluster = cluster_for(gpus, args.cpu, args.threads_per_worker)
        with cluster, Client(cluster) as client:
            report["runs"][f"dask {gpus} workers: warm-up"] = warm_cluster(client, args.cols)
            worker_pids = set(client.run(os.getpid).values())
            for candidates in args.candidates:
                run = timed_search(candidates, X, y, n_jobs=-1, sample_gpus=sample_gpus, repeats=args.repeats,
                                   backend="dask", worker_pids=worker_pids)
                report["runs"][f"dask {gpus} GPUs, {candidates} candidates"] = run
                print(f"dask, {gpus} GPU workers        {candidates:>3} candidates: {run['seconds']:7.2f} s  "
                      f"fits per GPU {run['fits_per_gpu']}  peak MiB {run['peak_memory_mib']}", flush=True)
            if gpus == max(args.gpus) and not args.no_scatter_run:
                # the same search leaving joblib to scatter X and y by itself (it does, once per search)
                run = timed_search(min(args.candidates), X, y, n_jobs=-1, sample_gpus=sample_gpus,
                                   repeats=args.repeats, backend="dask", scatter=False, worker_pids=worker_pids)
                report["runs"][f"dask {gpus} GPUs, {min(args.candidates)} candidates, no scatter"] = run
                print(f"  same without scatter=[X, y]: {run['seconds']:.2f} s", flush=True)

    runs = report["runs"]
    for candidates in args.candidates:
        one = runs.get(f"dask 1 GPUs, {candidates} candidates")
        bridge = runs.get(f"bridge, no Dask, {candidates} candidates")
        for gpus in args.gpus:
            many = runs.get(f"dask {gpus} GPUs, {candidates} candidates")
            if one and many and gpus > 1:
                ratio = one["seconds"] / many["seconds"]
                report["scaling"].setdefault(str(candidates), {})[str(gpus)] = ratio
        if one and bridge:
            report[f"dask 1 GPU over bridge, {candidates} candidates"] = one["seconds"] / bridge["seconds"]
    print(summary(report, args))
    out = Path(args.out or f"dask-grid-{platform.node()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


def _versions():
    """Installed versions, read from the packages' metadata (nothing imported: cuML would take GPU memory)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for name in ("sklearn-gpu-bridge", "numpy", "scikit-learn", "joblib", "dask", "distributed", "dask-cuda",
                 "cuml-cu13", "cuml-cu12", "cuml"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return versions


if __name__ == "__main__":
    main()
