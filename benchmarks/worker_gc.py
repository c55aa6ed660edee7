"""How often Python's garbage collector runs inside small calls: in process, and in the bridge's worker.

    python benchmarks/worker_gc.py [--backend cuml] [--calls 200] [--pause-ms 20] [--out results/...json]

e2e's table runs ``gc.collect()`` before each timed call, so a call in process starts with the collector's
counts at zero. The worker's counts are wherever its last requests left them: a collection inside a request
would be a cost the call in process does not pay. Here the LogisticRegression fit+predict pair (5000x20) and
StandardScaler's fit_transform run ``--calls`` times each, ``--pause-ms`` apart (the caller idle, no
collection of its own), two ways: in process (the backend's class), counting and timing each collection
through ``gc.callbacks``; and through a worker of that backend, whose ``status`` counts its collections by
generation. With cuML on the H100 machine the worker met about none (results/gpu-h100-1128).
"""

import gc
import json
import time

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from e2e import CASES, bridge_parser, bridged_to_new_worker, in_process_and_bridged, make_data

SMALL = ("StandardScaler fit_transform 5000x20", "LogisticRegression fit+predict 5000x20")
WARM_UP = 20


class Collections:
    """Each collection of this process while entered, as (generation, seconds)."""

    def __enter__(self):
        self.seen, self._started = [], None
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._note)

    def _note(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seen.append((info["generation"], time.perf_counter() - self._started))

    def summary(self, calls):
        by_generation = {}
        for generation, seconds in self.seen:
            count, total = by_generation.get(generation, (0, 0.0))
            by_generation[generation] = (count + 1, total + seconds)
        return {f"generation {g}": {"per call": count / calls, "mean ms": 1e3 * total / count}
                for g, (count, total) in sorted(by_generation.items())}


def worker_collections():
    return sklearn_gpu_bridge.get_connection().status()["collections"]


def main():
    parser = bridge_parser(__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pause-ms", type=float, default=20.0)
    args = parser.parse_args()
    worker = bridged_to_new_worker(args.backend, reply_wait=args.reply_wait)
    rows = []
    try:
        for case in (c for c in CASES if c.name in SMALL):
            X, y = make_data(case)
            row = {"case": case.name}
            for way, make in in_process_and_bridged(case, args.backend).items():
                times = []
                for _ in range(WARM_UP):
                    case.run(make(), X, y)
                before = worker_collections() if way == "bridge" else None
                with Collections() as seen:
                    for _ in range(args.calls):
                        time.sleep(args.pause_ms / 1e3)
                        start = time.perf_counter()
                        case.run(make(), X, y)
                        times.append(time.perf_counter() - start)
                row[way] = {"median ms": 1e3 * float(np.median(times)), "caller's collections": seen.summary(args.calls)}
                if before is not None:
                    after = worker_collections()
                    row[way]["worker's collections, per call"] = [(b - a) / args.calls for a, b in zip(before, after)]
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        worker.stop()
    report({"backend": args.backend, "calls": args.calls, "pause_ms": args.pause_ms,
            "bridge": sklearn_gpu_bridge.__file__, "cases": rows}, args.out)


if __name__ == "__main__":
    main()
