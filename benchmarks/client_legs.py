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

import argparse
import gc
import time

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from e2e import CASES, WorkerProcess, make_data

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sklearn", "cuml"), default="sklearn")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--reply-wait", choices=("auto", "spin", "sleep"), default="auto")
    parser.add_argument("--out")
    args = parser.parse_args()
    worker = WorkerProcess(args.backend)
    sklearn_gpu_bridge.set_config(connection_file=str(worker.connection_file), start_local_worker=False,
                                  reply_wait=args.reply_wait)
    connection = sklearn_gpu_bridge.get_connection()
    result = {"backend": args.backend, "runs": args.runs, "reply_wait": args.reply_wait,
              "bridge": sklearn_gpu_bridge.__file__, "ms": {}}
    try:
        for case in (case for case in CASES if case.name in SMALL):
            for name, call in calls_of(case):
                for _ in range(20):
                    call()
                result["ms"][name] = {mode: legs(call, args.runs, mode == "after gc.collect()", connection)
                                      for mode in ("after gc.collect()", "back to back")}
                cold, warm = result["ms"][name]["after gc.collect()"], result["ms"][name]["back to back"]
                print(f"{name:<52} before sending {cold['before sending']:.3f} / {warm['before sending']:.3f}, "
                      f"after the reply {cold['after the reply']:.3f} / {warm['after the reply']:.3f} ms "
                      "(after gc.collect() / back to back)", flush=True)
    finally:
        sklearn_gpu_bridge.reset_connection()
        worker.stop()
    report(result, args.out)


if __name__ == "__main__":
    main()
