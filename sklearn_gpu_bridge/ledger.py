"""Where each call ran and what it cost, in this process and in the processes it starts: one report.

While a report is open (:func:`report`, or accel's ``-v``) every call of an estimator the bridge serves
(a ``GPU*`` method, or under accel a scikit-learn method) leaves a record: its name, where it ran (the
worker, by GPU and host; or this CPU, and why), the seconds its requests spent on the worker against the
seconds this process spent on them (encoding, sending, waiting, decoding), and the bytes they moved.

The processes this one starts (joblib's loky workers, multiprocessing, Dask workers on this host, and theirs)
inherit :data:`ENV_REPORT`, the name of this process tree's report folder, set when this module is first
imported. The folder exists only while a report is open (made private, in the user's runtime folder): each
of those processes then appends one line per call to its own file there (``<pid>.jsonl``, owner-only), and the
process that opened the report reads them when it reports. A process started before the report opened, as
a reused joblib worker is, knows the name too, so its calls are counted; a process that sees no folder
records nothing (a ``stat`` per call).
"""

import functools
import itertools
import math
import os
import re
import sys
import threading
import time

from .config import ENV_PREFIX

#: "<pid>-<random>": the report folder of the process tree whose top (that pid) imported this module first
ENV_REPORT = ENV_PREFIX + "REPORT"

_lock = threading.RLock()
_local = threading.local()  # .stack: the measures of this thread's calls in progress; .loose: requests outside one
_seq = itertools.count()
_open = []  # the reports open in this process
_records = []  # this process's records while a report is open here
_labels = {}  # worker id -> how the report names that worker
_TOKEN = re.compile(r"(\d{1,10})-[0-9a-f]{12}")
_role = None  # (pid, the report folder of the process above, or None)
_child_file = None  # (pid, (device, inode) of the folder, fd) of a child's records file


def _token_owner(token):
    """The pid a report folder's name (``<pid>-<12 hex digits>``) starts with; None for anything else, so that no
    name from the environment reaches a path outside the reports' folder."""
    match = _TOKEN.fullmatch(token)
    return int(match[1]) if match else None


def own():
    """Make this process the top of its own report tree: the processes it starts from now on report to it."""
    global _role
    with _lock:
        os.environ[ENV_REPORT] = f"{os.getpid()}-{os.urandom(6).hex()}"
        _role = None


if _token_owner(os.environ.get(ENV_REPORT, "")) is None:
    own()


def _folder_of(token):
    from .runtime.private_files import runtime_folder

    return runtime_folder() / "reports" / token


def _child_folder():
    """The report folder this process appends to (a process under the one that reports), or None.

    Worked out once per process (:func:`own` starts again): the name comes from the environment at that time.
    """
    global _role
    role = _role
    pid = os.getpid()
    if role is None or role[0] != pid:
        token, folder = os.environ.get(ENV_REPORT, ""), None
        if _token_owner(token) not in (None, pid):
            try:
                folder = str(_folder_of(token))
            except Exception:  # noqa: BLE001 - no usable runtime folder: this process records nothing
                folder = None
        role = _role = (pid, folder)
    return role[1]


def recording():
    """Whether calls are recorded now: a report is open in this process, or the folder of the one above exists."""
    if _open:
        return True
    folder = _child_folder()
    return folder is not None and os.path.isdir(folder)


# ---------------------------------------------------------------- measuring requests


class Measure:
    """What one call's requests cost: how many, seconds on the worker and in this process, bytes each way."""

    __slots__ = ("requests", "worker_s", "client_s", "sent", "received", "worker")

    def __init__(self):
        self.requests, self.worker_s, self.client_s, self.sent, self.received, self.worker = 0, 0.0, 0.0, 0, 0, None

    def add(self, other):
        self.requests += other.requests
        self.worker_s += other.worker_s
        self.client_s += other.client_s
        self.sent += other.sent
        self.received += other.received
        self.worker = other.worker or self.worker


def _stack():
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _loose():
    loose = getattr(_local, "loose", None)
    if loose is None:
        loose = _local.loose = Measure()
    return loose


def _take_loose():
    measure = _loose()
    _local.loose = Measure()
    return measure


