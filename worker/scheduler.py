"""Work of many clients, served in turn.

Each client has its own queue; the executor threads take the next request of
the client with work waiting that was served least recently (one never
served goes first), so one client's backlog never holds up another client's
next request by more than the request already running. An idle thread that was busy most
recently takes the next request: its core and caches are the warmest. A client may have only so many
requests queued (more are refused at once), and when a client is freed (it
said goodbye, died, or went silent) its queued requests are dropped: the
work of a dead client never runs.
"""

import itertools
import logging
import threading
from collections import deque

log = logging.getLogger("sklearn_gpu_bridge.worker")
FORGET_AFTER = 10_000  # clients remembered with no work waiting, at most


class FairQueue:
    """Round robin over clients' queues, served by ``threads`` threads that call ``run(item)``.

    With ``cost(item)`` (bytes of device memory a request may need) and a
    ``budget`` (bytes), requests run at once only while their costs fit in the
    budget: one that does not fit waits until running ones finish (the first
    always runs, however large). Many clients then share one GPU without
    running it out of memory.
    """

    def __init__(self, run, threads=1, max_queued=64, cost=None, budget=None):
        self.run = run
        self.max_queued = max_queued
        self.cost = cost if budget else None
        self.budget = budget
        self.in_use = 0  # the costs of the requests running now
        self.running = 0
        self.peak = 0  # the most requests that ran at once (status)
        self._queues = {}  # client -> deque of items; a client is here only while it has work
        self._served = {}  # client -> when it was last served (a tick); kept after its queue empties
        self._ticks = itertools.count(1)
        lock = threading.RLock()
        self._ready = threading.Condition(lock)  # admission waits on it
        self._idle = []  # the waits (on the same lock) of the threads with nothing to do, the latest idle last
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, args=(threading.Condition(lock),),
                                          name=f"sgb-work-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, client, item):
        """Queue ``item`` for ``client``; False if the client already has ``max_queued`` waiting."""
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
            if self._idle:  # the thread that went idle last (LIFO): a Condition would wake the longest idle
                self._idle.pop().notify()
            return True

    def cancel(self, client):
        """Drop the requests ``client`` has waiting; returns them (they never run)."""
        with self._ready:
            self._served.pop(client, None)
            return list(self._queues.pop(client, ()))

    @property
    def threads(self):
        return len(self._threads)

    def waiting(self):
        with self._ready:
            return sum(len(q) for q in self._queues.values())

    def close(self):
        with self._ready:
            self._closed = True
            self._queues.clear()
            self._served.clear()
            while self._idle:
                self._idle.pop().notify()
            self._ready.notify_all()

    def _next(self, wake):
        with self._ready:
            while not self._queues and not self._closed:
                self._idle.append(wake)
                wake.wait()  # whoever notifies it has taken it off _idle
            if self._closed:
                return None
            client = min(self._queues, key=self._served.__getitem__)  # served least recently
            queue = self._queues[client]
            item = queue.popleft()
            self._served[client] = next(self._ticks)  # its next request waits for the others' turns
            if not queue:
                del self._queues[client]
            cost = self._admit(item)
            self.running += 1
            self.peak = max(self.peak, self.running)
            return item, cost

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
