"""How often one table puts a case over a ratio of cuML in process by chance: its calls, resampled.

    python benchmarks/chance_over.py "LogisticRegression fit 1M x 50" 'benchmarks/results/gpu-h200-112[78]*/*.json'

A table gives each way of a large case the median of a few calls (3 until ``e2e.py``'s ``LARGE_SECONDS``). Where one
call in several is much slower than the rest, in both ways, that median depends on how many slow calls each way
happened to draw. This pools every call of the case from the given e2e JSON files, one pool per way. It prints
the share of each way's calls that are slow (over 1.3x its pool's median), and how often a median of N
resampled calls of the bridge is over ``--ratio`` times a median of N resampled calls of cuML (100,000 draws,
seed 0). Where the calls record the solver's iterations (``n_iter``), it prints each way's mean, whether the two
differ (Mann-Whitney U), and the bridge over cuML among the calls of each count both drew at least 5 times.
"""

import argparse
import glob
import json

import numpy as np


def pooled_calls(case, paths):
    """Every call of ``case``, per way (bridge, cuml), as two arrays: its seconds, and the solver's iterations (NaN
    where the call did not record them), from e2e JSON files and slow_calls.py's; and how many rows (a
    slow_calls.py file is one)."""
    pooled = {"bridge": [], "cuml": []}  # (seconds, iterations)
    rows = 0
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        if isinstance(report, dict) and report.get("case") == case and "calls" in report:  # slow_calls.py
            for call in report["calls"]:
                pooled["bridge" if call["way"] == "bridge" else "cuml"].append(
                    (call["seconds"], call["n_iter"][0] if call.get("n_iter") else np.nan))
            rows += 1
        for row in report.get("cases", []) if isinstance(report, dict) else []:
            if row.get("case") == case and "bridge" in row and "cuml" in row:
                for way, calls in pooled.items():
                    times = row[way]["times"]
                    calls += zip(times, row[way].get("n_iter") or [np.nan] * len(times))
                rows += 1
    return {way: np.array(calls, dtype=float).reshape(-1, 2).T for way, calls in pooled.items()}, rows


def equal_counts(bridge, cuml, least):
    """For each iteration count that both ways drew at least ``least`` times: (count, the bridge's calls, cuML's
    calls, the bridge over cuML by the medians of those calls). ``bridge``, ``cuml``: (seconds, iterations) of
    each call, iterations NaN where not recorded."""
    mine, my_counts = np.asarray(bridge, dtype=float)
    theirs, their_counts = np.asarray(cuml, dtype=float)
    found = []
    for count in sorted(set(my_counts[~np.isnan(my_counts)]) & set(their_counts[~np.isnan(their_counts)])):
        a, b = mine[my_counts == count], theirs[their_counts == count]
        if min(len(a), len(b)) >= least:
            found.append((int(count), len(a), len(b), float(np.median(a) / np.median(b))))
    return found


def iterations_compared(pooled):
    """Each way's mean iterations over the calls that record them, and whether the two differ (Mann-Whitney U);
    None where a way has none."""
    cuml, bridge = (counts[~np.isnan(counts)] for counts in (pooled["cuml"][1], pooled["bridge"][1]))
    if not (len(cuml) and len(bridge)):
        return None
    from scipy.stats import mannwhitneyu

    return (f"mean iterations: cuML in process {cuml.mean():.2f} ({len(cuml)} calls), bridge {bridge.mean():.2f} "
            f"({len(bridge)} calls); Mann-Whitney U p = {mannwhitneyu(cuml, bridge).pvalue:.3f}")


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
    pooled, rows = pooled_calls(args.case, paths)
    bridge, cuml = pooled["bridge"][0], pooled["cuml"][0]
    if not rows:
        raise SystemExit(f"no row of {args.case!r} in {len(paths)} files")
    print(f"{args.case}: {rows} rows of {len(paths)} files, {len(bridge)} bridged calls, {len(cuml)} cuML's")
    for name, times in (("bridge", bridge), ("cuML in process", cuml)):
        median = np.median(times)
        print(f"  {name:<16} median {median * 1e3:.1f} ms, slow calls (over 1.3x that) {np.mean(times > 1.3 * median):.0%}, "
              f"the slowest {times.max() * 1e3:.0f} ms")
    print(f"  medians of all calls: bridge / cuML {np.median(bridge) / np.median(cuml):.2f}x")
    iterations = iterations_compared(pooled)
    if iterations:
        print(f"  {iterations}")
        print("  at equal iterations, bridge / cuML by the medians: " + ", ".join(
            f"{count}: {ratio:.2f}x ({mine}, {theirs} calls)"
            for count, mine, theirs, ratio in equal_counts(pooled["bridge"], pooled["cuml"], least=5)))
    for rounds in (int(n) for n in args.rounds.split(",")):
        print(f"  a table of {rounds:>2} rounds over {args.ratio:.2f}x by chance: "
              f"{chance_over(bridge, cuml, rounds, args.ratio):.1%}")


if __name__ == "__main__":
    main()
