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

There is one queue of clients however many GPUs the worker drives: fairness is
across clients, and placement is per request, as it is admitted
(:class:`.devices.Devices`): a request that reads a fitted model waits for
room on that model's GPU, any other takes the least loaded GPU it fits on.
"""

import itertools
import logging
import threading
import time
from collections import deque

from .devices import Devices

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

    With ``devices`` (:class:`.devices.Devices`), each device has a budget of
    its own, a request runs on the one :meth:`.devices.Devices.place` chooses,
    as ``run(item, device)``, and ``affinity(item)`` names the device index a
    request must run on (None: any); ``budget`` is then theirs.

    With ``may_start(client)``, a client's next request starts only while it says True (asked under the queue's
    lock, and again every :data:`RECHECK_SECONDS` while work waits for held-back clients alone).
    """

    def __init__(self, run, threads=1, max_queued=64, cost=None, budget=None, after=None, may_start=None,
                 devices=None, affinity=None):
        self.run = run
        self.may_start = may_start
        self.after = after  # after(item): called on the thread that ran item, once it no longer counts as running
        self.max_queued = max_queued
        self._placing = devices is not None  # run(item, device); else run(item)
        self.devices = devices if devices is not None else Devices([budget])
        self.affinity = affinity
        self.cost = cost if any(device.budget for device in self.devices) else None
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

    @property
    def budget(self):
        """Bytes of device memory that requests running at once may use, on all devices (None: no limit)."""
        return self.devices.budget

    @property
    def in_use(self):
        """The costs of the requests running now, on all devices."""
        return self.devices.in_use

    def submit(self, client, item):
        """Queue ``item`` for ``client``; False if the client already has ``max_queued`` waiting.

        Once a thread leads (:meth:`lead_with`), only ``lead`` and ``after`` submit: the reader runs or hands
        on what it queued, and ``after``'s thread takes the next request itself once it returns.
        """
        pinned = self._pinned(item)
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
            queue.append((item, pinned))
            if pinned is not None:
                pinned.queued += 1
            if self._idle and self._lead is None:  # a leader runs what it submits, or leaves it to a busy thread
                self._idle.pop().notify()  # the thread that went idle last (LIFO): a Condition would wake the longest idle
            return True

    def cancel(self, client):
        """Drop the requests ``client`` has waiting; returns them (they never run)."""
        with self._ready:
            self._served.pop(client, None)
            return [self._unqueued(entry) for entry in self._queues.pop(client, ())]

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
            for queue in self._queues.values():
                for entry in queue:
                    self._unqueued(entry)
            self._queues.clear()
            self._served.clear()
            while self._idle:
                self._idle.pop().notify()
            self._ready.notify_all()
            if not self._ready.wait_for(lambda: not self._leading, timeout=wait):
                log.warning("a thread still reads %.0f s after close", wait)

    def _pinned(self, item):
        """The device ``item`` must run on (its model's), or None: wherever it fits."""
        if self.affinity is None:
            return None
        try:
            return self.devices.get(self.affinity(item))
        except Exception:  # noqa: BLE001 - a bug must not lose a request: it runs where it fits, and fails there
            log.exception("could not tell which device a request is for")
            return None

    @staticmethod
    def _unqueued(entry):
        """The item of a queue entry taken out of its queue (under the lock)."""
        item, pinned = entry
        if pinned is not None:
            pinned.queued -= 1
        return item

    def _next(self, wake):
        """What this thread does next: (item, cost, device) to run, LEAD, or None once closed."""
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
        """The next request of ``client``, once admitted (under the lock): (item, cost, device)."""
        queue = self._queues[client]
        item, pinned = entry = queue.popleft()
        self._unqueued(entry)
        self._served[client] = next(self._ticks)  # its next request waits for the others' turns
        if not queue:
            del self._queues[client]
        cost, device = self._admit(item, pinned)
        device.start(cost)
        self.running += 1
        self.peak = max(self.peak, self.running)
        return item, cost, device

    def _read(self):
        """Lead until a request can run on this thread (another takes over reading): (item, cost, device); None once
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

    def _admit(self, item, pinned):
        """Wait (holding no client's turn but this one) until ``item``'s cost fits beside the running ones on a
        device (``pinned``, where it must run there): (cost, device)."""
        cost = 0
        if self.cost is not None:
            try:
                cost = max(0, int(self.cost(item)))
            except Exception:  # noqa: BLE001 - a request whose size cannot be read costs nothing here
                cost = 0
        index = None if pinned is None else pinned.index
        while (device := self.devices.place(cost, index)) is None and not self._closed:
            self._ready.wait()
        return cost, device or self.devices.place(cost, index, room=False)

    def _serve(self, wake):
        while (taken := self._next(wake)) is not None:
            if taken is LEAD and (taken := self._read()) is None:
                break
            item, cost, device = taken
            try:
                if self._placing:
                    self.run(item, device)
                else:
                    self.run(item)
            except Exception:  # noqa: BLE001 - a bug must not kill the thread that serves everyone
                log.exception("a request failed in the scheduler")
            finally:
                with self._ready:
                    self.running -= 1
                    device.finish(cost)
                    self._ready.notify_all()
            if self.after is not None:
                try:
                    self.after(item)
                except Exception:  # noqa: BLE001 - a bug must not kill the thread that serves everyone
                    log.exception("a request's follow-up failed in the scheduler")
