"""What importing the package costs, and its own share beyond scikit-learn's.

Each statement runs in a fresh interpreter (``--repeats`` times; the median
is kept), timed inside the process around the import alone:

- ``import sklearn_gpu_bridge``: the package (settings, errors; wrappers load later)
- ``... ; sklearn_gpu_bridge.GPUSVC``: the first use of a wrapper (scikit-learn, the client, ZeroMQ)
- ``import sklearn.svm`` and ``import sklearn.svm, zmq``: what that first use cannot avoid

The package's own share is first use minus ``import sklearn.svm, zmq``.

    python benchmarks/import_time.py --out benchmarks/results/cpu/import-time.json
    python benchmarks/import_time.py --python OTHER/bin/python ...   # another checkout's venv, to compare
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

CASES = {
    "import sklearn_gpu_bridge": "import sklearn_gpu_bridge",
    "first wrapper (GPUSVC)": "import sklearn_gpu_bridge; sklearn_gpu_bridge.GPUSVC",
    "import sklearn.svm": "import sklearn.svm",
    "import sklearn.svm, zmq": "import sklearn.svm, zmq",
}
TIMER = ("import time, json, sys\nt = time.perf_counter()\n{statement}\n"
         "t = time.perf_counter() - t\nprint(json.dumps([t, sorted(m for m in sys.modules "
         "if m.startswith('sklearn_gpu_bridge.worker') or m == 'zmq')]))")


def measure(python, repeats):
    out = {}
    for label, statement in CASES.items():
        times, loaded = [], []
        for _ in range(repeats):
            run = subprocess.run([python, "-c", TIMER.format(statement=statement)], capture_output=True, text=True,
                                 check=True, cwd=Path(__file__).resolve().parent)  # not a checkout's root
            seconds, loaded = json.loads(run.stdout)
            times.append(seconds)
        out[label] = {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
                      "worker_modules_and_zmq": loaded}
    own = out["first wrapper (GPUSVC)"]["median_ms"] - out["import sklearn.svm, zmq"]["median_ms"]
    return {"cases": out, "package_share_of_first_use_ms": own}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter(s) to measure (default: this one)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "python": platform.python_version()},
              "repeats": args.repeats, "runs": {}}
    for python in args.python or [sys.executable]:
        result = report["runs"][python] = measure(python, args.repeats)
        print(f"{python}:")
        for label, row in result["cases"].items():
            print(f"  {label:<28} {row['median_ms']:8.1f} ms   loads {row['worker_modules_and_zmq'] or '-'}")
        print(f"  {'package share of first use':<28} {result['package_share_of_first_use_ms']:8.1f} ms")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
