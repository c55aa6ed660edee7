"""Per-class counts of scikit-learn's estimator checks from a ``pytest -v`` log.

    python -m pytest -v tests/test_estimator_checks.py > checks.log
    python benchmarks/check_table.py checks.log

Prints, per wrapper class, "passed / expected failures" (and anything that
failed or was skipped), the figures of the coverage table in docs/estimators.md.
"""

import argparse
import re
from collections import Counter, defaultdict

LINE = re.compile(r"test_sklearn_compatible\[(GPU\w+)\(.*?\)-(\w+).*?\]\s+(PASSED|XFAIL|XPASS|FAILED|SKIPPED|ERROR)")


def counts(lines):
    table = defaultdict(Counter)
    for line in lines:
        match = LINE.search(line)
        if match:
            name, _check, outcome = match.groups()
            table[name][outcome] += 1
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    args = parser.parse_args()
    with open(args.log, errors="replace") as log:
        table = counts(log)
    for name in sorted(table):
        c = table[name]
        extra = ", ".join(f"{c[k]} {k.lower()}" for k in ("FAILED", "ERROR", "XPASS", "SKIPPED") if c[k])
        print(f"{name:32s} {c['PASSED']} / {c['XFAIL']}" + (f"   ({extra})" if extra else ""))
    total = sum(table.values(), Counter())
    print(f"{'all':32s} {total['PASSED']} / {total['XFAIL']}   {dict(total)}")


if __name__ == "__main__":
    main()
