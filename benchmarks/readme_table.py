"""The README's benchmark table, from one ``e2e.py --parts cases`` JSON file.

    python benchmarks/readme_table.py benchmarks/results/gpu-h200-1129b/e2e-table.json
    python benchmarks/readme_table.py --legs benchmarks/results/gpu-h200-1129b/legs.txt

One row a case, as the table was first written by hand: median seconds of
each way after a ``gc.collect()``, bridge / cuML, and for the small cases the
difference of the medians in ms, after a collection and timeit's way (the
case's ``[timeit]`` run). The round-by-round differences and their intervals
are ``intervals.py``'s.

With ``--legs``, the table of the small calls' legs from the text that
``e2e.py --parts profile`` prints (its JSON does not keep them): each call
after a ``gc.collect()``, a pair's fit and predict on their own; the
worker's own steps are its leg less cuML's call ("ran").
"""

import argparse
import json
import re

from e2e import CASES  # benchmarks/, as the other scripts here import e2e

HEADER = ("| case | MB | scikit-learn | cuML in process | bridge | bridge / cuML | bridge - cuML "
          "| the same, timeit's way | bridge vs scikit-learn |")


def seconds(value):
    """Three significant figures, as the README has always shown them."""
    return f"{value:#.3g}"


def megabytes(row):
    """X's size: the case's own (the JSON's has one decimal: 0.04 MB reads 0.0), or the JSON's for a case e2e.py
    no longer has."""
    case = next((case for case in CASES if case.name == row["case"]), None)
    return case.megabytes if case is not None else row["megabytes"]


def rows(cases):
    timeit = {c["case"]: c for c in cases if c["between"] == "timeit"}
    for case in cases:
        if case["between"] == "timeit":
            continue
        small = case["case"] in timeit
        minus = f"{case['bridge_minus_cuml_ms']:+.1f} ms" if small else ""
        minus_timeit = f"{timeit[case['case']]['bridge_minus_cuml_ms']:+.1f} ms" if small else ""
        speedup = case["speedup_vs_sklearn"]
        speedup = f"{speedup:.1f}x" if speedup < 10 else f"{speedup:.0f}x"
        yield (f"| {case['case']} | {megabytes(case):g} | {seconds(case['sklearn']['median'])} "
               f"| {seconds(case['cuml']['median'])} | {seconds(case['bridge']['median'])} "
               f"| {case['bridge_over_cuml']:.2f}x | {minus} | {minus_timeit} | {speedup} |")


LEGS_HEADER = ("| call | bridge | client before sending | to the worker | worker's own steps "
               "| cuML's call on the worker | back | client after | cuML in process |")
CALL = re.compile(r"^== (.+) \(medians of \d+\):$")
AFTER_COLLECT = re.compile(
    r"after gc.collect\(\): bridge ([\d.]+) ms; its last request: client before sending ([\d.]+) ms, "
    r"to the worker ([\d.]+) ms, on the worker ([\d.]+) ms, back ([\d.]+) ms, client after ([\d.]+) ms")
STEPS = re.compile(r"ran ([\d.]+),.*; cuML in process ([\d.]+) ms")


def legs_rows(lines):
    """One row a call: the whole calls of one request and the fit and predict of a pair, not the pair itself
    (whose last request is only its predict)."""
    call, legs = None, None
    for line in lines:
        line = line.strip()
        if match := CALL.match(line):
            call, legs = match.group(1), None
        elif call and legs is None and (match := AFTER_COLLECT.match(line)):
            legs = [float(v) for v in match.groups()]
        elif call and legs and (match := STEPS.search(line)):
            bridge, before, to_worker, on_worker, back, after = legs
            ran, in_process = (float(v) for v in match.groups())
            if "fit+predict" not in call or ": the " in call:
                yield (f"| {call} | {bridge:.2f} | {before:.2f} | {to_worker:.2f} | {on_worker - ran:.2f} "
                       f"| {ran:.2f} | {back:.2f} | {after:.2f} | {in_process:.2f} |")
            call = None


def print_table(header, table_rows):
    print(header)
    print("| --- " * header.count(" | ") + "| --- |")
    for row in table_rows:
        print(row)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="e2e.py's JSON (the table), or with --legs its profile's printed text")
    parser.add_argument("--legs", action="store_true", help="the legs of the small calls")
    args = parser.parse_args()
    with open(args.file) as f:
        if args.legs:
            print_table(LEGS_HEADER, list(legs_rows(f)))
        else:
            print_table(HEADER, list(rows(json.load(f)["cases"])))


if __name__ == "__main__":
    main()
