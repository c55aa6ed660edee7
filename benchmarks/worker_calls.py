"""How much Python a small call runs on the worker: Python functions called per request, the bridge's own apart.

    python benchmarks/worker_calls.py [--calls 20] [--reply-wait spin] [--out results/cpu-HOST/worker-calls.json]

The worker's side of ``python_calls.py``: after a ``gc.collect()`` every
function a request runs is fetched from memory again, and a count of them
does not depend on the machine's noise (a generator's resumptions count as
calls, and a call that drops a duplicate or rings runs a few more: means
come out fractional). The worker (scikit-learn's) is started with
``count_calls/`` on its path (a ``sitecustomize`` that counts every Python
call in every thread by a profile hook), the small cases' calls run
``--calls`` times each between two signals that start and report its count.
"The bridge's own" are the calls of functions in this package (reading,
checking, queueing, decoding, encoding, replying, the backend's wrapping);
the rest are the estimator's and the standard library's. (Not for the GPU
machine as it is: ``count_calls/`` would hide the ``sitecustomize`` that
cuML's install writes there.) The looks of the watch for the next
request (``SPINNING``) are left out. Run once per tree (``PYTHONPATH=<the
other tree's site>``) to compare two.
"""

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import sklearn_gpu_bridge
import sklearn_gpu_bridge.shm
import sklearn_gpu_bridge.worker
from client_checks import report
from client_legs import over_small_calls
from e2e import bridge_parser

HOOK = Path(__file__).resolve().parent / "count_calls"
#: where the bridge's own code lies (the worker's and the pool's packages are folders of their own in a checkout)
ROOTS = tuple(str(Path(module.__file__).resolve().parent) + os.sep
              for module in (sklearn_gpu_bridge, sklearn_gpu_bridge.shm, sklearn_gpu_bridge.worker))


#: what the worker calls once per look while it watches a request slot for the client's next request (the
#: watch's give-way checks): how often is the client's time, not the request's (as python_calls.py's SPINNING)
SPINNING = ("scheduler.py:", "(busy)"), ("server.py:", "(_reader_gives_way)"), ("server.py:", "(_input_waiting)")


def own_name(key):
    """``key`` (file:line(function)) without its root's folder if it is the bridge's, else None."""
    for root in ROOTS:
        if key.startswith(root):
            return Path(root).name + os.sep + key[len(root):]
    return None


def signalled(pid, signum, file):
    """Send ``signum`` to the worker and wait for the count it writes to ``file``."""
    file.unlink(missing_ok=True)
    os.kill(pid, signum)
    deadline = time.monotonic() + 10
    while not file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not answer the signal: is count_calls/ on its path?")
        time.sleep(0.01)
    return json.loads(file.read_text())


def main():
    parser = bridge_parser(__doc__, backend=False, reply_wait="spin")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    file = Path(tempfile.mkdtemp(prefix="sgb-calls-")) / "counts.json"
    os.environ["SKLEARN_GPU_BRIDGE_COUNT_CALLS"] = str(file)  # the worker that over_small_calls starts inherits
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")]))

    def measure(name, call):
        pid = sklearn_gpu_bridge.get_connection().status()["pid"]
        signalled(pid, signal.SIGUSR1, file)
        for _ in range(args.calls):
            call()
        counts = {key: n for key, n in signalled(pid, signal.SIGUSR2, file).items()
                  if not any(where in key and key.endswith(function) for where, function in SPINNING)}
        own = {own_name(key): n / args.calls for key, n in counts.items() if own_name(key)}
        return {"python calls": sum(counts.values()) / args.calls, "the bridge's own": sum(own.values()),
                "the bridge's functions": len(own),
                "the bridge's, most called": dict(sorted(own.items(), key=lambda kv: -kv[1])[:15])}

    per_call = over_small_calls("sklearn", args.reply_wait, measure)
    report({"reply_wait": args.reply_wait, "bridge": sklearn_gpu_bridge.__file__, "calls": args.calls,
            "per call": per_call}, args.out)


if __name__ == "__main__":
    main()
