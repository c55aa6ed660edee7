"""What the worker's own look for NaN and inf costs a small call: one request with ``finite`` said, and not.

    python benchmarks/worker_check.py [--backend sklearn|cuml] [--runs 200] [--out results/...json]

A wrapper that found X free of NaN and inf says ``finite`` in its request,
and the worker runs the estimator under scikit-learn's ``assume_finite``,
which cuML's checks read too. Since the thirteenth session the scalers say it
too of an X whose sum their own check found finite (they let NaN through, as
scikit-learn's do, and said it of nothing before). Here the same request
(``StandardScaler.fit_transform`` of 5000 x 20, float32 and float64, and the
fitted scaler's ``transform``) goes through the protocol with ``finite`` and
without, in turn (the order turned every other run), ``--runs`` times each
after a ``gc.collect()`` (as ``e2e.py``'s table times) and as many back to
back; the models the fits leave are released after the timing. Medians in
ms.
"""

import gc
import time

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from e2e import bridge_parser, bridged_to_new_worker


def in_turn(requests, runs, collect):
    """{label: median ms} of each of ``requests`` ({label: call}), taken in turn, in the other order every
    other run (so that neither way always follows the other)."""
    spent = {label: [] for label in requests}
    for run in range(runs):
        for label, request in (requests.items() if run % 2 == 0 else reversed(requests.items())):
            if collect:
                gc.collect()
            start = time.perf_counter()
            request()
            spent[label].append(time.perf_counter() - start)
    return {label: float(np.median(times)) * 1e3 for label, times in spent.items()}


def main():
    parser = bridge_parser(__doc__)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    worker = bridged_to_new_worker(args.backend, reply_wait=args.reply_wait)
    rows = {}
    try:
        connection = sklearn_gpu_bridge.get_connection()
        for dtype in (np.float32, np.float64):
            X = np.random.default_rng(0).standard_normal((5000, 20)).astype(dtype)
            fitted = connection.fit("StandardScaler", {}, "fit", [X], {}, finite=True)
            handles = []  # released after the timing: a release travels with the next request, and costs it

            def fit_transform(finite, X=X):
                handles.append(connection.fit("StandardScaler", {}, "fit_transform", [X], {}, finite=finite).handle)

            def transform(finite, X=X, handle=fitted.handle):
                connection.call(handle, "transform", [X], {}, finite=finite)

            requests = {f"{name}, finite={finite}": (lambda call=call, finite=finite: call(finite))
                        for name, call in (("fit_transform", fit_transform), ("transform", transform))
                        for finite in (True, False)}
            for request in requests.values():
                for _ in range(10):
                    request()
            rows[f"StandardScaler 5000x20 {np.dtype(dtype).name}"] = {
                "after gc.collect()": in_turn(requests, args.runs, collect=True),
                "back to back": in_turn(requests, args.runs, collect=False)}
            for handle in [*handles, fitted.handle]:
                connection.schedule_release(handle)  # with the next request, untimed
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
    report({"backend": args.backend, "reply_wait": args.reply_wait, "runs": args.runs, "ms a request": rows},
           args.out)


if __name__ == "__main__":
    main()
