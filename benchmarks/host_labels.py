"""What a cuML classifier's label encoding costs on the device, and on the host where the labels are their own codes
(GPU machine; worker/labels.py).

    python benchmarks/host_labels.py [--runs 50] [--out results/.../host-labels.json]
    python benchmarks/host_labels.py --client-only    # no cuML: the client's rows alone

For labels 0/1 of n samples (int32, as the bridge's client sends them), medians in ms of ``--runs`` calls after a
``gc.collect()`` (as e2e's table times) and as many back to back:

- ``device``: cuML's own ``check_y(y, return_classes=True)``: ``cupy.unique`` on the device;
- ``host``: the worker's ``HostLabels`` answering the same (at every n: its bound on n, ``HOST_MAX_SAMPLES``,
  holds for more than two classes only since 2026-11-29);
- ``client``: the client's own encoding of the same labels (``_classes_and_codes``), and ``count``: the
  ``np.bincount`` that both the client and the host made of two classes until 2026-11-29, and make no more.
"""

import argparse
import gc
import time

import numpy as np

from client_checks import report
from sklearn_gpu_bridge.estimators.base import _classes_and_codes
from sklearn_gpu_bridge.worker import labels

SIZES = (5000, 1 << 15, 1 << 17, 1 << 20)


def median_ms(call, runs, collect):
    times = []
    for _ in range(runs):
        if collect:
            gc.collect()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)  # each after a collection: 0.13 s apiece with cuML here
    parser.add_argument("--client-only", action="store_true", help="the client's rows alone (no cuML)")
    parser.add_argument("--out")
    args = parser.parse_args()

    if not args.client_only:
        from cuml.internals import validation

        device = validation.check_y
        device = getattr(device, "original", device)  # cuML's own, should this process have the host's installed
        host = labels.HostLabels(device)

    rows = {}
    for n in SIZES:
        y = (np.random.default_rng(0).standard_normal(n) > 0).astype(np.int32)
        ways = {"client": lambda y=y: _classes_and_codes(y), "count": lambda y=y: np.bincount(y, minlength=2)}
        if not args.client_only:
            ways.update({way: lambda y=y, check=check: check(y, return_classes=True) for way, check in
                         (("device", device), ("host", host))})
            taken = host.taken
            assert labels.same_answer(ways["host"](), ways["device"]()) and host.taken == taken + 1, \
                "the host did not answer as cuML does"
        rows[n] = {way: {"after gc.collect()": median_ms(call, args.runs, True),
                         "back to back": median_ms(call, args.runs, False)} for way, call in ways.items()}
        print(f"{n:>8} labels: " + "; ".join(f"{way} {ms['after gc.collect()']:.3f} / {ms['back to back']:.3f} ms"
                                             for way, ms in rows[n].items()) + " (after gc.collect() / back to back)",
              flush=True)
    report({"runs": args.runs, "labels": "0/1 int32", "ms": rows}, args.out)


if __name__ == "__main__":
    main()
