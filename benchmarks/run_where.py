"""Why cuML's own call takes longer in the worker's "ran" step than in the caller's process (GPU machine).

    python benchmarks/run_where.py [--repeats 60] [--out results/run-where.json]

In e2e's legs (``--parts profile``) the worker's step that runs LogisticRegression's fit took 0.8-1.0 ms
longer than the whole fit in process, its predict 0.2 ms longer; SVC's fit ran faster in the worker. Each
way here runs the call in this process and differs from the one before it in one thing the worker does:

- ``in_process``: cuML in this thread, its default allocator, the user's arrays (e2e's cuML column);
- ``async``: under the worker's allocator (CUDA's stream-ordered pool, ``use_device_memory("async")``);
- ``pinned``: the arrays in a page-locked buffer, as the worker's pool segments are;
- ``finite``: under ``assume_finite`` (the worker's ``checked_finite``);
- ``backend``: through the worker's backend, as ``Worker._op_fit`` and ``_op_call`` run it (the estimator
  built from the wrapper's parameters, ``inputs``, ``output_context``);
- ``backend_thread``: the same on one executor thread (the worker's: every call on the same thread);
- ``backend_threads``: the same on four threads in turn (a worker's threads when its watch is over).

The ways run in turn, ``gc.collect()`` before each (as e2e's table times), then again back to back.
"""

import argparse
import concurrent.futures
import itertools
import json
import time

import numpy as np

from e2e import labelled
from thread_penalty import alternate  # each way's time where it runs, the ways in turn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--out")
    args = parser.parse_args()

    import cuml
    import cupy
    import rmm
    import sklearn

    from sklearn_gpu_bridge.estimators import GPULogisticRegression, GPUStandardScaler, GPUSVC
    from sklearn_gpu_bridge.worker.backends import ASYNC_POOL_KEEPS, CumlBackend

    cuml.set_global_output_type("numpy")
    default, pool = rmm.mr.get_current_device_resource(), rmm.mr.CudaAsyncMemoryResource(
        release_threshold=ASYNC_POOL_KEEPS)
    backend = CumlBackend()  # device_memory=None: the resource is set per way below
    rng = np.random.default_rng(0)
    small, tiny = labelled(5000, 20, rng), labelled(500, 20, rng)

    pinned_buffers = []

    def pinned(array):
        """A copy of ``array`` in page-locked host memory (as a worker's pool segment is)."""
        memory = cupy.cuda.alloc_pinned_memory(array.nbytes)
        pinned_buffers.append(memory)
        copy = np.frombuffer(memory, array.dtype, array.size).reshape(array.shape)
        copy[...] = array
        return copy

    one_thread = concurrent.futures.ThreadPoolExecutor(1)
    four = [concurrent.futures.ThreadPoolExecutor(1) for _ in range(4)]
    turn = itertools.cycle(four)

    def timed(call):
        start = time.perf_counter()
        call()
        cupy.cuda.runtime.deviceSynchronize()  # the worker's settle()
        return time.perf_counter() - start

    def ways_of(cuml_call, backend_call, data):
        """cuml_call(X, y), backend_call(X, y): one call of the case's each way."""
        X, y = data
        pX, py = pinned(X), pinned(y)

        def under(resource, call):
            def way():
                rmm.mr.set_current_device_resource(resource)
                return timed(call)
            return way

        def finite(call):
            def run():
                with sklearn.config_context(assume_finite=True):
                    call()
            return run

        through_backend = under(pool, lambda: backend_call(pX, py))
        return {
            "in_process": under(default, lambda: cuml_call(X, y)),
            "async": under(pool, lambda: cuml_call(X, y)),
            "pinned": under(pool, lambda: cuml_call(pX, py)),
            "finite": under(pool, finite(lambda: cuml_call(pX, py))),
            "backend": through_backend,
            "backend_thread": lambda: one_thread.submit(through_backend).result(),
            "backend_threads": lambda: next(turn).submit(through_backend).result(),
        }

    from cuml.linear_model import LogisticRegression
    from cuml.preprocessing import StandardScaler
    from cuml.svm import SVC

    def backend_fit(wrapper, X, y, method="fit"):
        """(estimator, result) of the worker's backend fitting ``wrapper``'s class as ``Worker._op_fit`` does."""
        params = {**wrapper.get_params(), **wrapper._wire_params}
        estimator, result, _ = backend.fit(wrapper._remote_name, params, method, [X] if y is None else [X, y], {},
                                           finite=True)
        return estimator, result

    rmm.mr.set_current_device_resource(pool)
    cases = {"StandardScaler fit_transform 5000x20": (
        lambda X, y: StandardScaler().fit_transform(X),
        lambda X, y: backend_fit(GPUStandardScaler(), X, None, "fit_transform"), small)}
    for name, cuml_class, wrapper, data in (("LogisticRegression", LogisticRegression, GPULogisticRegression, small),
                                            ("SVC(rbf)", SVC, GPUSVC, tiny)):
        size = "x".join(map(str, data[0].shape))
        model, remote = cuml_class().fit(*data), backend_fit(wrapper(), *data)[0]  # the predicts' models
        cases[f"{name} fit {size}"] = (lambda X, y, c=cuml_class: c().fit(X, y),
                                       lambda X, y, w=wrapper: backend_fit(w(), X, y), data)
        cases[f"{name} predict {size}"] = (
            lambda X, y, m=model: m.predict(X),
            lambda X, y, m=remote, w=wrapper: backend.call(w._remote_name, m, "predict", [X], {}, finite=True), data)
    report = {"repeats": args.repeats, "median_ms": {}}
    for case, (cuml_call, backend_call, data) in cases.items():
        for collect in (True, False):
            label = f"{case}, {'after gc.collect()' if collect else 'back to back'}"
            medians = alternate(ways_of(cuml_call, backend_call, data), args.repeats, collect)
            report["median_ms"][label] = medians
            print(label + ":\n  " + ", ".join(f"{way} {ms:.3f}" for way, ms in medians.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
