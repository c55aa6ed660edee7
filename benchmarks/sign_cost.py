"""What signing a message's header costs (``Session.sign``, HMAC-SHA256), after a ``gc.collect()`` and back to back,
on whichever tree is imported (run it once per tree: ``PYTHONPATH=<the other tree's site>``).

    python benchmarks/sign_cost.py [--runs 300] [--out results/cpu-HOST/sign-cost.json]

Every request and every reply is signed once and checked once, so a call signs four times, twice in each
process. A collection walks a heap of a million small objects first (the GPU machine's client holds
cuML's), which leaves the caches cold, as ``e2e.py``'s table leaves them before each call; only a process's
first signature after it is cold, and "three in a row" times one with the two after it. Headers of 600
bytes (a predict request's is about that), a different one each time. Medians in microseconds.
"""

import argparse
import gc
import os
import time

import numpy as np

import sklearn_gpu_bridge
from sklearn_gpu_bridge.protocol import Session

from client_checks import report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--out")
    args = parser.parse_args()
    session = Session(os.urandom(32))
    headers = [os.urandom(600) for _ in range(16)]
    heap = [{"n": i} for i in range(1_000_000)]  # what a collection walks
    session.sign(headers[0])
    cold, three, warm = [], [], []
    for run in range(args.runs):
        gc.collect()
        start = time.perf_counter()
        session.sign(headers[run % 16])
        cold.append(time.perf_counter() - start)
        gc.collect()
        start = time.perf_counter()
        for i in range(3):
            session.sign(headers[(run + i) % 16])
        three.append(time.perf_counter() - start)
    for run in range(args.runs * 10):
        start = time.perf_counter()
        session.sign(headers[run % 16])
        warm.append(time.perf_counter() - start)
    report({"bridge": sklearn_gpu_bridge.__file__, "runs": args.runs, "heap objects": len(heap),
            "microseconds a signature": {"after gc.collect()": float(np.median(cold)) * 1e6,
                                          "back to back": float(np.median(warm)) * 1e6},
            "microseconds, three in a row after gc.collect()": float(np.median(three)) * 1e6}, args.out)


if __name__ == "__main__":
    main()
