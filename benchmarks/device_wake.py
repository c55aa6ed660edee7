"""Whether a small cuML call after an idle gap gets faster when the GPU is given work a moment before it.

    python benchmarks/device_wake.py [--gap-ms 100] [--lead-ms 0.5] [--runs 40] [--out results/...json]

After a reply, the worker's thread watches for the next request for 3 ms, then sleeps; the client rings
before it checks its input (``Connection.heads_up``), and the worker's thread watches again while the client
checks, some 0.3-0.7 ms. The thread is then awake when the request comes; the GPU has had nothing to do
since the last call. This times, in process, each call after ``--gap-ms`` of sleep, five ways, in turn:

- back to back (no gap);
- after the gap;
- after the gap and ``--lead-ms`` of busy waiting on this thread (the worker's watch);
- the same, with a poke of the device at the start of the wait: one tiny kernel, not waited for;
- the same, with the poke waited for (a stream synchronize).

Calls: LogisticRegression.predict and StandardScaler.transform on 5000 x 20 float32 (numpy in, numpy
out, as the table's cases), LogisticRegression.fit, and a bare device round trip (CuPy: copy X to the
device, sum it, read the sum back). Medians in milliseconds; the wait is not timed.
"""

import argparse
import time

import numpy as np

from client_checks import report


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap-ms", type=float, default=100.0)
    parser.add_argument("--lead-ms", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--out")
    args = parser.parse_args()
    import cupy
    import cuml

    rng = np.random.default_rng(0)
    X = rng.standard_normal((5000, 20)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int32)
    model = cuml.LogisticRegression(output_type="numpy").fit(X, y)
    scaler = cuml.preprocessing.StandardScaler().fit(X)
    calls = {
        "LogisticRegression.predict": lambda: model.predict(X),
        "StandardScaler.transform": lambda: scaler.transform(X),
        "LogisticRegression.fit": lambda: cuml.LogisticRegression(output_type="numpy").fit(X, y),
        "device round trip (CuPy)": lambda: float(cupy.asarray(X).sum()),
    }
    target = cupy.zeros(1, dtype=cupy.float32)
    stream = cupy.cuda.get_current_stream()

    def poke():
        target.fill(0)

    def poke_waited():
        target.fill(0)
        stream.synchronize()

    gap, lead = args.gap_ms / 1000, args.lead_ms / 1000
    ways = {
        "back to back": lambda: None,
        "after the gap": lambda: time.sleep(gap),
        "after the gap, then the lead": lambda: (time.sleep(gap), spin(lead)),
        "after the gap, poke, then the lead": lambda: (time.sleep(gap), poke(), spin(lead)),
        "after the gap, poke waited, then the lead": lambda: (time.sleep(gap), poke_waited(), spin(lead)),
    }
    for call in calls.values():  # warm: kernels compiled, memory pooled
        for _ in range(5):
            call()
    for before in (poke, poke_waited):
        before()
    times = {name: {way: [] for way in ways} for name in calls}
    for run in range(args.runs):
        for name, call in calls.items():
            order = list(ways)[run % len(ways):] + list(ways)[:run % len(ways)]
            for way in order:
                ways[way]()
                start = time.perf_counter()
                call()
                times[name][way].append(time.perf_counter() - start)
    medians = {name: {way: float(np.median(t)) * 1e3 for way, t in by_way.items()} for name, by_way in times.items()}
    for name, by_way in medians.items():
        print(name + ": " + ", ".join(f"{way} {ms:.3f}" for way, ms in by_way.items()), flush=True)
    report({"cuml": cuml.__version__, "gap_ms": args.gap_ms, "lead_ms": args.lead_ms, "runs": args.runs,
            "milliseconds a call (median)": medians}, args.out)


if __name__ == "__main__":
    main()
