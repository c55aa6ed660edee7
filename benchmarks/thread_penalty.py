"""Why cuML runs slower on a worker's thread than on the caller's (GPU machine).

    python benchmarks/thread_penalty.py [--repeats 80] [--out results/thread-penalty.json]

worker_share.py found StandardScaler.fit_transform 5000x20 0.9 ms slower
when run from another thread of the same process than from the thread that
calls (the worker runs every request on one of its threads). Each way here
times the call itself where it runs, so the hand-over between threads is
left out; the ways differ in one thing each:

- ``main``: in the main thread, back to back with the other ways;
- ``main_after_sleep``: the same after the main thread slept 3 ms (its core idle);
- ``thread``: on a pool thread woken for it;
- ``thread_spun``: the same after that thread spun 3 ms on the CPU (its core busy);
- ``thread_second``: the second of two calls in a row on that thread;
- ``main_second``: the second of two calls in a row in the main thread;
- ``thread_numpy``: on a thread whose cuML output type is "numpy", as the main thread's is;
- ``thread_wall``: ``thread`` timed from the caller, the hand-over included.

Then cProfile of the main thread's calls against a pool thread's, function
by function, where their own times differ most.
"""

import argparse
import concurrent.futures
import cProfile
import gc
import json
import pstats
import statistics
import time

import numpy as np

from e2e import labelled


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def ways_of(call, pool, numpy_pool):
    def on(executor, job):
        return lambda: executor.submit(job).result()

    def wall():
        start = time.perf_counter()
        pool.submit(call).result()
        return time.perf_counter() - start

    return {
        "main": lambda: timed(call),
        "main_after_sleep": lambda: (time.sleep(0.003), timed(call))[1],
        "thread": on(pool, lambda: timed(call)),
        "thread_spun": on(pool, lambda: (spin(0.003), timed(call))[1]),
        "thread_second": on(pool, lambda: (call(), timed(call))[1]),
        "main_second": lambda: (call(), timed(call))[1],
        "thread_numpy": on(numpy_pool, lambda: timed(call)),
        "thread_wall": wall,
    }


def alternate(ways, repeats, collect):
    names = list(ways)
    for name in names:
        ways[name]()
    times = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            if collect:
                gc.collect()
            times[name].append(ways[name]())
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def profile_diff(call, pool, calls=40, top=25):
    """(function, main ms per call, thread ms per call) where own times differ most."""
    def profiled():
        profiler = cProfile.Profile()
        for _ in range(calls):
            profiler.runcall(call)
        return pstats.Stats(profiler).stats

    main, thread = profiled(), pool.submit(profiled).result()
    rows = []
    for key in set(main) | set(thread):
        own_main = main.get(key, (0, 0, 0, 0))[2] / calls * 1e3
        own_thread = thread.get(key, (0, 0, 0, 0))[2] / calls * 1e3
        rows.append((f"{key[0].rsplit('/', 2)[-1]}:{key[1]}({key[2]})", own_main, own_thread))
    rows.sort(key=lambda r: -abs(r[2] - r[1]))
    total = (sum(r[1] for r in rows), sum(r[2] for r in rows))
    return total, rows[:top]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=80)
    parser.add_argument("--out")
    args = parser.parse_args()

    import cuml
    from cuml.linear_model import LogisticRegression
    from cuml.preprocessing import StandardScaler

    cuml.set_global_output_type("numpy")
    X, y = labelled(5000, 20, np.random.default_rng(0))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    numpy_pool = concurrent.futures.ThreadPoolExecutor(1, initializer=cuml.set_global_output_type,
                                                       initargs=("numpy",))
    cases = {
        "StandardScaler fit_transform 5000x20": lambda: StandardScaler().fit_transform(X),
        "LogisticRegression fit+predict 5000x20": lambda: LogisticRegression().fit(X, y).predict(X),
    }
    report = {"repeats": args.repeats, "median_ms": {}, "profile": {}}
    for case, call in cases.items():
        for collect in (False, True):
            label = f"{case}, {'after gc.collect()' if collect else 'no gc.collect()'}"
            medians = alternate(ways_of(call, pool, numpy_pool), args.repeats, collect)
            report["median_ms"][label] = medians
            print(label + ":\n  " + ", ".join(f"{way} {ms:.3f}" for way, ms in medians.items()), flush=True)
        (total_main, total_thread), rows = profile_diff(call, pool)
        report["profile"][case] = {"own_ms_total": [total_main, total_thread], "rows": rows}
        print(f"  cProfile, own ms per call: main {total_main:.3f}, thread {total_thread:.3f}; most different:")
        for name, own_main, own_thread in rows:
            print(f"    {own_main:8.4f} {own_thread:8.4f}  {name}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
