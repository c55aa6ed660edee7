"""Per-call overhead and transport throughput of the bridge, against the same work in process.

Measures, against a REAL worker subprocess that this script starts and stops:

1. latency of the smallest round trips: ``ping`` and ``status`` (quick ops
   answered by the worker's main thread), ``echo`` with no arrays (a work op:
   executor thread and back), and the public ``ping`` (a new socket each time);
2. StandardScaler ``fit_transform`` on 5000x20 and on 10000x1280 (51 MB in
   float32, the dtype that travels) bridged (``GPUStandardScaler``) and in
   this process (the same class of the worker's backend: scikit-learn's, or
   cuML's with output type numpy), through each transport the client can use;
3. round-trip throughput of ``Connection.echo`` for 1, 51 and 200 MB float32
   arrays through the pool and as frames, inline arrays at the sizes that
   travel inline (at most ``protocol.INLINE_MAX`` bytes, both ways), and a
   plain memcpy (``np.copyto`` there and back) of the same sizes.

Throughput is ``2 x bytes / seconds`` (the bytes go there and back), in
MB/s with MB = 10**6 bytes. Every bridged measurement records the client's
transport counters, so the path that was really used is in the results.

Targets (a benchmark, not a test; evaluated in the JSON under "targets"):
the 5000x20 overhead at most 1 ms (median), and a 51 MB fit_transform at
most 20 ms slower than in process.

    python benchmarks/overhead.py --backend sklearn --out benchmarks/results/cpu/overhead.json
    python benchmarks/overhead.py --backend cuml --out benchmarks/results/gpu-h200/overhead.json
"""

import argparse
import gc
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

import sklearn_gpu_bridge
from sklearn_gpu_bridge import parallel
from sklearn_gpu_bridge.manage.launcher import LaunchedWorker
from sklearn_gpu_bridge.protocol import INLINE_MAX

MB = 1_000_000
FIT_CASES = {"5000x20": (5000, 20), "10000x1280": (10000, 1280)}  # float32: 0.4 MB, 51.2 MB
TRANSPORT_MB = (1, 51, 200)
INLINE_BYTES = (4 * 1024, INLINE_MAX)  # inline is used up to INLINE_MAX bytes only
DTYPE = np.float32  # what the bridge sends to cuML; used for every backend so that sizes match
TARGET_OVERHEAD_MS = 1.0
TARGET_51MB_EXTRA_MS = 20.0


# ---------------------------------------------------------------- the worker


class WorkerProcess(LaunchedWorker):
    """A worker in a temp folder (LaunchedWorker); the folder goes when it stops."""

    def __init__(self, backend, startup_timeout):
        super().__init__(tempfile.mkdtemp(prefix="sgb-bench-"), backend=backend, timeout=startup_timeout,
                         parent_pid=os.getpid(), log_level="WARNING")
        self.startup_seconds = self.ready_seconds

    def stop(self):
        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def use_transport(connection_file, transport):
    """Point the client at the worker with the pool on ("auto") or off (frames); a fresh connection.

    The array cache is off: the same array is sent again and again here, and the
    transport, not the cache, is what is measured.
    """
    sklearn_gpu_bridge.reset_connection()
    sklearn_gpu_bridge.set_config(
        connection_file=str(connection_file), start_local_worker=False,
        pool="off" if transport == "frames" else "auto", array_cache="off",
    )
    return sklearn_gpu_bridge.get_connection()


# ---------------------------------------------------------------- timing


def timed(fn, repeats, warmup):
    """``warmup`` untimed calls, then ``repeats`` timed ones; seconds of each timed call."""
    for _ in range(warmup):
        fn()
    gc.collect()
    return [clock(fn) for _ in range(repeats)]


def clock(fn):
    """Seconds that one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summary(times):
    t = np.asarray(times)
    return {
        "n": int(t.size), "median": float(np.median(t)), "min": float(t.min()),
        "p90": float(np.percentile(t, 90)), "mean": float(t.mean()),
    }


def stats_delta(conn, before):
    return {k: v - before.get(k, 0) for k, v in conn.stats.items() if v - before.get(k, 0)}


def path_of(delta):
    """The transport the arrays really took, from the client's counters ("pool", "frame", "inline", mixes)."""
    where = sorted({k.split("_", 1)[1] for k in delta})
    return "+".join(where) if where else "none"


