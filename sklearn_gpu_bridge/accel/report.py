"""Where each call of a scikit-learn estimator ran (the worker or this CPU), and why there.

The process that installed accel (:data:`ENV_PARENT`) keeps a :class:`~sklearn_gpu_bridge.ledger.Report`
open from its first counted call to its exit, so the table counts the calls made in the processes it starts
too (joblib's ``n_jobs``), with the worker's time against this process's time and the bytes moved. Those
processes append their calls to the report's folder (:mod:`sklearn_gpu_bridge.ledger`) and print nothing.
"""

import os
import sys
import threading
from collections import Counter, defaultdict

from .. import ledger

ENV_LOG = "SKLEARN_GPU_BRIDGE_ACCEL_LOG"  #: "1"/"info": the table at exit; "debug": each CPU call too
ENV_PARENT = "SKLEARN_GPU_BRIDGE_ACCEL_PARENT"  #: the pid that prints the table (not joblib's children)
TITLE = "sklearn-gpu-bridge.accel"
EMPTY = f"{TITLE}: no call of a scikit-learn estimator was counted"

_lock = threading.Lock()
_calls = defaultdict(Counter)  # "Class.method" -> Counter(worker=, cpu=): this process's, whatever records
_reasons = defaultdict(Counter)  # "Class.method" -> Counter(reason)
_session = None  # the parent's report, open from its first counted call


def level():
    value = os.environ.get(ENV_LOG, "").lower()
    return {"": 0, "0": 0, "off": 0, "1": 1, "info": 1, "true": 1, "2": 2, "debug": 2}.get(value, 1)


def start():
    """Open the parent's report now, before any call (idempotent; only in the process that installed accel,
    and only where the table is asked for: ``-v``, :data:`ENV_LOG`). Without it, calls are counted in this
    process alone, with nothing measured or kept per call.

    A process started before this point, and before the parent's first counted call, reports to whatever
    report its own parent holds.
    """
    global _session
    if level() and _closed(_session) and os.environ.get(ENV_PARENT) == str(os.getpid()):
        with _lock:
            if _closed(_session):  # reinstalled: the calls counted before go on counting
                _session = ledger.Report(TITLE, earlier=_session.records if _session else ()).__enter__()


def _closed(session):
    return session is None or session.closed is not None


def stop():
    """Stop recording (accel taken out): the parent's report keeps what it counted, and its folder, where the
    processes it started append their calls, goes. :func:`start` opens a new one that counts on from it."""
    with _lock:
        session = _session
    if session is not None:
        session.close()


def record(cls, method, where, reason=None):
    """Count one call of ``cls.method``, on the "worker" or the "cpu" (and why), with its requests' cost."""
    key = f"{cls.__name__}.{method}"
    with _lock:
        _calls[key][where] += 1
        if reason:
            _reasons[key][reason] += 1
    if _session is None:
        start()
    ledger.record(key, where, reason)
    if where == "cpu" and level() >= 2:
        print(f"[{TITLE}] {key} ran on the CPU ({reason})", file=sys.stderr)


def calls():
    """``{"Class.method": {"worker": n, "cpu": n, "reasons": {reason: n}, ...}}``: the parent's report (the
    calls of the processes it started too, with ``processes``, ``worker_s``, ``client_s``, ``sent``,
    ``received`` and ``workers``), or elsewhere this process's counts."""
    if _session is not None:
        return _session.calls()
    with _lock:
        return {key: {"worker": c["worker"], "cpu": c["cpu"], "reasons": dict(_reasons[key])}
                for key, c in sorted(_calls.items())}


def table():
    """The calls as a text table: per class and method, on the worker, on the CPU, in how many processes,
    seconds on the worker and in this process, bytes moved, which worker, and why there."""
    if _session is not None:
        return _session.table(empty=EMPTY)
    rows = calls()
    if not rows:
        return EMPTY
    width = max(len(k) for k in rows)
    lines = [f"{'call':{width}}  {'worker':>7}  {'CPU':>7}  why", f"{'-' * width}  {'-' * 7}  {'-' * 7}  {'-' * 20}"]
    for key, row in rows.items():
        reasons = row["reasons"]
        why = "; ".join(f"{reason} ({n})" if len(reasons) > 1 else reason for reason, n in reasons.items())
        if row["worker"]:
            why = "served on the worker" + (f"; {why}" if why else "")
        lines.append(f"{key:{width}}  {row['worker']:>7}  {row['cpu']:>7}  {why}")
    return "\n".join(lines)


def reset():
    """Forget what was counted: the parent's report closes (it opens again with the next call)."""
    global _session
    with _lock:
        _calls.clear()
        _reasons.clear()
        session, _session = _session, None
    if session is not None:
        session.close()


def print_at_exit():
    """The table on stderr at exit, from the process that installed accel (joblib's workers stay quiet)."""
    if level() and os.environ.get(ENV_PARENT) == str(os.getpid()):
        print(table(), file=sys.stderr)
    reset()
