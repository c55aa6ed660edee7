"""The warnings of a request, caught on the thread that runs it, for its reply.

``warnings.catch_warnings`` swaps state of the whole process (the filters, the function that shows a
warning) and puts back on exit what it found on entry. The worker runs requests of several clients at once
on its threads, so two that overlap would swap it under each other: a warning of one request lands in the
other's reply (another client's), or on the worker's stderr when the other exits first, and the last to exit
leaves the process showing warnings to a list no one reads. Here one function shows every warning, installed
once, and hands it to the request running on the thread that warned; elsewhere (the worker's own threads)
warnings are shown as before, and so are those of threads an estimator starts inside a request (joblib's):
they go to the worker's stderr, not into the reply. Every warning is shown, as ``simplefilter("always")``
would: the client warns again with each, under its user's filters.
"""

import threading
import warnings
from contextlib import contextmanager

_ALWAYS = ("always", None, Warning, None, 0)  # what simplefilter("always") puts first in warnings.filters
_local = threading.local()
_shown_before = warnings.showwarning


def _show(message, category, filename, lineno, file=None, line=None):
    caught = getattr(_local, "caught", None)
    if caught is None:
        return _shown_before(message, category, filename, lineno, file, line)
    caught.append((category.__module__, category.__name__, str(message)))


@contextmanager
def caught_warnings():
    """``[(module, category, message)]`` of the warnings this thread raises inside the block."""
    if warnings.showwarning is not _show:  # installed at the first request, and again if anyone put theirs back
        warnings.showwarning = _show
    if not warnings.filters or warnings.filters[0] != _ALWAYS:
        warnings.simplefilter("always")
    _local.caught = found = []
    try:
        yield found
    finally:
        _local.caught = None
