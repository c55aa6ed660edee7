"""What a full garbage collection before each call costs the bridge, against the same call in process.

    python benchmarks/gc_penalty.py [--backend sklearn] [--calls 100] [--reply-wait spin] [--out results/...json]

``e2e.py`` times each run after a ``gc.collect()`` (so that no collection
falls inside a timed run). A full collection walks every object of the
process and leaves the caches cold; the bridge's path, Python in two
processes, may pay more for that than the estimator in process. Here each
small case runs ``--calls`` times three ways, in process (the worker
backend's class: scikit-learn's or cuML's) and bridged: back to back, after
``gc.collect()``, and after a sleep of 20 ms (an idle pause of about a
collection's length, without the walk), and an echo with no arrays (the
bridge's floor) the same three ways. Medians in ms. ``--reply-wait spin``
makes the calls spin for their replies as ``auto`` does beside a cuML
worker, so that a scikit-learn worker exercises the request slots; run it
once per tree, in turn, to compare two trees (``PYTHONPATH=<other tree's
site>`` for the other).
"""

import gc
import json
import time

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from e2e import CASES, bridge_parser, bridged_to_new_worker, in_process_and_bridged, make_data

SMALL = ("StandardScaler fit_transform 5000x20", "LogisticRegression fit+predict 5000x20")
MODES = ("back to back", "after gc.collect()", "after 20 ms asleep")


def timed(run, mode, calls):
    for _ in range(5):
        run()
    times = []
    for _ in range(calls):
        if mode == MODES[1]:
            gc.collect()
        elif mode == MODES[2]:
            time.sleep(0.02)
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    parser = bridge_parser(__doc__)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    worker = bridged_to_new_worker(args.backend, reply_wait=args.reply_wait)
    rows = []
    try:
        echo = sklearn_gpu_bridge.get_connection().echo
        rows.append({"case": "echo, no arrays", **{f"bridge, {mode}": timed(echo, mode, args.calls) for mode in MODES}})
        print(json.dumps(rows[-1]), flush=True)
        for case in (c for c in CASES if c.name in SMALL):
            X, y = make_data(case)
            ways = in_process_and_bridged(case, args.backend)
            row = {"case": case.name}
            for mode in MODES:
                for way, make in ways.items():
                    row[f"{way}, {mode}"] = timed(lambda m=make, c=case: c.run(m(), X, y), mode, args.calls)
            start = time.perf_counter()
            gc.collect()
            row["gc.collect() ms"] = (time.perf_counter() - start) * 1e3
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        worker.stop()
    report({"backend": args.backend, "calls": args.calls, "reply_wait": args.reply_wait,
            "bridge": sklearn_gpu_bridge.__file__, "cases": rows}, args.out)


if __name__ == "__main__":
    main()
