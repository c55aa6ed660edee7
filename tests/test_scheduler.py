"""The worker's queue: clients served in turn, several requests at once, admission by device memory.

Real threads run real callables; what ran at once is recorded as it happens.
"""

import threading
import time

from sklearn_gpu_bridge.worker.scheduler import FairQueue

from .conftest import wait_until


class Recorder:
    """``run(item)`` that holds each item until released, recording which ran at the same time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = set()
        self.together = []  # the set running, each time one starts
        self.started = threading.Semaphore(0)
        self.release = {}

    def __call__(self, item):
        name = item[0]
        gate = self.release.setdefault(name, threading.Event())
        with self.lock:
            self.running.add(name)
            self.together.append(frozenset(self.running))
        self.started.release()
        gate.wait(10)
        with self.lock:
            self.running.discard(name)

    def let_go(self, name):
        self.release.setdefault(name, threading.Event()).set()


def _wait_started(recorder, n):
    for _ in range(n):
        assert recorder.started.acquire(timeout=10)


def test_threads_run_different_clients_requests_at_once():
    recorder = Recorder()
    queue = FairQueue(recorder, threads=3)
    try:
        for name in "abc":
            queue.submit(name, (name, 1))
        _wait_started(recorder, 3)
        assert recorder.together[-1] == {"a", "b", "c"} and queue.peak == 3
        for name in "abc":
            recorder.let_go(name)
    finally:
        queue.close()


def test_requests_wait_while_their_device_memory_does_not_fit():
    """Budget 100: two requests of 60 never run together; one of 30 runs beside one of 60."""
    recorder = Recorder()
    queue = FairQueue(recorder, threads=3, cost=lambda item: item[1], budget=100)
    try:
        queue.submit("a", ("a", 60))
        _wait_started(recorder, 1)
        queue.submit("b", ("b", 60))
        queue.submit("c", ("c", 30))
        _wait_started(recorder, 1)
        time.sleep(0.2)  # room for a wrong start of b (not timed: b must simply not have started)
        assert recorder.together[-1] == {"a", "c"} and queue.in_use == 90
        recorder.let_go("a")
        _wait_started(recorder, 1)
        assert recorder.together[-1] == {"b", "c"}
        recorder.let_go("b")
        recorder.let_go("c")
        assert all(not ({"a", "b"} <= seen) for seen in recorder.together)
    finally:
        queue.close()


def test_a_request_larger_than_the_budget_still_runs_alone():
    recorder = Recorder()
    queue = FairQueue(recorder, threads=2, cost=lambda item: item[1], budget=100)
    try:
        queue.submit("big", ("big", 500))
        _wait_started(recorder, 1)
        assert recorder.together[-1] == {"big"}
        recorder.let_go("big")
    finally:
        queue.close()


def test_one_client_at_a_time_is_served_by_the_thread_that_was_busy_last():
    """Requests one after another go to the thread that ran the last one (its core and caches are warm),
    not round the idle threads in turn, as a Condition's notify (the longest waiter first) would send them.
    With two at once, two threads run them."""
    ran_on, done = [], threading.Semaphore(0)

    def record(item):
        ran_on.append(threading.current_thread().name)
        done.release()

    queue = FairQueue(record, threads=4)
    try:
        for i in range(8):
            assert wait_until(lambda: len(queue._idle) == 4, 10, step=0.001)  # every thread waits again
            queue.submit("a", ("a", i))
            assert done.acquire(timeout=10)
        assert len(set(ran_on)) == 1, ran_on
    finally:
        queue.close()
    for thread in queue._threads:  # close() wakes the idle threads too, and they end
        thread.join(10)
    assert not any(thread.is_alive() for thread in queue._threads)


class Reader:
    """A ``lead`` function: hands out the requests put in its inbox, one per call, noting which thread read each."""

    def __init__(self, queue):
        self.queue, self.inbox = queue, []
        self.read_on, self.readers = {}, set()
        self.lock = threading.Condition()
        self.stopped = False

    def stop(self):
        """As the worker stops: the reader returns False, then the queue is closed."""
        with self.lock:
            self.stopped = True
            self.lock.notify_all()
        self.queue.close()

    def put(self, item):
        with self.lock:
            self.inbox.append(item)
            self.lock.notify_all()

    def __call__(self):
        self.readers.add(threading.current_thread().name)
        with self.lock:
            self.lock.wait_for(lambda: self.inbox or self.stopped)
            if not self.inbox:
                return False
            item = self.inbox.pop(0)
        self.read_on[item[0]] = threading.current_thread().name
        return self.queue.submit("client-" + item[0], item)


def test_a_request_runs_on_the_thread_that_read_it_while_another_thread_takes_over_reading():
    """Leader/followers: the reader runs what it read (no thread is woken before the request starts), and while
    it runs, another thread reads: a second request is read, and runs, beside the first."""
    recorder = Recorder()
    ran_on = {}

    def run(item):
        ran_on[item[0]] = threading.current_thread().name
        recorder(item)

    queue = FairQueue(run, threads=2)
    reader = Reader(queue)
    queue.lead_with(reader)
    try:
        assert queue.threads == 2  # one more thread reads
        assert wait_until(lambda: len(queue._idle) >= 2, 10, step=0.001)  # the others wait: one can take over
        reader.put(("a", 1))
        _wait_started(recorder, 1)
        reader.put(("b", 1))
        _wait_started(recorder, 1)
        assert ran_on == reader.read_on and ran_on["a"] != ran_on["b"], (ran_on, reader.read_on)
        assert recorder.together[-1] == {"a", "b"}
        assert wait_until(lambda: len(reader.readers) == 3, 10, step=0.001)  # a third thread reads meanwhile
        recorder.let_go("a"), recorder.let_go("b")
    finally:
        reader.stop()
    assert queue._leading is False  # close() returned after the reader left


def test_while_every_other_thread_is_busy_the_reader_keeps_reading_and_the_request_waits():
    """One request at a time (threads=1): the second waits for the first, and the reader does not run it."""
    recorder = Recorder()
    queue = FairQueue(recorder, threads=1)
    reader = Reader(queue)
    queue.lead_with(reader)
    try:
        reader.put(("a", 1))
        _wait_started(recorder, 1)
        reader.put(("b", 1))
        assert wait_until(lambda: queue.waiting() == 1, 10, step=0.001)
        reader.put(("c", 1))  # the reader reads on while "b" waits
        assert wait_until(lambda: queue.waiting() == 2, 10, step=0.001)
        assert queue.waiting() == 2 and recorder.running == {"a"} and queue.running == 1
        recorder.let_go("a")
        _wait_started(recorder, 1)
        assert recorder.together[-1] == {"b"} and queue.peak == 1
        recorder.let_go("b")
        _wait_started(recorder, 1)
        assert recorder.together[-1] == {"c"} and queue.peak == 1
        recorder.let_go("c")
    finally:
        reader.stop()


def test_a_held_back_client_waits_while_the_others_run():
    """``may_start``: a client the worker holds back (its replies unread) has its requests wait; others' run, and
    its own start once it may, without any new request to wake a thread."""
    recorder = Recorder()
    held = {"a"}
    queue = FairQueue(recorder, threads=2, may_start=lambda client: client not in held)
    try:
        queue.submit("a", ("a1", 1))
        queue.submit("b", ("b1", 1))
        _wait_started(recorder, 1)
        assert recorder.together[-1] == {"b1"}
        time.sleep(0.3)
        assert "a1" not in recorder.running and queue.waiting() == 1
        held.clear()  # its replies were read
        _wait_started(recorder, 1)
        assert "a1" in recorder.running
        for name in ("a1", "b1"):
            recorder.let_go(name)
    finally:
        queue.close()