def pool_room(conn, nbytes):
    """None if the pool has room for ``nbytes`` more (its folder, or memory for memfd segments), else why not."""
    if conn.pool.directory is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        where = "memory"
    else:
        free, where = shutil.disk_usage(conn.pool.directory).free, conn.pool.directory
    if free < nbytes + 64 * MB:
        return f"{where} has {free / MB:.0f} MB free, {nbytes / MB:.0f} MB needed"
    return None


# ---------------------------------------------------------------- the in-process baseline


def in_process_scaler(backend):
    """A factory of the StandardScaler that the worker's backend runs, here in this process."""
    if backend == "cuml":
        import cuml
        from cuml.preprocessing import StandardScaler

        cuml.set_global_output_type("numpy")
        return StandardScaler, {"cuml": cuml.__version__}
    from sklearn.preprocessing import StandardScaler

    return StandardScaler, {}


# ---------------------------------------------------------------- the measurements


def measure_latency(connection_file, repeats, warmup):
    """The floors under every call.

    ping: a quick op on the connection's own socket, answered by the worker's
    main thread (``transport.roundtrip``: the public ``ping`` opens a new
    socket each time, as the heartbeat does, and is timed separately);
    status: a quick op that also asks the backend for its versions;
    echo with no arrays: a work op, through the worker's executor thread.
    The ``_after_idle`` pair sleeps 5 ms before each call, as a user's code
    between two calls would: the threads on both sides have gone to sleep.
    """
    conn = use_transport(connection_file, "pool")

    def ping():
        conn.transport.roundtrip({"op": "ping"}, timeout=10.0)

    def after_idle(fn):
        times = []
        for _ in range(repeats):
            time.sleep(0.005)
            times.append(clock(fn))
        return summary(times)

    return {
        "ping_roundtrip": summary(timed(ping, repeats, warmup)),
        "status_roundtrip": summary(timed(conn.status, repeats, warmup)),
        "echo_empty_roundtrip": summary(timed(conn.echo, repeats, warmup)),
        "ping_new_socket": summary(timed(conn.ping, repeats, warmup)),
        "ping_roundtrip_after_idle": after_idle(ping),
        "echo_empty_roundtrip_after_idle": after_idle(conn.echo),
    }


def measure_fit_transform(connection_file, transports, scaler, backend, args, rng):
    """In process first, then bridged through each transport: the same data, the same repeats."""
    results = []
    for case, shape in FIT_CASES.items():
        X = rng.standard_normal(shape).astype(DTYPE)
        repeats = args.large_repeats if X.nbytes > 10 * MB else args.repeats
        in_process = lambda: scaler().fit_transform(X)  # noqa: E731
        bridged = lambda: sklearn_gpu_bridge.GPUStandardScaler().fit_transform(X)  # noqa: E731
        expected = in_process()
        entry = {"case": case, "shape": list(shape), "dtype": np.dtype(DTYPE).name, "mb": X.nbytes / MB,
                 "in_process": summary(timed(in_process, repeats, args.warmup)), "bridged": {}}
        for transport in transports:
            conn = use_transport(connection_file, transport)
            if transport == "pool" and conn.pool is None:
                entry["bridged"][transport] = {"skipped": "the worker cannot map this client's pool"}
                continue
            if transport == "pool" and (why := pool_room(conn, 3 * X.nbytes)):
                entry["bridged"][transport] = {"skipped": why}
                continue
            tol = 0 if backend == "sklearn" else 1e-4
            np.testing.assert_allclose(bridged(), expected, rtol=tol, atol=tol)
            before = dict(conn.stats)
            times = timed(bridged, repeats, args.warmup)
            delta = stats_delta(conn, before)
            entry["bridged"][transport] = {
                **summary(times), "path": path_of(delta), "counters": delta,
                "extra_ms": (float(np.median(times)) - entry["in_process"]["median"]) * 1e3,
            }
        results.append(entry)
    return results


