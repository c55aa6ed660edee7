"""The client's own legs of a small call: before it sends, and after its reply came; many runs, one process.

    python benchmarks/client_legs.py [--runs 300] [--backend sklearn] [--out results/...json]

``e2e.py --parts profile`` prints every leg of a call as medians of 10; the
legs that run in this process alone (validating, copying X into the pool,
encoding, signing; reading the reply, decoding) are here with enough runs
to compare two trees on a noisy machine: run the script once per tree, in
turn (``PYTHONPATH=<the other tree's site>``), against a worker of the tree
it runs. Each case runs ``--runs`` times after a ``gc.collect()`` (as
``e2e.py``'s table times, the caches cold) and as many back to back; medians
in ms. "rest" is the call's time between sending and the reply (the worker
and the hops), for reference: it is not this script's to compare.
"""

import gc
import time

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from e2e import CASES, bridge_parser, bridged_to_new_worker, make_data

SMALL = ("StandardScaler fit_transform 5000x20", "StandardScaler fit_transform 5000x20 float64",
         "LogisticRegression fit+predict 5000x20", "LogisticRegression fit+predict 5000x20 float64")


def calls_of(case):
    """(name, call) of a case: a pair's fit and predict apart (a model fitted once predicts)."""
    X, y = make_data(case)
    wrapper = getattr(sklearn_gpu_bridge, case.bridge)
    if "fit+predict" not in case.name:
        return [(case.name, lambda: case.run(wrapper(**case.params), X, y))]
    fitted = wrapper(**case.params).fit(X, y)
    stem = case.name.replace("fit+predict ", "")
    return [(f"{stem}: fit", lambda: wrapper(**case.params).fit(X, y)), (f"{stem}: predict", lambda: fitted.predict(X))]


def legs(call, runs, collect, connection):
    """Medians (ms) of the whole call, before sending, after the reply, and the rest."""
    rows = []
    for _ in range(runs):
        if collect:
            gc.collect()
        start = time.monotonic()
        call()
        end = time.monotonic()
        sent, received, _ = connection.last_stamps
        rows.append((end - start, sent - start, end - received, received - sent))
    whole, before, after, rest = (float(np.median(column)) * 1e3 for column in zip(*rows))
    return {"whole": whole, "before sending": before, "after the reply": after, "rest": rest}


def over_small_calls(backend, reply_wait, measure):
    """``{name: measure(call)}`` for each call of the small cases (warmed up first), through a new worker of
    ``backend``; the calls wait for their replies as ``reply_wait`` says."""
    worker = bridged_to_new_worker(backend, reply_wait=reply_wait)
    measured = {}
    try:
        for case in (case for case in CASES if case.name in SMALL):
            for name, call in calls_of(case):
                for _ in range(20):
                    call()
                measured[name] = measure(name, call)
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
    return measured


def main():
    parser = bridge_parser(__doc__)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()

    def measure(name, call):
        connection = sklearn_gpu_bridge.get_connection()
        cold, warm = (legs(call, args.runs, collect, connection) for collect in (True, False))
        print(f"{name:<52} before sending {cold['before sending']:.3f} / {warm['before sending']:.3f}, "
              f"after the reply {cold['after the reply']:.3f} / {warm['after the reply']:.3f} ms "
              "(after gc.collect() / back to back)", flush=True)
        return {"after gc.collect()": cold, "back to back": warm}

    ms = over_small_calls(args.backend, args.reply_wait, measure)
    report({"backend": args.backend, "runs": args.runs, "reply_wait": args.reply_wait,
            "bridge": sklearn_gpu_bridge.__file__, "ms": ms}, args.out)


if __name__ == "__main__":
    main()