def note(connection, header, reply, blobs, buffers, started):
    """One request of ``connection`` done (``reply`` None: it raised), begun at ``started`` (``time.monotonic``).

    The worker's time is its reply's ``worker_span`` (for a request that raised, the transport's stamps of
    it); in process, the request's own time. Bytes are those of the arrays as they travelled (the transport
    writes their descriptors into ``header["arrays"]``, the worker into its reply's; an array the worker kept
    travels as its key alone) and of the blobs (pickled parameters, states).
    """
    ended = time.monotonic()
    measure = Measure()
    measure.requests = 1
    measure.client_s = ended - started
    transport = connection.transport
    in_process = getattr(transport, "info", None) is None
    if in_process:
        measure.worker_s = measure.client_s
    else:
        span = reply.get("worker_span") if reply is not None else None
        if span is None:
            stamps = connection.last_stamps
            span = stamps[2] if stamps is not None and stamps[0] >= started else None
        if span:
            measure.worker_s = max(0.0, span[1] - span[0])
        measure.sent = _array_bytes(header.get("arrays")) + sum(len(memoryview(b).cast("B")) for b in (blobs or {}).values())
        if reply is not None:
            arrays = reply.get("arrays")
            measure.received = _array_bytes(arrays) if arrays else sum(_nbytes(b) for b in buffers or ())
    measure.worker = _worker_label(connection, in_process)
    stack = _stack()
    (stack[-1] if stack else _loose()).add(measure)


def _nbytes(buffer):
    return getattr(buffer, "nbytes", None) or len(getattr(buffer, "bytes", buffer))


def _array_bytes(descriptors):
    import numpy as np

    total = 0
    for desc in descriptors or ():
        if isinstance(desc, dict) and desc.get("where") != "cached":
            try:
                total += np.dtype(desc["dtype"]).itemsize * math.prod(desc["shape"])
            except (KeyError, TypeError, ValueError):
                continue
    return total


def _worker_label(connection, in_process):
    """How the report names the worker of ``connection``: its GPU (or the CPU), its host, its process."""
    capabilities = connection.capabilities
    label = _labels.get(capabilities.worker_id)
    if label is not None:
        return label
    versions = capabilities.versions or {}
    if capabilities.backend == "cuml":
        device = versions.get("gpu") or "a GPU"
        index = versions.get("gpu_index")
        device = f"{device} (GPU {index})" if index is not None else device
        what = f"{device}, cuML {versions.get('cuml', '?')}"
    else:
        reason = capabilities.fallback_reason
        what = "the CPU (scikit-learn" + (f": {reason})" if reason else ")")
    if in_process:
        import socket

        visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0]
        where = f"in process {os.getpid()} on {socket.gethostname()}" + (f", CUDA device {visible}" if visible else "")
    else:
        info = connection.info
        where = f"worker pid {info.pid} on {versions.get('host') or _host(info.address)}"
    label = _labels[capabilities.worker_id] = f"{what}; {where}"
    return label


def _host(address):
    """The host of a worker's address: this host's name for a local socket or loopback."""
    import socket

    if address.startswith("ipc://"):
        return socket.gethostname()
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return socket.gethostname() if host in ("127.0.0.1", "localhost", "::1") else host


# ---------------------------------------------------------------- records


def metered(function=None, *, name=None):
    """Record each call of a ``GPU*`` wrapper's ``function`` (its first argument names the method, unless
    ``name`` does). A wrapper that serves a scikit-learn estimator under accel leaves its measure to accel's
    record of that estimator's call instead."""
    if function is None:
        return functools.partial(metered, name=name)

    @functools.wraps(function)
    def run(self, *args, **kwargs):
        if not recording():
            return function(self, *args, **kwargs)
        stack = _stack()
        stack.append(Measure())
        done = False
        try:
            result = function(self, *args, **kwargs)
            done = True
        finally:
            measure = stack.pop()
            accel = getattr(self, "_accel_params", None) is not None
            if not done or accel:  # a failed call, or accel's: counted with the record that follows
                (stack[-1] if stack else _loose()).add(measure)
        if accel:
            return result
        call = f"{type(self).__name__}.{name or args[0]}"
        if measure.requests:
            record(call, "worker", measure=measure)
        else:
            record(call, "cpu", "answered in this process by the fitted model's portable form", measure=measure)
        return result

    return run


def record(call, where, reason=None, measure=None):
    """Record one call: ``where`` "worker" or "cpu" (with ``reason``); ``measure`` its requests' cost (None:
    this thread's requests since its last record, as accel's records take them)."""
    if not recording():
        return
    if measure is None:
        measure = _take_loose()
    entry = {"call": call, "where": where, "reason": reason, "pid": os.getpid(), "seq": next(_seq),
             "t": time.time(), "requests": measure.requests, "worker_s": measure.worker_s,
             "client_s": measure.client_s, "sent": measure.sent, "received": measure.received,
             "worker": measure.worker if measure.requests else None}
    if _open:
        with _lock:
            _records.append(entry)
    folder = _child_folder()
    if folder is not None:
        _append(folder, entry)