def measure_transport(connection_file, transports, args):
    rng = np.random.default_rng(1)
    arrays = [(f"{n // 1024} KiB", rng.standard_normal(n // 4).astype(DTYPE)) for n in INLINE_BYTES]
    arrays += [(f"{n} MB", rng.standard_normal(n * MB // 4).astype(DTYPE)) for n in TRANSPORT_MB]
    results = []
    for transport in transports:
        conn = use_transport(connection_file, transport)
        for label, arr in arrays:
            inline = arr.nbytes <= INLINE_MAX
            if transport == "frames" and inline:
                continue  # the same inline path as with the pool on: measured once
            path = "inline" if inline else transport
            entry = {"size": label, "bytes": arr.nbytes, "path": path}
            if transport == "pool" and conn.pool is None:
                entry["skipped"] = "the worker cannot map this client's pool"
            elif transport == "pool" and not inline and (why := pool_room(conn, 3 * arr.nbytes)):
                entry["skipped"] = why
            if "skipped" in entry:
                results.append(entry)
                continue
            (back,) = conn.echo(arr)
            assert np.array_equal(back, arr), f"echo of {label} through {path} changed the array"
            del back
            repeats = args.large_repeats if arr.nbytes > 10 * MB else args.repeats
            before = dict(conn.stats)
            times = timed(lambda: conn.echo(arr), repeats, args.warmup)
            delta = stats_delta(conn, before)
            median = float(np.median(times))
            entry.update(summary(times), observed=path_of(delta), counters=delta,
                         mb_per_s=2 * arr.nbytes / median / MB)
            results.append(entry)
    return results


def measure_memcpy(args):
    """Copies there and back (like a round trip) between two touched buffers: numpy's one-thread
    ``np.copyto`` against the bridge's ``copy_into`` (parallel chunks for large arrays)."""
    results = []
    for n in TRANSPORT_MB:
        a = np.ones(n * MB // 4, DTYPE)
        b = np.empty_like(a)
        a_bytes, b_bytes = a.view(np.uint8), b.view(np.uint8)
        repeats = args.large_repeats if n * MB > 10 * MB else args.repeats
        row = {"size": f"{n} MB", "bytes": a.nbytes, "threads": parallel.THREADS}
        for name, copy in (("np_copyto", np.copyto), ("copy_into", parallel.copy_into)):
            def both_ways(copy=copy):
                copy(b_bytes, a_bytes)
                copy(a_bytes, b_bytes)

            times = timed(both_ways, repeats, args.warmup)
            row[name] = {**summary(times), "mb_per_s": 2 * a.nbytes / float(np.median(times)) / MB}
        results.append(row)
    return results


# ---------------------------------------------------------------- report


def machine_info(worker_versions, local_versions):
    import sklearn

    return {
        "platform": platform.platform(), "machine": platform.machine(), "processor": cpu_model(),
        "host": socket.gethostname(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "numpy": np.__version__, "scikit-learn": sklearn.__version__,
        "cuml": local_versions.get("cuml") or worker_versions.get("cuml"),
        "gpu": worker_versions.get("gpu"), "worker_versions": worker_versions,
        "sklearn_gpu_bridge": source_state(),
    }


def cpu_model():
    """The CPU's name (/proc/cpuinfo on Linux; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def source_state():
    """The checkout measured: ``git describe --always --dirty`` where there is one, else the version."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = None
    return {"version": sklearn_gpu_bridge.__version__, "git": described}


def targets(fit):
    by_case = {e["case"]: e for e in fit}
    out = {}
    for key, case, limit in (("overhead_5000x20_median_ms", "5000x20", TARGET_OVERHEAD_MS),
                             ("fit_transform_51MB_extra_ms", "10000x1280", TARGET_51MB_EXTRA_MS)):
        bridged = by_case[case]["bridged"]
        default = bridged.get("pool") if "extra_ms" in bridged.get("pool", {}) else bridged.get("frames")
        value = default["extra_ms"] if default and "extra_ms" in default else None
        out[key] = {
            "value": value, "limit": limit, "path": default.get("path") if default else None,
            "met": None if value is None else bool(value <= limit),
        }
    return out


def ms(seconds):
    return f"{seconds * 1e3:9.3f}"


def print_report(report):
    print(f"\nbackend {report['backend']['worker']}  |  {report['machine']['platform']}  |  "
          f"{report['machine']['cpu_count']} CPUs  |  GPU {report['machine']['gpu'] or '-'}")
    print("\nround trips (ms)               median       min       p90")
    for name, s in report["latency"].items():
        print(f"  {name:26s} {ms(s['median'])} {ms(s['min'])} {ms(s['p90'])}")
    print("\nStandardScaler.fit_transform (ms)   median       min       p90   extra vs in process")
    for e in report["fit_transform"]:
        s = e["in_process"]
        print(f"  {e['case']:11s} in process        {ms(s['median'])} {ms(s['min'])} {ms(s['p90'])}")
        for transport, b in e["bridged"].items():
            if "skipped" in b:
                print(f"  {e['case']:11s} bridged {transport:9s} skipped: {b['skipped']}")
                continue
            print(f"  {e['case']:11s} bridged {transport:9s} {ms(b['median'])} {ms(b['min'])} {ms(b['p90'])}"
                  f"   {b['extra_ms']:+9.3f}  ({b['path']})")
    print("\necho round trip                   median ms       MB/s   path seen")
    for e in report["transport"]:
        if "skipped" in e:
            print(f"  {e['size']:8s} {e['path']:7s}  skipped: {e['skipped']}")
            continue
        print(f"  {e['size']:8s} {e['path']:7s}  {ms(e['median'])}  {e['mb_per_s']:9.0f}   {e['observed']}")
    for e in report["memcpy"]:
        for name in ("np_copyto", "copy_into"):
            print(f"  {e['size']:8s} {name:10s} {ms(e[name]['median'])}  {e[name]['mb_per_s']:9.0f}")
    print("\ntargets")
    for name, t in report["targets"].items():
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        print(f"  {name:30s} {value:>9s} <= {t['limit']:g}: {t['met']}  ({t['path']})")


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="auto", choices=["sklearn", "cuml", "auto"],
                        help="backend of the worker this script starts (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=200,
                        help="timed calls per small case: round trips, 5000x20, inline, 1 MB (default: %(default)s)")
    parser.add_argument("--large-repeats", type=int, default=15,
                        help="timed calls per case of 51 MB and more (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before each case (default: %(default)s)")
    parser.add_argument("--transports", default="pool,frames",
                        help="comma-separated: pool (shared mmap pool), frames (pool off) (default: %(default)s)")
    parser.add_argument("--pool-directory", default=None, help="folder of the pool files (default: the library's)")
    parser.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds to wait for the worker to be ready (cuML warms up) (default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="JSON file (default: overhead-<backend>-<host>.json here)")
    args = parser.parse_args(argv)
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not set(args.transports) <= {"pool", "frames"} or not args.transports:
        parser.error("--transports takes pool and/or frames")
    if min(args.repeats, args.large_repeats) < 1 or args.warmup < 0:
        parser.error("repeats must be at least 1, warmup at least 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    if args.pool_directory:
        sklearn_gpu_bridge.set_config(pool_directory=args.pool_directory)
    worker = WorkerProcess(args.backend, args.startup_timeout)
    try:
        conn = use_transport(worker.connection_file, "pool")
        backend = conn.capabilities.backend
        status = conn.status()
        print(f"worker ready in {worker.startup_seconds:.1f} s: backend {backend}, "
              f"pool {'on' if conn.pool is not None else 'off (frames)'}", flush=True)
        scaler, local_versions = in_process_scaler(backend)
        rng = np.random.default_rng(0)
        report = {
            "benchmark": "overhead",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(status.get("versions", {}), local_versions),
            "backend": {"requested": args.backend, "worker": backend,
                        "fallback_reason": conn.capabilities.fallback_reason,
                        "float_dtype": conn.capabilities.float_dtype},
            "params": {
                "repeats": args.repeats, "large_repeats": args.large_repeats, "warmup": args.warmup,
                "transports": args.transports, "dtype": np.dtype(DTYPE).name, "inline_max": INLINE_MAX,
                "pool_directory": conn.pool.directory if conn.pool is not None else None,
                "worker_startup_s": worker.startup_seconds,
                "mb": MB, "throughput": "2 x bytes / median seconds (there and back)",
                "in_process": f"{scaler.__module__}.{scaler.__name__}",
                "bridged": "sklearn_gpu_bridge.GPUStandardScaler",
            },
            "latency": measure_latency(worker.connection_file, args.repeats, args.warmup),
        }
        report["fit_transform"] = measure_fit_transform(
            worker.connection_file, args.transports, scaler, backend, args, rng)
        report["transport"] = measure_transport(worker.connection_file, args.transports, args)
        report["memcpy"] = measure_memcpy(args)
        report["targets"] = targets(report["fit_transform"])
        report["params"]["total_s"] = time.perf_counter() - started
    except BaseException:
        print(f"worker log:\n{worker.log()[-4000:]}", file=sys.stderr)
        raise
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
    print_report(report)
    out = Path(args.out or f"overhead-{backend}-{socket.gethostname()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
