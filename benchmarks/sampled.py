"""Where a small call's time goes in both processes, sampled from outside: py-spy on the client and the worker.

    python benchmarks/sampled.py --backend cuml --seconds 30 --out results/.../sampled.json

The legs of ``e2e.py --parts profile`` say which hop costs what; a cProfile
of the client adds a microsecond or more to every one of the few hundred
calls a request makes, which is most of what it would measure. Here
`py-spy <https://github.com/benfred/py-spy>`_ samples both processes
(``--rate`` per second, neither process slowed) while the small cases of
``e2e.py`` run over and over, each after a ``gc.collect()`` as the table times
them, and a sample counts for the function it was in and every caller above
it. A function's share is printed in milliseconds per call of the case:
samples x the sampling interval / calls. With ``--backend cuml`` cuML is also
imported here, so that the collection walks the heap it walks in ``e2e.py``.
"""

import collections
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import sklearn_gpu_bridge
from e2e import CASES, bridge_parser, bridged_to_new_worker, make_data

DEFAULT_CASES = ("StandardScaler fit_transform 5000x20", "LogisticRegression fit+predict 5000x20")
PACKAGE = re.compile(r"\((?:.*/)?(sklearn_gpu_bridge/[^)]*|worker/[^)]*|shm/[^)]*)\)")


def frames_of(stack):
    """A raw py-spy stack ``a (file:line);b (file:line)`` as frames named ``function (path:line)``, the path cut
    to the package (or the file's name)."""
    out = []
    for frame in stack.split(";"):
        name, _, where = frame.partition(" (")
        where = where.rstrip(")")
        match = PACKAGE.search(frame)
        out.append(f"{name} ({match.group(1) if match else Path(where).name})")
    return out


def aggregate(path, within, calls, interval_ms, top):
    """{inclusive: [(frame, ms per call)], leaf: [...]} of the samples whose stack passes through one of
    ``within`` (parts of frames' names)."""
    inclusive, leaf = collections.Counter(), collections.Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = frames_of(stack)
        if not any(part in frame for frame in frames for part in within):
            continue
        for frame in set(frames):
            inclusive[frame] += int(count)
        leaf[frames[-1]] += int(count)
    scale = interval_ms / calls
    return {kind: [(frame, round(n * scale, 4)) for frame, n in counter.most_common(top)]
            for kind, counter in (("inclusive", inclusive), ("leaf", leaf))}


def main():
    parser = bridge_parser(__doc__)
    parser.add_argument("--only", default=",".join(DEFAULT_CASES), help="cases of e2e.py, by name, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=997, help="samples per second (a prime: no beat with a loop)")
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    if args.backend == "cuml":
        import cuml  # noqa: F401 - the heap the table's collections walk

    cases = [case for case in CASES if case.name in args.only.split(",")]
    worker = bridged_to_new_worker(args.backend, reply_wait=args.reply_wait)
    folder = Path(tempfile.mkdtemp(prefix="sgb-sampled-"))
    report = {"backend": args.backend, "rate": args.rate, "reply_wait": args.reply_wait,
              "bridge": sklearn_gpu_bridge.__file__, "cases": []}
    try:
        for case in cases:
            X, y = make_data(case)
            wrapper = getattr(sklearn_gpu_bridge, case.bridge)
            for _ in range(20):
                case.run(wrapper(**case.params), X, y)
            raw = {side: folder / f"{side}.txt" for side in ("client", "worker")}
            spies = [subprocess.Popen([spy, "record", "--nonblocking", "-r", str(args.rate), "-f", "raw", "-o", str(raw[side]), "-p", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                     for side, pid in (("client", os.getpid()), ("worker", worker.process.pid))]
            time.sleep(2)  # py-spy attached
            runs, deadline = 0, time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                gc.collect()
                case.run(wrapper(**case.params), X, y)
                runs += 1
            for process in spies:
                process.send_signal(signal.SIGINT)  # py-spy writes what it sampled, and stops
                _, err = process.communicate(timeout=60)
                if process.returncode:
                    print(err.decode(errors="replace"), file=sys.stderr)
            calls = runs  # one "call" of a case: what e2e times (a pair counts once)
            row = {"case": case.name, "runs": runs,
                   # the case's call (not the collection before it); the worker's reading and running of
                   # requests (not its threads' watching for the next one)
                   "client": aggregate(raw["client"], ("(e2e.py:",), calls, 1e3 / args.rate, args.top),
                   "worker": aggregate(raw["worker"], ("Worker._accept", "Worker._work"), calls, 1e3 / args.rate,
                                       args.top)}
            report["cases"].append(row)
            print(f"== {case.name}: {runs} runs after gc.collect(); ms per run, a function and all it calls")
            for side in ("client", "worker"):
                print(f"  -- {side}")
                for frame, ms in row[side]["inclusive"]:
                    print(f"  {ms:8.4f}  {frame}")
            print(flush=True)
    finally:
        worker.stop()
        shutil.rmtree(folder, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        print("wrote", args.out)


if __name__ == "__main__":
    main()
