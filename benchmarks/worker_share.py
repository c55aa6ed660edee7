"""Where a small call's milliseconds go between in-process cuML and the bridge (GPU machine).

    python benchmarks/worker_share.py [--repeats 60] [--out results/worker-share.json]

One case at a time (StandardScaler.fit_transform 5000x20, LogisticRegression
fit+predict 5000x20, float32), its ways run in turn (``e2e.timed_together``),
medians; each way differs from the one before it in one thing the bridge does:

- ``cuml``: cuML in this thread, numpy in and out (what the bridge is held to);
- ``cuml_thread``: the same from another thread (the worker's executor threads);
- ``cuml_cupy_out``: under ``using_output_type("cupy")``, copied into a host
  buffer with ``.get(out=...)`` (the worker's encoder);
- ``cuml_y_int64``: labels as int64 (the label codes the wrappers sent before
  2026-11-24) rather than int32;
- ``in_process``: the ``GPU*`` wrapper with cuML in this process (the
  wrapper's checks, the backend, encoding and decoding: no transport);
- ``bridge``: the ``GPU*`` wrapper through a worker (everything).
"""

import argparse
import concurrent.futures
import json

import numpy as np

from e2e import labelled, timed_together


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--out")
    args = parser.parse_args()

    import cuml
    from cuml.linear_model import LogisticRegression
    from cuml.preprocessing import StandardScaler

    from sklearn_gpu_bridge import client
    from sklearn_gpu_bridge.estimators import GPULogisticRegression, GPUStandardScaler
    from sklearn_gpu_bridge.inprocess import InProcess

    cuml.set_global_output_type("numpy")
    X, y = labelled(5000, 20, np.random.default_rng(0))
    y64 = y.astype(np.int64)
    out = np.empty_like(X)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    worker, in_process = client.get_connection(), InProcess()

    def through(connection, run):
        def way():
            client._connection = connection  # the process's connection, swapped per run (diagnosis only)
            return run()
        return way

    def scaler_cupy_out():
        with cuml.using_output_type("cupy"):
            result = StandardScaler().fit_transform(X)
        result.get(out=out)

    cases = {
        "StandardScaler fit_transform 5000x20": {
            "cuml": lambda: StandardScaler().fit_transform(X),
            "cuml_thread": lambda: pool.submit(lambda: StandardScaler().fit_transform(X)).result(),
            "cuml_cupy_out": scaler_cupy_out,
            "in_process": through(in_process, lambda: GPUStandardScaler().fit_transform(X)),
            "bridge": through(worker, lambda: GPUStandardScaler().fit_transform(X)),
        },
        "LogisticRegression fit+predict 5000x20": {
            "cuml": lambda: LogisticRegression().fit(X, y).predict(X),
            "cuml_thread": lambda: pool.submit(lambda: LogisticRegression().fit(X, y).predict(X)).result(),
            "cuml_y_int64": lambda: LogisticRegression().fit(X, y64).predict(X),
            "in_process": through(in_process, lambda: GPULogisticRegression().fit(X, y).predict(X)),
            "bridge": through(worker, lambda: GPULogisticRegression().fit(X, y).predict(X)),
        },
    }
    rows = {}
    for case, ways in cases.items():
        timed = timed_together(ways, args.repeats)
        rows[case] = {way: t["median"] * 1e3 for way, t in timed.items()}
        print(case + ": " + ", ".join(f"{way} {ms:.2f} ms" for way, ms in rows[case].items()), flush=True)
    client._connection = worker
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"repeats": args.repeats, "median_ms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
