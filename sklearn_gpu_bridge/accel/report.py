"""Where each call of a scikit-learn estimator ran (the worker or this CPU), and why there."""

import os
import sys
import threading
from collections import Counter, defaultdict

ENV_LOG = "SKLEARN_GPU_BRIDGE_ACCEL_LOG"  #: "1"/"info": the table at exit; "debug": each CPU call too
ENV_PARENT = "SKLEARN_GPU_BRIDGE_ACCEL_PARENT"  #: the pid that prints the table (not joblib's children)

_lock = threading.Lock()
_calls = defaultdict(Counter)  # "Class.method" -> Counter(worker=, cpu=)
_reasons = defaultdict(Counter)  # "Class.method" -> Counter(reason)


def level():
    value = os.environ.get(ENV_LOG, "").lower()
    return {"": 0, "0": 0, "off": 0, "1": 1, "info": 1, "true": 1, "2": 2, "debug": 2}.get(value, 1)


def record(cls, method, where, reason=None):
    key = f"{cls.__name__}.{method}"
    with _lock:
        _calls[key][where] += 1
        if reason:
            _reasons[key][reason] += 1
    if where == "cpu" and level() >= 2:
        print(f"[sklearn-gpu-bridge.accel] {key} ran on the CPU ({reason})", file=sys.stderr)


def calls():
    """``{"Class.method": {"worker": n, "cpu": n, "reasons": {reason: n}}}`` of this process so far."""
    with _lock:
        return {key: {"worker": c["worker"], "cpu": c["cpu"], "reasons": dict(_reasons[key])}
                for key, c in sorted(_calls.items())}


def table():
    """The calls as a text table: per class and method, on the worker, on the CPU, and why there."""
    rows = calls()
    if not rows:
        return "sklearn-gpu-bridge.accel: no call of a scikit-learn estimator was counted"
    width = max(len(k) for k in rows)
    lines = [f"{'call':{width}}  {'worker':>7}  {'CPU':>7}  why",
             f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 20}"]
    for key, row in rows.items():
        reasons = row["reasons"]
        why = "; ".join(f"{reason} ({n})" if len(reasons) > 1 else reason for reason, n in reasons.items())
        if row["worker"]:
            why = "served on the worker" + (f"; {why}" if why else "")
        lines.append(f"{key:{width}}  {row['worker']:>7}  {row['cpu']:>7}  {why}")
    return "\n".join(lines)


def reset():
    with _lock:
        _calls.clear()
        _reasons.clear()


def print_at_exit():
    """The table on stderr at exit, from the process that installed accel (joblib's workers stay quiet)."""
    if level() and os.environ.get(ENV_PARENT) == str(os.getpid()):
        print(table(), file=sys.stderr)
