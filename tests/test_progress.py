"""Elapsed time for people at a terminal, silence for scripts and CI."""

import io
import time

import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.progress import Ticker, format_seconds, interactive, waiting


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture(autouse=True)
def _progress_auto(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("SKLEARN_GPU_BRIDGE_PROGRESS", raising=False)
    yield
    sklearn_gpu_bridge.set_config(progress=None)


def test_ticker_is_quiet_before_three_seconds_then_counts_on_one_line():
    stream, clock = Terminal(), Clock()
    ticker = Ticker("fit on the worker", stream=stream, clock=clock)
    for step in (0.5, 1.0, 2.9):
        clock.now = 100 + step
        ticker.tick()
    assert stream.getvalue() == ""
    clock.now = 103.2
    ticker.tick()
    ticker.tick()  # the same second: not written again
    clock.now = 104.0
    ticker.tick()
    clock.now = 104.6
    ticker.close()
    out = stream.getvalue()
    assert out == ("\rsklearn-gpu-bridge: fit on the worker: 3 s"
                   "\rsklearn-gpu-bridge: fit on the worker: 4 s"
                   "\rsklearn-gpu-bridge: fit on the worker: done after 4.6 s\n")


def test_ticker_says_nothing_when_not_a_terminal():
    stream, clock = io.StringIO(), Clock()
    ticker = Ticker("fit", stream=stream, clock=clock)
    clock.now = 200
    ticker.tick()
    ticker.close()
    assert stream.getvalue() == ""


def test_a_quick_call_prints_nothing_even_on_a_terminal():
    stream, clock = Terminal(), Clock()
    ticker = Ticker("predict", stream=stream, clock=clock)
    clock.now = 101
    ticker.tick()
    ticker.close()
    assert stream.getvalue() == ""


def test_setting_overrides_the_terminal_check(monkeypatch):
    assert interactive(Terminal()) and not interactive(io.StringIO())
    with sklearn_gpu_bridge.config_context(progress="off"):
        assert not interactive(Terminal())
    monkeypatch.setenv("SKLEARN_GPU_BRIDGE_PROGRESS", "on")
    assert interactive(io.StringIO())
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("SKLEARN_GPU_BRIDGE_PROGRESS", "auto")
    assert not interactive(Terminal())
    assert not interactive(object())  # no isatty at all


def test_waiting_ticks_from_a_thread_only_when_interactive():
    stream = Terminal()
    with waiting("stopping the worker", after=0.2, stream=stream, interval=0.05):
        time.sleep(0.5)
    out = stream.getvalue()
    assert "stopping the worker: 0 s" in out
    assert "stopping the worker: done after" in out and out.endswith("\n")
    quiet = io.StringIO()
    with waiting("stopping the worker", after=0.0, stream=quiet, interval=0.01):
        time.sleep(0.1)
    assert quiet.getvalue() == ""


def test_waiting_says_failed_when_the_block_raises():
    stream = Terminal()
    with pytest.raises(RuntimeError):
        with waiting("start", after=0.0, stream=stream, interval=0.01):
            time.sleep(0.1)
            raise RuntimeError("boom")
    assert "start: failed after" in stream.getvalue()


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (59.9, "59 s"), (61, "1 min 01 s"), (3725, "1 h 02 min")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
