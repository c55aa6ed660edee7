"""Work of many clients, served in turn.

Each client has its own queue; the executor threads take the next request of
the client with work waiting that was served least recently (one never
served goes first), so one client's backlog never holds up another client's
next request by more than the request already running. An idle thread that was busy most
recently takes the next request: its core and caches are the warmest. A client may have only so many
requests queued (more are refused at once), and when a client is freed (it
said goodbye, died, or went silent) its queued requests are dropped: the
work of a dead client never runs. A client may also be held back (``may_start``:
the worker holds too many bytes of its replies, unread): its requests wait
while the others' run.

With a ``lead`` function (:meth:`FairQueue.lead_with`), one more thread is
started and the threads take turns at it (leader/followers): one thread
leads, reading requests, and when it has queued one that can run now while
an idle thread can take over reading, it hands the reading over and runs
that request itself. The request so starts on the thread that read it, warm,
without waiting for another thread to be woken (0.1-0.2 ms on a GPU VM); the
wake of the new reader happens while the request runs.
"""

import itertools
import logging
import threading
import time
from collections import deque

log = logging.getLogger("sklearn_gpu_bridge.worker")
FORGET_AFTER = 10_000  # clients remembered with no work waiting, at most
LEAD = object()  # _next: this thread is to read requests
RECHECK_SECONDS = 0.05  # while only held-back clients have work, idle threads look again this often