def _unlinked(fd):
    """Whether the file open as ``fd`` was removed (its report closed; a folder made again may reuse the inode)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


def _append(folder, entry):
    """One line in this process's file of the report folder (opened once per folder, owner-only)."""
    global _child_file
    import json

    from .runtime.private_files import CLOEXEC, NOFOLLOW

    try:
        found = os.stat(folder)
    except OSError:
        return  # the report closed meanwhile
    inode = (found.st_dev, found.st_ino)
    with _lock:
        held = _child_file
        if held is None or held[0] != os.getpid() or held[1] != inode or _unlinked(held[2]):
            if held is not None and held[0] == os.getpid():
                os.close(held[2])
            try:
                fd = os.open(os.path.join(folder, f"{os.getpid()}.jsonl"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW | CLOEXEC, 0o600)
            except OSError:
                _child_file = None
                return
            held = _child_file = (os.getpid(), inode, fd)
        try:
            os.write(held[2], (json.dumps(entry) + "\n").encode())
        except OSError:
            pass


# ---------------------------------------------------------------- reports


class Report:
    """The calls recorded while it is open, in this process and in those it started; ``str()`` is a table.

    Use it as a context manager (:func:`report`). Inside the block it reads what is recorded so far; after,
    it keeps what the block recorded.

    Attributes
    ----------
    records : list of dict
        One per call: ``call`` ("GPUSVC.fit", "SVC.fit" under accel), ``where`` ("worker" or "cpu"),
        ``reason`` (why on the CPU), ``pid`` (the process that made the call), ``worker`` (the worker that
        served it: GPU, host, process), ``requests``, ``worker_s`` (seconds on the worker), ``client_s``
        (seconds this process spent on its requests), ``sent`` and ``received`` (bytes).
    """

    def __init__(self, title="sklearn-gpu-bridge", earlier=()):
        self.title = title
        self.opened = self.closed = None
        self._kept = None
        self._folder = None
        self._earlier = list(earlier)  # records of a report before this one, counted first (accel's, reinstalled)

    def __enter__(self):
        with _lock:
            if _token_owner(os.environ.get(ENV_REPORT, "")) != os.getpid():
                own()  # a report opened below another: this process's children report here
            if not _open:
                self._folder = _make_folder()
            else:
                self._folder = _open[0]._folder
            self.opened = time.time()
            self._kept = None
            _open.append(self)
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stop recording into this report, keeping what it recorded (the folder goes with the last one open)."""
        import shutil

        with _lock:
            if self not in _open:
                return
            self.closed = time.time()
            self._kept = self._gather()
            _open.remove(self)
            if not _open:
                _records.clear()
                if self._folder is not None:
                    shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    @property
    def records(self):
        if self._kept is not None:
            return self._earlier + self._kept
        if self.opened is None:
            return list(self._earlier)
        with _lock:
            return self._earlier + self._gather()

    def _gather(self):
        until = self.closed or float("inf")
        own_records = [r for r in _records if self.opened <= r["t"] <= until]
        theirs = []
        if self._folder is not None:
            theirs = [r for r in _read_folder(self._folder) if self.opened <= r["t"] <= until]
        seen, out = set(), []
        for entry in own_records + theirs:
            key = (entry.get("pid"), entry.get("seq"))
            if key not in seen:
                seen.add(key)
                out.append(entry)
        return out

    def calls(self):
        """``{call: {"worker": n, "cpu": n, "reasons": {reason: n}, "processes": n, "worker_s", "client_s",
        "requests", "sent", "received", "workers": [labels]}}``, sorted by call."""
        rows = {}
        for entry in self.records:
            row = rows.setdefault(entry["call"], {
                "worker": 0, "cpu": 0, "reasons": {}, "pids": set(), "worker_s": 0.0, "client_s": 0.0,
                "requests": 0, "sent": 0, "received": 0, "workers": []})
            row["worker" if entry["where"] == "worker" else "cpu"] += 1
            if entry.get("reason"):
                row["reasons"][entry["reason"]] = row["reasons"].get(entry["reason"], 0) + 1
            row["pids"].add(entry["pid"])
            for key in ("worker_s", "client_s", "requests", "sent", "received"):
                row[key] += entry.get(key) or 0
            if entry.get("worker") and entry["worker"] not in row["workers"]:
                row["workers"].append(entry["worker"])
        out = {}
        for call in sorted(rows):
            row = rows[call]
            row["processes"] = len(row.pop("pids"))
            out[call] = row
        return out

    def table(self, empty=None):
        """The calls as a text table: per call, how many on the worker and on the CPU, in how many processes,
        seconds on the worker and in the client, bytes sent and received, which worker, and why there."""
        rows = self.calls()
        if not rows:
            return empty or f"{self.title}: no call was recorded"
        workers = []
        for row in rows.values():
            workers.extend(w for w in row["workers"] if w not in workers)
        ids = {label: f"w{i + 1}" for i, label in enumerate(workers)}
        pids = {}
        for entry in self.records:
            pids[entry["pid"]] = pids.get(entry["pid"], 0) + 1
        me = os.getpid()
        parts = [f"pid {pid}{' (this one)' if pid == me else ''}: {n}"
                 for pid, n in sorted(pids.items(), key=lambda item: (item[0] != me, item[0]))]
        lines = [f"{self.title}: {sum(pids.values())} calls recorded, in {len(pids)} "
                 f"process{'es' if len(pids) != 1 else ''} ({'; '.join(parts)})"]
        lines.extend(f"  {short} = {label}" for label, short in ids.items())
        width = max(len("call"), *(len(k) for k in rows))
        lines.append(f"{'call':{width}}  {'worker':>7}  {'CPU':>7}  {'procs':>5}  {'worker s':>9}  {'client s':>9}"
                     f"  {'sent':>9}  {'received':>9}  {'on':<5}  why")
        lines.append("  ".join(["-" * width, "-" * 7, "-" * 7, "-" * 5, "-" * 9, "-" * 9, "-" * 9, "-" * 9, "-" * 5,
                                "-" * 20]))
        for call, row in rows.items():
            reasons = row["reasons"]
            why = "; ".join(f"{reason} ({n})" if len(reasons) > 1 else reason for reason, n in reasons.items())
            if row["worker"]:
                why = "served on the worker" + (f"; {why}" if why else "")
            on = ",".join(ids[w] for w in row["workers"]) or "-"
            lines.append(f"{call:{width}}  {row['worker']:>7}  {row['cpu']:>7}  {row['processes']:>5}"
                         f"  {row['worker_s']:>9.3f}  {row['client_s']:>9.3f}  {_size(row['sent']):>9}"
                         f"  {_size(row['received']):>9}  {on:<5}  {why}")
        return "\n".join(lines)

    def __str__(self):
        return self.table()

    def __repr__(self):
        state = "open" if self in _open else "closed" if self.closed else "not opened"
        return f"<Report {state}: {len(self.records)} calls>"


def report() -> Report:
    """A report of the bridge's calls made while the ``with`` block runs, here and in processes started here.

    Returns
    -------
    Report
        Print it for a table: per call, how many ran on the worker and on the CPU (and why), in how many
        processes, seconds on the worker against seconds in the client, bytes moved, and which worker
        (GPU, host, process).

    Examples
    --------
    >>> import sklearn_gpu_bridge as sgb                                # doctest: +SKIP
    >>> with sgb.report() as r:                                         # doctest: +SKIP
    ...     GridSearchCV(sgb.GPUSVC(), {"C": [1, 10]}, n_jobs=2).fit(X, y)
    >>> print(r)                                                        # doctest: +SKIP
    """
    return Report()


def _make_folder():
    """This tree's report folder, new and private; folders left by reports whose process is gone are removed."""
    import shutil

    try:
        from .runtime.private_files import make_private_folder, pid_alive

        token = os.environ[ENV_REPORT]
        folder = _folder_of(token)
        parent = make_private_folder(folder.parent)
        for old in parent.iterdir():
            owner = _token_owner(old.name)
            if old.name != token and owner is not None and not pid_alive(owner):
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        return make_private_folder(folder)
    except Exception as exc:  # noqa: BLE001 - a report of this process alone is still a report
        print(f"sklearn-gpu-bridge: the report counts this process only ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return None


def _read_folder(folder):
    """The records the other processes of the tree wrote into ``folder`` (a torn last line is passed over)."""
    import json

    from .runtime.private_files import read_private_file

    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".jsonl"):
            continue
        try:
            text = read_private_file(os.path.join(folder, name), "report file")
        except Exception:  # noqa: BLE001 - a file that is not ours, or gone: not read
            continue
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and {"call", "where", "pid", "t"} <= entry.keys():
                out.append(entry)
    return out


def _size(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"
