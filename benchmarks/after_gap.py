"""What a gap before a call costs steps that touch nothing large, in one process with no worker (issue 15).

    python benchmarks/after_gap.py [--runs 40] [--gap-ms 85] [--out results/...json]

- "steps": right after a gap, in this order: a Python function call, a small numpy call and the same call
  again, entering and leaving ``np.errstate``, the sum of a 5000 x 20 float32 array (400 KB) and its copy;
  after no gap, after a sleep of ``--gap-ms``, after a busy wait as long (the core kept busy on a loop that
  touches none of them), and after a busy wait on the small numpy call itself.
- "finite check": the bridge's check of such an X (``_plain_validation``: its sum under ``np.errstate``)
  against summing it in float64 (which cannot overflow, so needs no ``np.errstate``), in turn, after no gap
  and after a sleep.

Medians in µs of ``--runs`` runs, the first five left out.
"""

import argparse
import time

import numpy as np

from client_checks import report

GAPS = ("none", "sleep", "busy", "busy on the small call")
STEPS = ("python call", "small numpy call", "the same again", "np.errstate", "sum 400 KB", "copy 400 KB")


def _gap(kind, seconds, small):
    if kind == "sleep":
        time.sleep(seconds)
    elif kind != "none":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if kind == "busy on the small call":
                small.sum()


def _steps(X, out, small):
    """ns of each of STEPS, run once in turn."""
    def call():
        return 1

    stamps = [time.perf_counter_ns()]
    call()
    stamps.append(time.perf_counter_ns())
    small.sum()
    stamps.append(time.perf_counter_ns())
    small.sum()
    stamps.append(time.perf_counter_ns())
    with np.errstate(over="ignore"):
        pass
    stamps.append(time.perf_counter_ns())
    X.sum()
    stamps.append(time.perf_counter_ns())
    np.copyto(out, X)
    stamps.append(time.perf_counter_ns())
    return np.diff(stamps)


def steps_after_gaps(runs, seconds):
    X = np.random.default_rng(0).standard_normal((5000, 20)).astype(np.float32)
    out, small = np.empty_like(X), np.ones(10)
    result = {}
    for kind in GAPS:
        times = []
        for _ in range(runs):
            _gap(kind, seconds, small)
            times.append(_steps(X, out, small))
        result[kind] = dict(zip(STEPS, (np.median(times[5:], axis=0) / 1e3).round(1).tolist()))
    return result


def finite_checks(runs, seconds):
    X = np.random.default_rng(0).standard_normal((5000, 20)).astype(np.float32)

    def in_errstate():
        with np.errstate(over="ignore"):
            return np.isfinite(X.sum())

    def in_float64():
        return np.isfinite(X.sum(dtype=np.float64))

    ways = {"sum under np.errstate (the bridge's)": in_errstate, "sum in float64": in_float64}
    result = {}
    for kind in ("none", "sleep"):
        times = {name: [] for name in ways}
        for run in range(runs):
            for name in list(ways)[run % 2:] + list(ways)[: run % 2]:
                _gap(kind, seconds, None)
                start = time.perf_counter_ns()
                ways[name]()
                times[name].append(time.perf_counter_ns() - start)
        result[kind] = {name: round(float(np.median(t[5:])) / 1e3, 1) for name, t in times.items()}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=85.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    seconds = args.gap_ms / 1000
    report({"runs": args.runs, "gap_ms": args.gap_ms, "steps after a gap, us": steps_after_gaps(args.runs, seconds),
            "finite check of 5000 x 20 float32, us": finite_checks(args.runs, seconds)}, args.out)


if __name__ == "__main__":
    main()
