"""The warnings of a request, caught on the thread that runs it, for its reply.

``warnings.catch_warnings(record=True)`` swaps state of the whole process (the filters, the function that
shows a warning) and puts back on exit what it found on entry. The worker runs requests of several clients
at once on its threads, so two that overlap would swap it under each other: a warning of one request would
land in the other's reply (another client's), or on the worker's stderr when the other exited first.

Here the state is swapped once for all the requests that run at once: when the first of them starts, every
warning is shown (``simplefilter("always")``: the client warns again with each, under its user's filters)
through one function, which hands it to the request running on the thread that warned; when the last of them
ends, the process's own filters and function are put back. A warning of a thread that runs no request (the
worker's own, or one that an estimator starts inside a request, such as joblib's) is shown the process's
way, on the worker's stderr, not put into a reply.
"""

import threading
import warnings
from contextlib import contextmanager

_local = threading.local()
_lock = threading.Lock()
_running = 0  # requests inside caught_warnings now
_saved = None  # the catch_warnings that holds the process's own state while requests run
_shown_before = None  # the process's own showwarning, read as the first of the requests starts


def _show(message, category, filename, lineno, file=None, line=None):
    caught = getattr(_local, "caught", None)
    if caught is None:  # no request on this thread: the process's way
        return _shown_before(message, category, filename, lineno, file, line)
    caught.append((category.__module__, category.__name__, str(message)))


@contextmanager
def caught_warnings():
    """``[(module, category, message)]`` of the warnings this thread raises inside the block."""
    global _running, _saved, _shown_before
    with _lock:
        if _running == 0:
            _saved = warnings.catch_warnings()
            _saved.__enter__()
            _shown_before = warnings.showwarning
            warnings.showwarning = _show
            warnings.simplefilter("always")
        _running += 1
    outer, _local.caught = getattr(_local, "caught", None), []
    try:
        yield _local.caught
    finally:
        _local.caught = outer
        with _lock:
            _running -= 1
            if _running == 0:
                _saved.__exit__(None, None, None)
                _saved = None
