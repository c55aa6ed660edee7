"""What OpenBLAS's idle threads cost a bridged call: after a BLAS call they spin for a while before they sleep.

    python benchmarks/blas_spin.py [--runs 100] [--out results/...json]
    python benchmarks/blas_spin.py --e2e results/gpu-h200-1127c/e2e-table.json ...

OpenBLAS's threads wait for the next call spinning (``sched_yield``) for about 2**28 cycles, some 0.1 s,
before they sleep. Where they spin on every core (a small host), the bridge's own threads must take a core
from them:

- "worker": the scikit-learn worker's LogisticRegression fit leaves its BLAS threads spinning; the client's
  heads-up ring (``client._ring``, timed) after a ``gc.collect()`` is timed, a worker with OpenBLAS's
  default threads against one limited to one thread (``OPENBLAS_NUM_THREADS=1`` in its environment);
- "client": a bridged predict, that many ms after a BLAS call in this process (a 300x300 product), against
  one after none (the worker limited to one thread);
- ``--e2e FILES``: in ``e2e.py``'s interleaved small cases, the bridge's and cuML's medians after the
  scikit-learn way's call against after the others' (what came before each call, as e2e.py records it).

Medians in ms (the ring: µs).
"""

import gc
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from dask_grid import environment
from e2e import bridge_parser, bridged_to_new_worker, labelled
from sklearn_gpu_bridge import client

GAPS_MS = (0, 25, 50, 100, 150, 250)


def worker_threads(runs, blas_threads, reply_wait):
    """Medians of the heads-up ring (µs) and of whole calls (ms), fit and predict, after ``gc.collect()``,
    through a scikit-learn worker whose OpenBLAS has ``blas_threads`` threads (None: its default). Only a
    client that spins for its replies (``reply_wait``) rings: with ``sleep``, no ring is timed."""
    rings, real_ring = [], client._ring

    def timed_ring(doorbell, ring):
        start = time.perf_counter()
        real_ring(doorbell, ring)
        rings.append(time.perf_counter() - start)

    X, y = labelled(5000, 20, np.random.default_rng(0))
    calls = {"fit": lambda: sklearn_gpu_bridge.GPULogisticRegression().fit(X, y)}
    with environment(OPENBLAS_NUM_THREADS=None if blas_threads is None else str(blas_threads)):
        worker = bridged_to_new_worker("sklearn", reply_wait=reply_wait)
    client._ring = timed_ring
    try:
        fitted = sklearn_gpu_bridge.GPULogisticRegression().fit(X, y)
        calls["predict"] = lambda: fitted.predict(X)
        measured = {}
        for name, call in calls.items():
            for _ in range(10):
                call()
            rings.clear()
            whole = []
            for _ in range(runs):
                gc.collect()
                start = time.perf_counter()
                call()
                whole.append(time.perf_counter() - start)
            measured[name] = {"ring_us": statistics.median(rings) * 1e6 if rings else None,  # none: never rang
                              "call_ms": statistics.median(whole) * 1e3}
        return measured
    finally:
        client._ring = real_ring
        sklearn_gpu_bridge.reset_connection()
        worker.stop()


def after_blas_here(runs, reply_wait):
    """Median ms of a bridged predict ``gap`` ms after a BLAS call in this process, for each of GAPS_MS, and
    after none (the worker's OpenBLAS limited to one thread)."""
    X, y = labelled(5000, 20, np.random.default_rng(0))
    A = np.random.default_rng(1).standard_normal((300, 300))
    with environment(OPENBLAS_NUM_THREADS="1"):  # read by the worker: this process's OpenBLAS has started
        worker = bridged_to_new_worker("sklearn", reply_wait=reply_wait)
    try:
        fitted = sklearn_gpu_bridge.GPULogisticRegression().fit(X, y)
        for _ in range(10):
            fitted.predict(X)
        times = {gap: [] for gap in (*GAPS_MS, None)}
        for _ in range(runs):
            for gap in times:
                time.sleep(0.4)  # every thread asleep again
                if gap is not None:
                    A @ A
                    time.sleep(gap / 1000)
                start = time.perf_counter()
                fitted.predict(X)
                times[gap].append(time.perf_counter() - start)
        return {("none" if gap is None else f"{gap} ms after"): statistics.median(t) * 1e3 for gap, t in times.items()}
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()


def after_sklearn(paths):
    """{case (between): per GPU way, the median ms after the scikit-learn way's call and after another's, and
    where the calls record them the mean solver iterations and the calls so split} of e2e.py JSON files, each
    case's calls of all the files together.

    Each way's calls say which way came before them (``after``) since 2026-11-29. Before, a round ran
    ``names[r % 3:] + names[:r % 3]`` of (sklearn, cuml, bridge): the bridge followed scikit-learn in rounds
    r % 3 == 2, cuML in rounds r % 3 in (0, 2)."""
    calls = {}  # (case, way) -> [(after scikit-learn?, seconds, iterations or None)]
    for path in paths:
        for case in json.loads(Path(path).read_text()).get("cases", []):
            ways = [way for way, value in case.items() if isinstance(value, dict) and "times" in value]
            if ways != ["sklearn", "cuml", "bridge"] or not case["bridge"].get("interleaved"):
                continue
            for way, rotated_after in (("bridge", (2,)), ("cuml", (0, 2))):
                times = case[way]["times"]
                after = case[way].get("after") or ["sklearn" if i % 3 in rotated_after else "another"
                                                   for i in range(len(times))]
                iterations = case[way].get("n_iter") or [None] * len(times)
                calls.setdefault((f"{case['case']} ({case['between']})", way), []).extend(
                    (a == "sklearn", t, n) for a, t, n in zip(after, times, iterations))
    rows = {}
    for (name, way), mine in calls.items():
        row = rows.setdefault(name, {})[way] = {}
        for label, flag in (("after sklearn", True), ("after another", False)):
            group = [(t, n) for after, t, n in mine if after == flag]
            row[label] = statistics.median(t for t, _ in group) * 1e3
            if all(n is not None for _, n in group):
                row[f"iterations {label} (calls)"] = [statistics.mean(n for _, n in group), len(group)]
    return rows


def main():
    parser = bridge_parser(__doc__, backend=False, reply_wait="spin")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--e2e", nargs="+", help="e2e.py JSON files to split by the way before, their calls "
                        "together (no calls run)")
    args = parser.parse_args()
    if args.e2e:
        report({"after the scikit-learn way (ms; iterations)": after_sklearn(args.e2e), "files": args.e2e}, args.out)
        return
    report({"runs": args.runs, "cpus": os.cpu_count(), "reply_wait": args.reply_wait,
            "worker's BLAS threads: default / 1": {"default": worker_threads(args.runs, None, args.reply_wait),
                                                   "1": worker_threads(args.runs, 1, args.reply_wait)},
            "predict after a BLAS call in this process, ms": after_blas_here(args.runs, args.reply_wait)}, args.out)


if __name__ == "__main__":
    main()
