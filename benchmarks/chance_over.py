"""How often one table puts a case over a ratio of cuML in process by chance: its calls, resampled.

    python benchmarks/chance_over.py "LogisticRegression fit 1M x 50" 'benchmarks/results/gpu-h200-112[78]*/*.json'

A table gives each way of a large case the median of a few calls (3 until ``e2e.py``'s ``LARGE_SECONDS``). Where one
call in several is much slower than the rest, in both ways, that median depends on how many slow calls each way
happened to draw. This pools every call of the case from the given e2e JSON files, one pool per way. It prints
the share of each way's calls that are slow (over 1.3x its pool's median), and how often a median of N
resampled calls of the bridge is over ``--ratio`` times a median of N resampled calls of cuML (100,000 draws,
seed 0).
"""

import argparse
import glob
import json

import numpy as np


def pooled_times(case, paths):
    """Every call's seconds of ``case``, per way (bridge, cuml), from e2e JSON files and slow_calls.py's; and how
    many rows (a slow_calls.py file is one)."""
    bridge, cuml, rows = [], [], 0
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if isinstance(report, dict) and report.get("case") == case and "calls" in report:  # slow_calls.py
            bridge += [c["seconds"] for c in report["calls"] if c["way"] == "bridge"]
            cuml += [c["seconds"] for c in report["calls"] if c["way"] == "in process"]
            rows += 1
        for row in report.get("cases", []) if isinstance(report, dict) else []:
            if row.get("case") == case and "bridge" in row and "cuml" in row:
                bridge += row["bridge"]["times"]
                cuml += row["cuml"]["times"]
                rows += 1
    return np.array(bridge), np.array(cuml), rows


def chance_over(bridge, cuml, rounds, ratio, draws=100_000, seed=0):
    """P(median of ``rounds`` bridge calls > ``ratio`` x median of ``rounds`` cuML calls), resampling each pool."""
    rng = np.random.default_rng(seed)
    mine = np.median(rng.choice(bridge, (draws, rounds)), axis=1)
    theirs = np.median(rng.choice(cuml, (draws, rounds)), axis=1)
    return float(np.mean(mine > ratio * theirs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("files", nargs="+", help="e2e or slow_calls.py JSON files, or glob patterns of them")
    parser.add_argument("--ratio", type=float, default=1.10)
    parser.add_argument("--rounds", default="3,5,7,11")
    args = parser.parse_args()
    paths = sorted({path for pattern in args.files for path in glob.glob(pattern)})
    bridge, cuml, rows = pooled_times(args.case, paths)
    if not rows:
        raise SystemExit(f"no row of {args.case!r} in {len(paths)} files")
    print(f"{args.case}: {rows} rows of {len(paths)} files, {len(bridge)} bridged calls, {len(cuml)} cuML's")
    for name, times in (("bridge", bridge), ("cuML in process", cuml)):
        median = np.median(times)
        print(f"  {name:<16} median {median * 1e3:.1f} ms, slow calls (over 1.3x that) {np.mean(times > 1.3 * median):.0%}, "
              f"the slowest {times.max() * 1e3:.0f} ms")
    print(f"  medians of all calls: bridge / cuML {np.median(bridge) / np.median(cuml):.2f}x")
    for rounds in (int(n) for n in args.rounds.split(",")):
        print(f"  a table of {rounds:>2} rounds over {args.ratio:.2f}x by chance: "
              f"{chance_over(bridge, cuml, rounds, args.ratio):.1%}")


if __name__ == "__main__":
    main()
