"""Bridge minus cuML in process, with bootstrap intervals, for the rows of ``e2e.py``'s JSON.

For each row that has both ways, two figures in ms with their intervals:
the difference of the two medians (resampling each way's ``times`` on its
own), and the median of the round-by-round differences (resampling the
rounds; :func:`paired_difference`, which ``e2e.py`` records in each row). A
large row adds bridge / cuML.

    python benchmarks/intervals.py benchmarks/results/gpu-h200-1128b/e2e-table.json

The figures of issue 15's target 1 in the README and the results' READMEs
come from this, with its defaults (90%, 2000 resamples, seed 0).
"""

import argparse
import json

import numpy as np


def round_differences(times, others):
    """``times[i] - others[i]`` for each round both ways ran: their i-th calls ran in one round of
    ``e2e.timed_together``, one soon after the other."""
    rounds = min(len(times), len(others))
    return np.subtract(times[:rounds], others[:rounds])


def paired_difference(times, others):
    """The median of :func:`round_differences`: a drift of the machine over a case (every way 19-46% slower in
    its second half, seen on the H200 machine) moves both sides of each difference alike, where it can move the
    two ways' medians apart."""
    return float(np.median(round_differences(times, others)))


def interval(statistic, level, resamples, rng):
    """The central ``level`` % interval of ``statistic(rng)`` over ``resamples`` draws, in ms."""
    draws = [statistic(rng) for _ in range(resamples)]
    return np.percentile(draws, [50 - level / 2, 50 + level / 2]) * 1e3


def row_figures(row, level=90, resamples=2000, seed=0):
    """(difference of medians, its interval, median of round differences, its interval, rounds), in ms."""
    rng = np.random.default_rng(seed)
    bridge, cuml = np.asarray(row["bridge"]["times"]), np.asarray(row["cuml"]["times"])
    differences = round_differences(bridge, cuml)
    rounds = differences.size

    def of_medians(r):
        return np.median(r.choice(bridge, bridge.size)) - np.median(r.choice(cuml, cuml.size))

    def of_rounds(r):
        return np.median(r.choice(differences, rounds))

    return ((np.median(bridge) - np.median(cuml)) * 1e3, interval(of_medians, level, resamples, rng),
            paired_difference(bridge, cuml) * 1e3, interval(of_rounds, level, resamples, rng), rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON written by e2e.py --parts cases")
    parser.add_argument("--level", type=float, default=90, help="the interval's coverage, per cent")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in args.files:
        print(path)
        with open(path) as f:
            rows = json.load(f)["cases"]
        for row in rows:
            if "bridge" not in row or "cuml" not in row:
                continue
            medians, medians_range, paired, paired_range, rounds = row_figures(
                row, args.level, args.resamples, args.seed)
            name = row["case"] + ("" if row.get("between", "collect") == "collect" else f" [{row['between']}]")
            ratio = f"  {row['bridge_over_cuml']:.2f}x" if row.get("large") else ""
            print(f"  {name:<60} {rounds:>3} rounds  medians {medians:+8.2f} [{medians_range[0]:+.2f}, "
                  f"{medians_range[1]:+.2f}]  round by round {paired:+8.2f} [{paired_range[0]:+.2f}, "
                  f"{paired_range[1]:+.2f}]{ratio}")


if __name__ == "__main__":
    main()
