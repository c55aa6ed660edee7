"""cuML in process with each way a worker may allocate device memory, in turn (GPU machine).

    python benchmarks/device_memory.py [--repeats 40] [--out results/device-memory.json]

``cuda``: RMM's default (cudaMalloc and cudaFree per array: what cuML does
unless told otherwise, and what the bridge's worker did before it had the
``device_memory`` setting); ``async``: CUDA's stream-ordered pool, as the
worker's setting "async" sets it (``worker.backends.use_device_memory``);
``async, CuPy's pool``: the same for cuML's own arrays, and CuPy's arrays
from CuPy's stream-ordered pool (``cupy.cuda.MemoryAsyncPool``, Cython; the
worker's default "async-cupy" since the fourteenth session) instead of
RMM's ``rmm_cupy_allocator``, which cuML installs at import and which runs
Python for every CuPy array (thirteenth session: 0.17-0.27 ms a small call
in the worker's samples, ``results/gpu-h200-1127/sampled.txt``). Each call
runs under one of them, the ways in turn within a case; an array is freed by
the resource that allocated it, so switching between calls is safe.
"""

import argparse
import json

import numpy as np

from e2e import labelled, timed_together


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out")
    args = parser.parse_args()

    import cuml
    import cupy
    import rmm
    from cuml.cluster import KMeans
    from cuml.linear_model import LogisticRegression
    from cuml.preprocessing import StandardScaler
    from cuml.svm import SVC

    from sklearn_gpu_bridge.worker.backends import ASYNC_POOL_KEEPS

    from rmm.allocators.cupy import rmm_cupy_allocator

    cuml.set_global_output_type("numpy")
    pooled = rmm.mr.CudaAsyncMemoryResource(release_threshold=ASYNC_POOL_KEEPS)
    ways = {"cuda": (rmm.mr.CudaMemoryResource(), rmm_cupy_allocator), "async": (pooled, rmm_cupy_allocator),
            "async, CuPy's pool": (pooled, cupy.cuda.MemoryAsyncPool().malloc)}
    rng = np.random.default_rng(0)

    small, tiny, large = labelled(5000, 20, rng), labelled(500, 20, rng), labelled(1_000_000, 50, rng)
    cases = {
        "StandardScaler fit_transform 5000x20": lambda: StandardScaler().fit_transform(small[0]),
        "LogisticRegression fit+predict 5000x20": lambda: LogisticRegression().fit(*small).predict(small[0]),
        "SVC(rbf) fit+predict 500x20": lambda: SVC().fit(*tiny).predict(tiny[0]),
        "KMeans(8) fit_predict 1M x 50": lambda: KMeans(n_clusters=8, random_state=0).fit_predict(large[0]),
        "LogisticRegression fit 1M x 50": lambda: LogisticRegression().fit(*large),
    }
    rows = {}
    for case, call in cases.items():
        def under(resource, allocator, call=call):
            def way():
                rmm.mr.set_current_device_resource(resource)
                cupy.cuda.set_allocator(allocator)
                call()
                cupy.cuda.runtime.deviceSynchronize()
            return way

        repeats = args.repeats if "1M" not in case else max(3, args.repeats // 8)
        timed = timed_together({name: under(*way) for name, way in ways.items()}, repeats)
        rows[case] = {name: t["median"] * 1e3 for name, t in timed.items()}
        print(f"{case}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in rows[case].items())
              + f"; async/cuda {rows[case]['async'] / rows[case]['cuda']:.3f}", flush=True)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"repeats": args.repeats, "median_ms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