class FairQueue:
    """Round robin over clients' queues, served by ``threads`` threads that call ``run(item)``.

    With ``cost(item)`` (bytes of device memory a request may need) and a
    ``budget`` (bytes), requests run at once only while their costs fit in the
    budget: one that does not fit waits until running ones finish (the first
    always runs, however large). Many clients then share one GPU without
    running it out of memory.

    With ``may_start(client)``, a client's next request starts only while it says True (asked under the queue's
    lock, and again every :data:`RECHECK_SECONDS` while work waits for held-back clients alone).
    """

    def __init__(self, run, threads=1, max_queued=64, cost=None, budget=None, after=None, may_start=None):
        self.run = run
        self.may_start = may_start
        self.after = after  # after(item): called on the thread that ran item, once it no longer counts as running
        self.max_queued = max_queued
        self.cost = cost if budget else None
        self.budget = budget
        self.in_use = 0  # the costs of the requests running now
        self.running = 0
        self.peak = 0  # the most requests that ran at once (status)
        self._queues = {}  # client -> deque of items; a client is here only while it has work
        self._served = {}  # client -> when it was last served (a tick); kept after its queue empties
        self._ticks = itertools.count(1)
        self._lock = threading.RLock()
        self._ready = threading.Condition(self._lock)  # admission waits on it
        self._idle = []  # the waits (on the same lock) of the threads with nothing to do, the latest idle last
        self._closed = False
        self._lead = None  # () -> True once it has queued a request (lead_with); None: no thread reads
        self._leading = False  # a thread is in _lead
        self._threads = []
        for _ in range(threads):
            self._start_thread()

    def _start_thread(self):
        thread = threading.Thread(target=self._serve, args=(threading.Condition(self._lock),),
                                  name=f"sgb-work-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def lead_with(self, lead):
        """From now on one thread at a time calls ``lead()``, which reads requests and submits them, and returns
        True once it has submitted one, False once there is nothing more to read (its owner stops; close()
        follows). One more thread is started, so that ``threads`` requests can still run at once while another
        thread reads."""
        with self._ready:
            self._lead = lead
            self._start_thread()

    def submit(self, client, item):
        """Queue ``item`` for ``client``; False if the client already has ``max_queued`` waiting.

        Once a thread leads (:meth:`lead_with`), only ``lead`` and ``after`` submit: the reader runs or hands
        on what it queued, and ``after``'s thread takes the next request itself once it returns.
        """
        with self._ready:
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = deque()
                if client not in self._served:
                    if len(self._served) > FORGET_AFTER:  # forget the idle: they count as never served again
                        self._served = {c: t for c, t in self._served.items() if c in self._queues}
                    self._served[client] = 0  # never served: before everyone who was
            elif len(queue) >= self.max_queued:
                return False
            queue.append(item)
            if self._idle and self._lead is None:  # a leader runs what it submits, or leaves it to a busy thread
                self._idle.pop().notify()  # the thread that went idle last (LIFO): a Condition would wake the longest idle
            return True

    def cancel(self, client):
        """Drop the requests ``client`` has waiting; returns them (they never run)."""
        with self._ready:
            self._served.pop(client, None)
            return list(self._queues.pop(client, ()))

    @property
    def threads(self):
        """How many requests may run at once."""
        return len(self._threads) - (self._lead is not None)

    def waiting(self):
        with self._ready:
            return sum(len(q) for q in self._queues.values())

    def busy(self):
        """Whether a request runs or waits (a look without the lock: it may be out of date at once)."""
        return bool(self.running or self._queues)

    def close(self, wait=5.0):
        """Drop what waits and end the threads once their requests are done; returns once no thread is in
        ``lead`` (``lead`` must return soon once its owner stops), or after ``wait`` seconds."""
        with self._ready:
            self._closed = True
            self._queues.clear()
            self._served.clear()
            while self._idle:
                self._idle.pop().notify()
            self._ready.notify_all()
            if not self._ready.wait_for(lambda: not self._leading, timeout=wait):
                log.warning("a thread still reads %.0f s after close", wait)

    def _next(self, wake):
        """What this thread does next: (item, cost) to run, LEAD, or None once closed."""
        with self._ready:
            while not self._closed:
                if self._lead is not None and not self._leading:
                    self._leading = True
                    return LEAD
                client = self._eligible()
                if client is not None:
                    return self._take(client)
                self._idle.append(wake)
                if not wake.wait(RECHECK_SECONDS if self._queues else None) and wake in self._idle:
                    self._idle.remove(wake)  # timed out: no one took it off
            return None

    def _eligible(self):
        """The client whose request runs next: served least recently among those ready (under the lock)."""
        if not self._queues:
            return None
        if self.may_start is None:
            return min(self._queues, key=self._served.__getitem__)
        ready = [client for client in self._queues if self._may_start(client)]
        return min(ready, key=self._served.__getitem__) if ready else None

    def _may_start(self, client):
        try:
            return self.may_start(client)
        except Exception:  # noqa: BLE001 - a bug must not stop a client's work for good
            log.exception("could not tell whether a client's request may start")
            return True

    def _take(self, client):
        """The next request of ``client``, once admitted (under the lock)."""
        queue = self._queues[client]
        item = queue.popleft()
        self._served[client] = next(self._ticks)  # its next request waits for the others' turns
        if not queue:
            del self._queues[client]
        cost = self._admit(item)
        self.running += 1
        self.peak = max(self.peak, self.running)
        return item, cost

    def _read(self):
        """Lead until a request can run on this thread (another takes over reading): (item, cost); None once
        closed. While every other thread is busy, this one keeps reading; what it queued waits for them."""
        try:
            while True:
                try:
                    submitted = self._lead()
                except Exception:  # noqa: BLE001 - a bug must not stop the reading
                    log.exception("reading requests failed; reading on")
                    time.sleep(0.1)
                    submitted = None
                with self._ready:
                    if submitted is False:  # nothing more to read: its owner stops, and close() follows
                        self._ready.wait_for(lambda: self._closed)
                    if self._closed:
                        return None
                    client = self._eligible() if self._idle else None
                    if client is not None:
                        self._leading = False
                        self._idle.pop().notify()  # it leads from now on; this thread runs the request
                        return self._take(client)
                    if self._queues and self._idle:  # held back: an idle thread looks again now and then
                        self._idle.pop().notify()
        finally:
            with self._ready:
                if self._leading and self._closed:
                    self._leading = False
                    self._ready.notify_all()  # close() waits for it

    def _admit(self, item):
        """Wait (holding no client's turn but this one) until ``item``'s cost fits beside the running ones."""
        if self.cost is None:
            return 0
        try:
            cost = max(0, int(self.cost(item)))
        except Exception:  # noqa: BLE001 - a request whose size cannot be read costs nothing here
            cost = 0
        while self.running and self.in_use + cost > self.budget and not self._closed:
            self._ready.wait()
        self.in_use += cost
        return cost

    def _serve(self, wake):
        while (taken := self._next(wake)) is not None:
            if taken is LEAD and (taken := self._read()) is None:
                break
            item, cost = taken
            try:
                self.run(item)
            except Exception:  # noqa: BLE001 - a bug must not kill the thread that serves everyone
                log.exception("a request failed in the scheduler")
            finally:
                with self._ready:
                    self.running -= 1
                    self.in_use -= cost
                    self._ready.notify_all()
            if self.after is not None:
                try:
                    self.after(item)
                except Exception:  # noqa: BLE001 - a bug must not kill the thread that serves everyone
                    log.exception("a request's follow-up failed in the scheduler")
