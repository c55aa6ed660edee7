"""Counts the Python function calls of a worker process, for ``benchmarks/worker_calls.py`` (never installed).

A worker started with this folder on its PYTHONPATH and ``SKLEARN_GPU_BRIDGE_COUNT_CALLS=FILE`` in its
environment counts, in every thread, each call of a function written in Python, by function (a profile hook:
slow, exact). SIGUSR1 starts the count afresh and SIGUSR2 writes it; each writes FILE as JSON when done.
"""

import os

if os.environ.get("SKLEARN_GPU_BRIDGE_COUNT_CALLS"):
    import collections
    import json
    import signal
    import sys
    import threading

    _counts = collections.Counter()
    _file = os.environ["SKLEARN_GPU_BRIDGE_COUNT_CALLS"]

    def _count(frame, event, arg):
        if event == "call":
            code = frame.f_code
            _counts[f"{code.co_filename}:{code.co_firstlineno}({code.co_name})"] += 1

    def _write(counts):
        with open(_file + ".part", "w") as f:
            json.dump(counts, f)
        os.replace(_file + ".part", _file)

    def _restart(*_):
        _counts.clear()
        _write({})

    def _report(*_):
        _write(dict(_counts))

    signal.signal(signal.SIGUSR1, _restart)
    signal.signal(signal.SIGUSR2, _report)
    threading.setprofile(_count)
    sys.setprofile(_count)
