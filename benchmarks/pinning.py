"""Does cuML read the pool faster when the worker pins it? (GPU machine)

    python benchmarks/pinning.py [--repeats 7] [--out results/pinning.json]

The worker hands cuML numpy views of the client's pool (a memfd it maps).
Host-to-device copies from pageable memory go through the driver's staging
buffers; from page-locked ("pinned") memory they are one DMA. This times,
in one process, medians of ``repeats``:

- ``copy``: ``cupy.asarray`` of 200 MB float32, and ``.get(out=...)`` back,
  from a numpy array on the heap, from a memfd mapping, and from the same
  mapping after ``cudaHostRegister`` (and what registering cost);
- the large cases of ``e2e.py`` that read the most (KMeans 1M x 50,
  LogisticRegression 1M x 50, the neighbour cases) with X on the heap, in
  the memfd and in the registered memfd.
"""

import argparse
import json
import mmap
import os
import time

import numpy as np


def memfd_array(shape, dtype):
    """An array in a memfd mapping: what the worker sees of a client's pool."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    fd = os.memfd_create("sgb-pinning-probe")
    os.ftruncate(fd, nbytes)
    mapped = mmap.mmap(fd, nbytes)
    os.close(fd)
    return np.frombuffer(mapped, dtype).reshape(shape)


def median_ms(run, repeats):
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return round(float(np.median(times)) * 1e3, 3)


def registration_costs(runtime, ways_factory):
    """ms to register (and unregister) a memfd mapping of 64 MiB and 256 MiB, untouched and written."""
    costs = {}
    for mib in (64, 256):
        for touched in (False, True):
            X = ways_factory((mib << 20,), np.uint8)
            if touched:
                X[...] = 1
            start = time.perf_counter()
            runtime.hostRegister(X.ctypes.data, X.nbytes, 0)
            registered = time.perf_counter()
            runtime.hostUnregister(X.ctypes.data)
            costs[f"{mib}MiB_{'written' if touched else 'untouched'}"] = {
                "register_ms": round((registered - start) * 1e3, 3),
                "unregister_ms": round((time.perf_counter() - registered) * 1e3, 3)}
    return costs


def fit_while_registering(runtime, fit, X, repeats):
    """A fit's median ms alone, and while another thread registers (and unregisters) 1 GB again and again."""
    import threading

    alone = median_ms(lambda: fit(X), repeats)
    stop = threading.Event()
    big = memfd_array((1 << 30,), np.uint8)
    big[...] = 1
    rounds = [0]

    def register_again_and_again():
        while not stop.is_set():
            runtime.hostRegister(big.ctypes.data, big.nbytes, 0)
            runtime.hostUnregister(big.ctypes.data)
            rounds[0] += 1

    thread = threading.Thread(target=register_again_and_again)
    thread.start()
    try:
        together = median_ms(lambda: fit(X), repeats)
    finally:
        stop.set()
        thread.join()
    return {"alone_ms": alone, "while_registering_ms": together, "registrations": rounds[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()

    import cupy
    import cuml
    from cuml.cluster import KMeans
    from cuml.linear_model import LogisticRegression
    from cuml.neighbors import KNeighborsClassifier, NearestNeighbors

    cuml.set_global_output_type("numpy")
    runtime = cupy.cuda.runtime
    rng = np.random.default_rng(0)
    report = {"repeats": args.repeats, "gpu": runtime.getDeviceProperties(0)["name"].decode(),
              "cupy": cupy.__version__, "cuml": cuml.__version__}

    def sync(run):
        def synced():
            run()
            cupy.cuda.runtime.deviceSynchronize()
        return synced

    def three_ways(shape, fill):
        """X on the heap, in a memfd, in a registered memfd; and the registration's cost in ms."""
        heap = fill(shape)
        shared = memfd_array(shape, heap.dtype)
        shared[...] = heap
        pinned = memfd_array(shape, heap.dtype)
        pinned[...] = heap
        start = time.perf_counter()
        runtime.hostRegister(pinned.ctypes.data, pinned.nbytes, 0)
        registered_ms = (time.perf_counter() - start) * 1e3
        return {"heap": heap, "memfd": shared, "memfd_registered": pinned}, round(registered_ms, 3)

    normal = lambda shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    ways, report["register_200MB_ms"] = three_ways((1_000_000, 50), normal)
    device = cupy.empty((1_000_000, 50), np.float32)
    report["copy_200MB"] = {
        name: {"to_device_ms": median_ms(sync(lambda X=X: device.set(X)), args.repeats),
               "asarray_ms": median_ms(sync(lambda X=X: cupy.asarray(X)), args.repeats),
               "to_host_ms": median_ms(sync(lambda X=X: device.get(out=X)), args.repeats)}
        for name, X in ways.items()}
    print("register 200 MB:", report["register_200MB_ms"], "ms;", json.dumps(report["copy_200MB"]), flush=True)

    y = (ways["heap"][:, :5].sum(axis=1) > 0).astype(np.int32)
    cases = {
        "KMeans(8) fit_predict 1M x 50": lambda X: KMeans(n_clusters=8, random_state=0, n_init=1).fit_predict(X),
        "LogisticRegression fit 1M x 50": lambda X: LogisticRegression().fit(X, y),
    }
    report["cases"] = {}
    for case, run in cases.items():
        report["cases"][case] = {name: median_ms(lambda X=X: run(X), args.repeats) for name, X in ways.items()}
        print(case, report["cases"][case], flush=True)
    runtime.hostUnregister(ways["memfd_registered"].ctypes.data)
    del ways

    small, _ = three_ways((100_000, 32), normal)
    queries, _ = three_ways((10_000, 32), normal)
    labels = (small["heap"][:, :5].sum(axis=1) > 0).astype(np.int32)
    neighbours = {
        "NearestNeighbors(5) 10k queries on 100k x 32":
            lambda X, Q: NearestNeighbors(n_neighbors=5).fit(X).kneighbors(Q),
        "KNeighborsClassifier fit+predict 100k / 10k x 32":
            lambda X, Q: KNeighborsClassifier(n_neighbors=5).fit(X, labels).predict(Q),
    }
    for case, run in neighbours.items():
        report["cases"][case] = {name: median_ms(lambda X=X, Q=queries[name]: run(X, Q), args.repeats)
                                 for name, X in small.items()}
        print(case, report["cases"][case], flush=True)
    report["register"] = registration_costs(runtime, ways_factory=memfd_array)
    print("register:", report["register"], flush=True)
    report["fit_while_registering"] = fit_while_registering(runtime, cases["KMeans(8) fit_predict 1M x 50"],
                                                            normal((1_000_000, 50)), args.repeats)
    print("KMeans while another thread registers 1 GB:", report["fit_while_registering"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
