"""Elapsed time where a person waits (``start``, ``stop``, ``doctor``), and silence everywhere else.

:func:`waiting` wraps a blocking wait: a daemon thread, started only when
output is interactive, drives a :class:`Ticker` that prints nothing before
``after`` seconds (3 by default), then rewrites one line with the time
elapsed. A wait that ends quickly costs nothing.

Output goes to ``sys.stderr`` only when it is a terminal (and ``TERM`` is not
``dumb``), so scripts, pipes, log files and CI stay quiet. The setting
``progress`` (``set_config(progress=...)`` or ``SKLEARN_GPU_BRIDGE_PROGRESS``)
overrides that: ``auto`` (the default: terminals only), ``on``, ``off``.
"""

import os
import sys
import threading
import time
from contextlib import contextmanager

AFTER_SECONDS = 3.0
PREFIX = "sklearn-gpu-bridge"


def interactive(stream=None):
    """Whether progress should be shown on ``stream`` (default ``sys.stderr``) now."""
    from .config import get_setting

    setting = str(get_setting("progress")).lower()
    if setting in ("off", "0", "false", "no"):
        return False
    if setting in ("on", "1", "true", "yes"):
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # no stream (pythonw), or a closed one
        return False


def format_seconds(seconds):
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Ticker:
    """Prints ``label: 12 s`` on one terminal line, rewritten in place, once a wait passes ``after`` seconds.

    Cheap to create (it only reads the clock); whether to print is decided on
    the first ``tick()`` past ``after`` seconds.
    """

    def __init__(self, label, *, after=AFTER_SECONDS, stream=None, clock=time.monotonic):
        self.label = label
        self.after = after
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self._shown = None  # None: not decided yet; False: quiet; True: printing
        self._last = -1
        self._width = 0

    @property
    def elapsed(self):
        return self.clock() - self.started

    def tick(self):
        elapsed = self.elapsed
        if elapsed < self.after or self._shown is False:
            return
        if self._shown is None:
            self._shown = interactive(self.stream)
            if not self._shown:
                return
        if int(elapsed) != self._last:
            self._last = int(elapsed)
            self._write(f"\r{PREFIX}: {self.label}: {format_seconds(elapsed)}")

    def close(self, outcome="done"):
        """End the line if anything was printed (``outcome`` says how the wait ended)."""
        if self._shown:
            self._shown = False
            self._write(f"\r{PREFIX}: {self.label}: {outcome} after {self.elapsed:.1f} s\n")

    def _write(self, text):
        stream = sys.stderr if self.stream is None else self.stream
        pad = max(0, self._width - len(text))
        self._width = len(text.rstrip("\n"))
        try:
            stream.write(text.rstrip("\n") + " " * pad + ("\n" if text.endswith("\n") else ""))
            stream.flush()
        except (OSError, ValueError, AttributeError):
            self._shown = False  # the terminal went away: stop trying


@contextmanager
def waiting(label, *, after=AFTER_SECONDS, stream=None, interval=0.25):
    """Show elapsed time on the terminal while the ``with`` block runs longer than ``after`` s.

    Yields the :class:`Ticker`. Nothing starts (no thread) unless output is interactive.
    """
    ticker = Ticker(label, after=after, stream=stream)
    if not interactive(stream):
        yield ticker
        return
    stop = threading.Event()

    def run():
        while not stop.wait(interval):
            ticker.tick()

    thread = threading.Thread(target=run, name="sgb-progress", daemon=True)
    thread.start()
    outcome = "failed"
    try:
        yield ticker
        outcome = "done"
    finally:
        stop.set()
        thread.join()
        ticker.close(outcome)
