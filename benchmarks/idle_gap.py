"""A small call after each kind of pause, through the bridge and in process, in turn (issue 15, target 1).

The README's table times every call after a ``gc.collect()``, and between two
bridged calls of a case it also runs scikit-learn and cuML: the worker has
been idle for tens of milliseconds. After a reply, a worker thread watches for
the client's next request for the worker's ``watch_ms`` (3 ms by default),
then sleeps until the client rings. This measures what a pause
costs each way:

- pauses: none, ``gc.collect()``, a sleep of 1, 10 and 100 ms, and 10 ms of
  numpy work on this core. The ways take turns, so between two bridged calls
  come the in-process ones too (2-10 ms for StandardScaler): "none" is not
  back to back for the worker, whose default watch is shorter;
- workers, one after the other: ``watch_ms`` of ``--short-watch-ms`` (3, the
  default) and ``--long-watch-ms`` (200, LLVM OpenMP's spin before it sleeps);
- ways, with each worker: the bridge, cuML in process under cuML's default
  allocator (``cuda``) and under the pool the worker uses (``async``).

The worker's CPU time over each phase is recorded too: what the watch costs.

Each way's call follows its own pause; the ways run in turn within a pause.
With ``--backend sklearn`` (no cuML), "in process" is scikit-learn, and the
client spins for its replies as it does by default beside a cuML worker
(``reply_wait="spin"``): the worker watches only for a client that spins.

    python benchmarks/idle_gap.py --out benchmarks/results/idle-gap.json    # GPU machine
    python benchmarks/idle_gap.py --backend sklearn --repeats 20       # anywhere
"""

import argparse
import gc
import json
import os
import time
from pathlib import Path

import numpy as np

import sklearn_gpu_bridge
from e2e import WorkerProcess, labelled

PAUSES = {
    "none": lambda: None,
    "gc.collect()": gc.collect,
    "sleep 1 ms": lambda: time.sleep(0.001),
    "sleep 10 ms": lambda: time.sleep(0.010),
    "sleep 100 ms": lambda: time.sleep(0.100),
    "numpy 10 ms": None,  # set in main: depends on how fast this core is
}


def busy_for(seconds):
    """numpy work on this thread for about ``seconds`` (what a script does between two calls)."""
    a = np.random.default_rng(1).standard_normal((256, 256))
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < seconds:
        a = a @ a.T * 1e-3
        n += 1
    return n


def worker_cpu_seconds(pid):
    """User and system CPU seconds of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def in_process_ways(backend):
    """{way: (make estimator) -> callable that runs it}: cuML under each allocator, or scikit-learn."""
    if backend == "sklearn":
        return {"sklearn": lambda call: call}
    import cupy
    import rmm

    from sklearn_gpu_bridge.worker.backends import ASYNC_POOL_KEEPS

    resources = {"cuml cuda": rmm.mr.CudaMemoryResource(),
                 "cuml async": rmm.mr.CudaAsyncMemoryResource(release_threshold=ASYNC_POOL_KEEPS)}

    def under(resource):
        def wrap(call):
            def way():
                rmm.mr.set_current_device_resource(resource)
                call()
                cupy.cuda.runtime.deviceSynchronize()
            return way
        return wrap

    return {name: under(resource) for name, resource in resources.items()}


def cases(backend):
    """{case: (in-process callable, bridged callable)}."""
    X, y = labelled(5000, 20, np.random.default_rng(0))
    if backend == "cuml":
        import cuml

        cuml.set_global_output_type("numpy")
        from cuml.linear_model import LogisticRegression
        from cuml.preprocessing import StandardScaler
    else:
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler
    return {
        "StandardScaler fit_transform 5000x20": (
            lambda: StandardScaler().fit_transform(X),
            lambda: sklearn_gpu_bridge.GPUStandardScaler().fit_transform(X)),
        "LogisticRegression fit+predict 5000x20": (
            lambda: LogisticRegression().fit(X, y).predict(X),
            lambda: sklearn_gpu_bridge.GPULogisticRegression().fit(X, y).predict(X)),
    }


def measure(runs, pauses, repeats):
    """{pause: {way: median ms}}: each call after its pause, the ways in turn."""
    out = {}
    names = list(runs)
    for pause_name, pause in pauses.items():
        for run in runs.values():
            run()
        times = {name: [] for name in names}
        for r in range(repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                pause()
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
        out[pause_name] = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuml", choices=["cuml", "sklearn"])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--short-watch-ms", type=float, default=3.0)
    parser.add_argument("--long-watch-ms", type=float, default=200.0)
    parser.add_argument("--out")
    args = parser.parse_args()

    rounds = busy_for(0.2) / 20  # matrix products in 10 ms on this core
    PAUSES["numpy 10 ms"] = lambda: busy_for(0.010)
    report = {"backend": args.backend, "repeats": args.repeats, "numpy_10ms_products": rounds, "phases": {},
              "worker_cpu": {}}
    wrap = in_process_ways(args.backend)
    for watch_ms in (args.short_watch_ms, args.long_watch_ms):
        phase = f"watch {watch_ms:g} ms"
        worker = None
        try:
            worker = WorkerProcess(args.backend, watch_ms=watch_ms)
            cpu_before, wall_before = worker_cpu_seconds(worker.pid), time.monotonic()
            sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False,
                                          reply_wait="spin" if args.backend == "sklearn" else "auto")
            rows = {}
            for case, (in_process, bridged) in cases(args.backend).items():
                runs = {"bridge": bridged, **{name: w(in_process) for name, w in wrap.items()}}
                rows[case] = measure(runs, PAUSES, args.repeats)
                for pause, ms in rows[case].items():
                    line = ", ".join(f"{way} {v:.3f}" for way, v in ms.items())
                    over = ", ".join(f"bridge - {way} {ms['bridge'] - v:+.2f}" for way, v in ms.items()
                                     if way != "bridge")
                    print(f"[{phase}] {case} | after {pause}: {line} ms | {over}", flush=True)
            report["phases"][phase] = rows
            cpu, wall = worker_cpu_seconds(worker.pid) - cpu_before, time.monotonic() - wall_before
            report["worker_cpu"][phase] = {"cpu_s": cpu, "wall_s": wall}
            print(f"[{phase}] the worker used {cpu:.1f} s of CPU in {wall:.1f} s", flush=True)
        finally:
            sklearn_gpu_bridge.reset_connection()
            if worker is not None:
                worker.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
