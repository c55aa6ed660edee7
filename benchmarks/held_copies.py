"""Small calls that spin for their replies, back to back and after a ``gc.collect()``: where a request's ZeroMQ
copy and the doorbell's ring cost something (issue 15, eighth session).

Against a real worker subprocess (``e2e.WorkerProcess``), with ``reply_wait=spin`` (what ``auto`` does beside
a cuML worker on 4 cores or more), medians in ms of: an echo with no arrays (the floor), StandardScaler
fit_transform 5000x20, and a StandardScaler fit+transform pair on 500x20 (two requests, the second written
into the request slot that a worker thread watches; little work in either). Run it once per tree, in turn, to compare two trees::

    python benchmarks/held_copies.py --out after-1.json
    PYTHONPATH=/tmp/before-site python benchmarks/held_copies.py --out before-1.json
"""

import argparse
import gc
import json
import platform
import time

import numpy as np

import sklearn_gpu_bridge
from e2e import WorkerProcess


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="sklearn", choices=["sklearn", "cuml"])
    parser.add_argument("--repeats", type=int, default=400, help="timed calls back to back (after gc: a third)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    worker = WorkerProcess(args.backend)
    sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False,
                                  reply_wait="spin")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5000, 20)).astype(np.float32)
    small = X[:500]
    try:
        connection = sklearn_gpu_bridge.get_connection()
        cases = {
            "echo": connection.echo,
            "StandardScaler 5000x20": lambda: sklearn_gpu_bridge.GPUStandardScaler().fit_transform(X),
            "StandardScaler fit+transform 500x20":
                lambda: sklearn_gpu_bridge.GPUStandardScaler().fit(small).transform(small),
        }
        report = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
                  "bridge": sklearn_gpu_bridge.__file__, "backend": args.backend, "repeats": args.repeats,
                  "ms": {}}
        for name, call in cases.items():
            for _ in range(30):
                call()
            for pause, count in (("back to back", args.repeats), ("after gc.collect()", args.repeats // 3)):
                times = []
                for _ in range(count):
                    if pause != "back to back":
                        gc.collect()
                    start = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - start)
                report["ms"][f"{name}, {pause}"] = round(float(np.median(times)) * 1e3, 3)
        print(json.dumps(report["ms"], indent=1))
        if args.out:
            with open(args.out, "w") as out:
                json.dump(report, out, indent=1)
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()


if __name__ == "__main__":
    main()
