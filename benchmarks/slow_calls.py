"""Which calls of a large case are slow, and why: the solver's iterations, or what ran on the GPU just before.

    python benchmarks/slow_calls.py --calls 90 --out slow-calls.json
    python benchmarks/slow_calls.py --pool results/gpu-h200-1128d/slow-calls*.json    # several runs' calls together

cuML's LogisticRegression fit on 1M x 50 float32 takes about 37 ms a call, but some calls take 55-80 ms, in
process and through the bridge alike (``chance_over.py``). This times one case's calls, cuML in process and
through a worker of its own (``--backend``), in an order drawn at random (seed 0), each call after a ``gc.collect()`` and,
one call in three, a pause as long as scikit-learn's fit in e2e's table (``--pause``), or that fit itself
(``--between sklearn``). For each call it writes
what came just before (the other way, the same way, or the pause), the seconds, the solver's ``n_iter_``, the
first coefficients, and for the bridge its legs; then, per way and per what came before, the median and the
share of slow calls (over ``--slow`` times the way's fastest quartile). ``--worker-device-memory`` and
``--in-process-device-memory`` give either side the other's device memory, and ``--in-process-thread`` runs
cuML in process on a thread of its own as the worker does, to see whether that moves the iterations (a worker
copies X to the device itself: ``--worker-device-copy-min-bytes`` over any X leaves that to cuML).
"""

import argparse
import gc
import json
import os
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import sklearn_gpu_bridge
from sklearn_gpu_bridge.worker.backends import DEVICE_COPY_ENV, use_device_memory

from chance_over import iterations_compared, pooled_calls
from e2e import CASES, LEGS, WorkerProcess, cuml_class, make_data, request_legs


def n_iter(model):
    value = getattr(model, "n_iter_", None)
    return None if value is None else np.asarray(value).ravel().tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuml", "sklearn"), default="cuml")
    parser.add_argument("--case", default="LogisticRegression fit 1M x 50")
    parser.add_argument("--calls", type=int, default=90)
    parser.add_argument("--pause", type=float, default=0.7, help="seconds, before one call in three")
    parser.add_argument("--between", choices=("pause", "sklearn"), default="pause",
                        help="before one call in three: the pause, or scikit-learn's fit of the case on 16 cores "
                             "(as e2e's table runs it in turn with the other two ways)")
    parser.add_argument("--slow", type=float, default=1.3)
    parser.add_argument("--worker-device-memory", default=None, help="the worker's device_memory (default: its own)")
    parser.add_argument("--worker-device-copy-min-bytes", default=None,
                        help="the worker's DEVICE_COPY_MIN_BYTES (its environment's DEVICE_COPY_ENV; default: its own)")
    parser.add_argument("--in-process-device-memory", default=None,
                        help="this process's device memory set as the worker sets its own (async-cupy, async)")
    parser.add_argument("--in-process-thread", action="store_true",
                        help="cuML in process on a thread of its own, as the worker runs it on an executor thread")
    parser.add_argument("--out")
    parser.add_argument("--pool", nargs="+", metavar="FILE", help="run nothing: the summary of these runs' calls "
                        "together, and whether the two ways' iterations differ (Mann-Whitney U)")
    args = parser.parse_args()
    if args.pool:
        return print_pooled(args.pool, args.slow)
    if not args.out:
        parser.error("--out is required for a run")
    case = next(c for c in CASES if c.name == args.case)
    X, y = make_data(case)
    if args.worker_device_copy_min_bytes is not None:  # the worker started below inherits this environment
        os.environ[DEVICE_COPY_ENV] = str(int(args.worker_device_copy_min_bytes))
    worker = WorkerProcess(args.backend, device_memory=args.worker_device_memory)
    if args.in_process_device_memory:
        use_device_memory(args.in_process_device_memory)
    sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False)
    connection = sklearn_gpu_bridge.get_connection()
    local = cuml_class(case.cuml) if args.backend == "cuml" else case.sklearn
    makers = {"in process": lambda: local(**case.params),
              "bridge": lambda: getattr(sklearn_gpu_bridge, case.bridge)(**case.params)}
    thread = ThreadPoolExecutor(1) if args.in_process_thread else None

    def run(way, model):
        if way == "in process" and thread is not None:
            return thread.submit(case.run, model, X, y).result()
        return case.run(model, X, y)
    rng = np.random.default_rng(0)
    calls, before = [], "start"
    try:
        for way in makers:  # warm-up
            run(way, makers[way]())
        for _ in range(args.calls):
            way = str(rng.choice(list(makers)))
            if rng.random() < 1 / 3:
                if args.between == "sklearn":
                    case.run(case.sklearn_estimator(), X, y)
                else:
                    time.sleep(args.pause)
                before = args.between
            gc.collect()
            model = makers[way]()
            start_clock = time.monotonic()
            start = time.perf_counter()
            run(way, model)
            seconds = time.perf_counter() - start
            legs = request_legs(connection.last_stamps, start_clock, time.monotonic()) if way == "bridge" else None
            calls.append({"way": way, "before": before, "seconds": seconds, "n_iter": n_iter(model),
                          "coef_head": np.asarray(model.coef_).ravel()[:3].tolist(),
                          **({"legs_ms": [round(leg * 1e3, 3) for leg in legs]} if legs else {})})
            before = way
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
        if thread is not None:
            thread.shutdown()
    summary = summarise(calls, args.slow)
    Path(args.out).write_text(json.dumps({"case": case.name, "legs": LEGS, "calls": calls, "summary": summary},
                                         indent=1))
    for line in summary:
        print(line)


def print_pooled(paths, slow):
    reports = [json.loads(Path(path).read_text()) for path in paths]
    for line in summarise([call for report in reports for call in report["calls"]], slow):
        print(line)
    for case in sorted({report["case"] for report in reports}):
        print(iterations_compared(pooled_calls(case, paths)[0]))


def summarise(calls, slow):
    """Lines: per way and what came before, the calls, the median ms, the share slow, the mean iterations; the
    iterations seen."""
    lines = []
    for way in ("in process", "bridge"):
        mine = [c for c in calls if c["way"] == way]
        fast = np.quantile([c["seconds"] for c in mine], 0.25)
        groups = defaultdict(list)
        for c in mine:
            groups[c["before"]].append(c)
        for before, group in sorted(groups.items()):
            seconds = np.array([c["seconds"] for c in group])
            lines.append(f"{way:10} after {before:10}: {len(seconds):3} calls, "
                         f"median {np.median(seconds) * 1e3:6.1f} ms, {np.mean(seconds > slow * fast):4.0%} slow, "
                         f"{np.mean([c['n_iter'][0] for c in group]):5.2f} iterations on average")
        by_iter = defaultdict(list)
        for c in mine:
            by_iter[str(c["n_iter"])].append(c["seconds"] * 1e3)
        for iters, ms in sorted(by_iter.items()):
            lines.append(f"{way:10} n_iter_ {iters}: {len(ms):3} calls, median {np.median(ms):6.1f} ms, "
                         f"min {min(ms):6.1f}, max {max(ms):6.1f}")
    return lines


if __name__ == "__main__":
    main()
