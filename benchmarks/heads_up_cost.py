"""What a call's heads-up (``client.heads_up``) costs the client, after a ``gc.collect()`` as e2e's table times
calls: the look at its request slot's watch word alone (a worker thread watches: no ring), and with the ring.

    python benchmarks/heads_up_cost.py [--calls 200] [--out results/cpu-HOST/heads-up-cost.json]

A worker of scikit-learn's backend runs in this process (watch_ms 0: the slot is armed after every reply, and
a heads-up's watch ends at once), with 300,000 small objects beside it, so that a collection leaves the
caches cold as it does beside cuML's imports.
"""

import argparse
import gc
import json
import tempfile
import threading
import time

import numpy as np

import sklearn_gpu_bridge
from sklearn_gpu_bridge import client
from sklearn_gpu_bridge.connect import read_connection_file
from sklearn_gpu_bridge.worker.backends import SklearnBackend
from sklearn_gpu_bridge.worker.server import Worker


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="sgb-heads-up-")
    worker = Worker(SklearnBackend(), connection_file=f"{folder}/worker.json", threads=2, watch_ms=0.0).start()
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    connection = client.Connection(read_connection_file(f"{folder}/worker.json"))
    client._connection = connection  # what client.heads_up() looks at
    heap = [{"n": i} for i in range(300_000)]  # noqa: F841 - kept alive: what a collection walks
    result = {}
    try:
        with sklearn_gpu_bridge.config_context(reply_wait="spin"):
            connection.fit("StandardScaler", {}, "fit", [np.ones((40, 3))], {})
            link = connection._link()
            for way in ("ring", "look only"):
                times = []
                for _ in range(args.calls):
                    time.sleep(0.005)  # the reply's watch and the last heads-up's (0 ms) are over
                    link.watch[0] = 0 if way == "ring" else link.next_token  # "look only": as if watched
                    gc.collect()
                    start = time.perf_counter()
                    client.heads_up()
                    times.append(time.perf_counter() - start)
                result[way] = {"median_us": float(np.median(times) * 1e6),
                               "p90_us": float(np.percentile(times, 90) * 1e6)}
                print(f"{way:<10} after gc.collect(): median {result[way]['median_us']:.1f} us, "
                      f"p90 {result[way]['p90_us']:.1f} us")
        result["heads_ups_heard"] = worker.counts["heads_up"]
    finally:
        client._connection = None
        connection.close()
        worker.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
