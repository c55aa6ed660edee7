"""The worker: a ZeroMQ ROUTER socket in front of a backend.

Its executor threads take turns reading the ROUTER socket (leader/followers,
:mod:`.scheduler`): the thread that reads answers quick operations (hello,
attach, ping, status, release, goodbye, shutdown: :attr:`Worker.QUICK`)
itself and queues work (:mod:`.dispatch`), one client's request after
another's; when another thread is idle, that one takes over the reading and
the reader runs the request it read, so a request never waits for a sleeping
thread to be woken. Each thread sends its replies on the same socket itself:
the socket is used under a lock only, and the reader waits on its file
descriptor, never inside the socket, so the socket moves between threads with
a full memory barrier, as ZeroMQ allows. So the worker still answers ``ping``
while a long fit runs: that is how a client tells "busy" from "dead". The
reader also sweeps silent clients; the thread that called
:meth:`Worker.serve_forever` watches the parent. Clients on this host may
also send requests and read replies through their own pool (:mod:`.fastpath`).

A worker drives one GPU, or each of several (``gpus``, :mod:`.devices`): the
queue places each request on one, and the thread that runs it makes that GPU
current (``backend.on_device``) for the whole request, from decoding its
input to freeing what it released. By default the command serves several GPUs
from a process each instead (:mod:`.front`): each of those is a Worker of one
GPU behind the front (``front``).

What reaches the reading thread at all is decided first, as for every
:class:`~.listener.Listener` (the address's gate); a message of too many frames
is dropped as it is read. A message that fails its signature, or is malformed in
any way, is dropped and counted; it never reaches pickle and never stops the
loop.
"""

import contextlib
import logging
import os
import select
import tempfile
import threading
import time
from collections import Counter

import zmq

from sklearn_gpu_bridge.config import WORKER_DEFAULTS
from sklearn_gpu_bridge.errors import ConfigurationError, ProtocolError, describe
from sklearn_gpu_bridge.protocol import new_id, to_plain
from sklearn_gpu_bridge.protocol.session import MAX_FRAMES, Duplicate, StaleMessage, message_waits
from sklearn_gpu_bridge.shm import default_directory
from sklearn_gpu_bridge.version import __version__

from .cache import ArrayCache
from .caught_warnings import caught_warnings
from .clients import Clients
from .devices import Devices, device_failure, parse_gpus
from .dispatch import WORK, Operations
from .fastpath import FastPath, open_doorbell
from .handles import HandleTable
from .landing import LandingBuffers, keep_frames_in_heap
from .listener import HWM, Listener, read_message
from .quick_ops import QuickOps
from .scheduler import FairQueue
from .wire import FramesRequest, input_bytes, memory_note

log = logging.getLogger("sklearn_gpu_bridge.worker")

#: device memory a request may need, as a multiple of its input: admission waits while it does not fit
DEVICE_MEMORY_FACTOR = 4
SWEEP_SECONDS = 1.0
TRACK_REPLIES_FROM = 64 << 10  # bytes: a reply this large is followed until ZeroMQ lets it go (clients.ready)
MAX_READ_IN_TURN = 64  # messages the reading thread reads before it looks at its clock (sweeps)


def calls_per_device(threads, several):
    """Estimator calls run at once on each GPU: ``threads``, or where it is 0, 4 on one GPU and 8 on each of
    ``several`` (in one process, or in a process each behind a front). The client of a search over several GPUs
    runs more of its own work at once, and a call behind a front takes one more hop: more calls in flight keep
    each GPU busy (measured: docs/scale-out.md)."""
    return int(threads) or (8 if several else 4)


class Worker(Listener, QuickOps, FastPath):
    """Serves one backend on one address until shut down; keyword arguments as :data:`config.WORKER_DEFAULTS`."""

    def __init__(self, backend, *, connection_file=None, parent_pid=None, fallback_reason=None, key=None,
                 bind=WORKER_DEFAULTS["bind"], port=WORKER_DEFAULTS["port"], threads=WORKER_DEFAULTS["threads"],
                 pool_dirs=WORKER_DEFAULTS["pool_dirs"], key_file=WORKER_DEFAULTS["key_file"],
                 curve_secret_key=WORKER_DEFAULTS["curve_secret_key"], curve_allow=WORKER_DEFAULTS["curve_allow"],
                 client_timeout=WORKER_DEFAULTS["client_timeout"], max_queued=WORKER_DEFAULTS["max_queued"],
                 max_frame_mb=WORKER_DEFAULTS["max_frame_mb"], array_cache_mb=WORKER_DEFAULTS["array_cache_mb"],
                 watch_ms=WORKER_DEFAULTS["watch_ms"], idle_exit=WORKER_DEFAULTS["idle_exit"],
                 gpus=WORKER_DEFAULTS["gpus"], front=None):
        self.front = None if front is None else parse_front(front)  # (the front's run id, this process's GPU)
        self._listen(connection_file=connection_file, parent_pid=parent_pid, key=key, bind=bind, port=port,
                     key_file=key_file, curve_secret_key=curve_secret_key, curve_allow=curve_allow,
                     watch_ms=watch_ms, threads=threads, max_frame_mb=max_frame_mb, idle_exit=idle_exit,
                     worker_id=self.front and self.front[0])
        self.backend = backend
        self.versions = {"sklearn-gpu-bridge": __version__, **backend.versions()}  # asked once
        self.fallback_reason = fallback_reason
        self.watch_ms = float(watch_ms)
        self.devices = open_devices(backend, gpus, label=self.front and self.front[1])
        self.handles = HandleTable(on_device=backend.on_device if self.devices.driven else None,
                                   tag=self.front and self.front[1])
        self.operations = Operations(backend, self.handles)
        cache_bytes = int(array_cache_mb * (1 << 20))
        self.array_cache = ArrayCache(cache_bytes) if cache_bytes > 0 else None
        pool_dirs = list(dict.fromkeys([*pool_dirs, default_directory(), tempfile.gettempdir()]))
        self.pinning = backend.host_pinning()
        self.landing = LandingBuffers(pinning=self.pinning)
        self.clients = Clients(self.handles, self.array_cache, pool_dirs, float(client_timeout or 0),
                               on_free=self._cancel, pinning=self.pinning)
        self.several = len(self.devices) > 1 or self.front is not None  # this process's GPUs, or its front's
        self.queue = FairQueue(self._work, threads=calls_per_device(threads, self.several) * len(self.devices),
                               max_queued=max_queued,
                               cost=lambda item: DEVICE_MEMORY_FACTOR * self._carried_bytes(item),
                               devices=self.devices, affinity=self._affinity if len(self.devices) > 1 else None,
                               # behind a front, a request in a slot may be for another GPU's process: none
                               # is taken from a slot here, the front hands each to its process
                               after=None if self.front else self._follow, may_start=self.clients.ready)
        self.counts = Counter()
        self._local = threading.local()
        self.wakeup = None  # inproc PULL socket: wakes the thread that reads (_lead) from its poll
        self._init_fast_path()
        self._router_lock = threading.RLock()  # whoever uses the ROUTER socket holds it (the reader, the others)
        self._close_lock, self._closed = threading.Lock(), False

    # ------------------------------------------------------------ lifecycle

    def start(self):
        """Warm up, bind, and write the connection file (which means: ready)."""
        for device in self.devices:
            with self._on(device):
                self.backend.warm_up(first=device is self.devices.all[0])
        self.landing.heap_kept = keep_frames_in_heap()
        self._open_router(hwm=0 if self.front else HWM)  # behind a front: one peer carries every client's messages
        # the socket's descriptor is edge-triggered: after each use of the socket, its EVENTS must be read
        # again, since the use may have taken the descriptor's signal. A thread that sends a reply and then
        # finds a message waiting wakes the reading thread through this inproc socket.
        self.wakeup = self.context.socket(zmq.PULL)
        self.wakeup.bind(f"inproc://wakeup-{self.worker_id}")
        self.doorbell = (open_doorbell(self.socket_path)  # behind a front, requests come through it alone
                         if self.socket_path is not None and self.front is None else None)
        self._announce(self.backend.name, os.getpid())
        return self

    def serve_forever(self):
        """Serve until SIGINT/SIGTERM, a shutdown request, the parent's death, or ``idle_exit`` seconds
        without clients.

        The executor threads take turns reading the socket (:meth:`_lead`, see :mod:`.scheduler`); this
        thread watches the parent and the idle time.
        """
        self._poller = zmq.Poller()
        self._poller.register(self.router.getsockopt(zmq.FD), zmq.POLLIN)
        self._poller.register(self.wakeup, zmq.POLLIN)
        if self.doorbell is not None:
            self._poller.register(self.doorbell[1].fileno(), zmq.POLLIN)
            self._bell_waiting = select.poll()  # the doorbell alone: _input_waiting
            self._bell_waiting.register(self.doorbell[1].fileno(), select.POLLIN)
        self._last_sweep = time.monotonic()
        self._catch_signals()
        self.queue.lead_with(self._lead)
        try:
            while not self._stopping.wait(SWEEP_SECONDS) and not self._should_stop():
                pass
        finally:
            self.close()

    def _busy(self):
        return len(self.clients) > 0 or self.queue.busy()

    def close(self):
        with self._close_lock:
            if self._closed:
                return  # serve_forever's own close after another thread's
            self._closed = True
        self._stopping.set()
        if self.wakeup is not None:
            self._wake()  # the reading thread returns from its poll at once
        self.queue.close()  # waits (a moment) until no thread reads: the sockets are closed below
        self.clients.close()
        if self.doorbell is not None:
            self.doorbell[1].close()
        self._close_gates(self.doorbell and self.doorbell[0])
        with self._router_lock:  # no executor thread is inside the socket
            self.context.destroy(linger=0)
        log.info("worker stopped")

    # ------------------------------------------------------------ reading

    def _lead(self):
        """Read messages until one is work queued for a thread (True), or the worker stops (False).

        Quick operations are answered here, and silent clients swept (by the reader alone: a sweep may forget
        a client between two of its messages). Messages already waiting are read before the socket's descriptor
        is polled: it signals only what arrives after the last look.
        """
        self._local.leading = True
        try:
            while not self._stopping.is_set():
                if time.monotonic() - self._last_sweep > SWEEP_SECONDS:  # first: a reader may return at once
                    self._last_sweep = time.monotonic()
                    self.clients.sweep()
                drained = True
                for _ in range(MAX_READ_IN_TURN):
                    with self._router_lock:
                        if self.router.closed or not message_waits(self.router):
                            break
                        try:
                            if self._receive():
                                return True
                        except Exception:  # noqa: BLE001 - a message must never stop the reading; say so loudly
                            self.counts["failed"] += 1
                            log.exception("a message could not be handled; dropped it")
                else:
                    drained = False  # more are waiting: read on after a look at the clock, not at the descriptor
                if not drained:
                    continue
                events = dict(self._poller.poll(200))
                if self.doorbell is not None and events.get(self.doorbell[1].fileno()) and self._answer_bell():
                    return True
                if events.get(self.wakeup):
                    while self.wakeup.poll(0):
                        self.wakeup.recv(zmq.NOBLOCK)
            return False
        finally:
            self._local.leading = False

    def _receive(self):
        """Read one message: answer it, drop it, or queue it as work (True)."""
        frames = read_message(self.router, self.refused)
        arrived = time.monotonic()
        if frames is None:
            self._log_dropped(ProtocolError(f"a message of more than {MAX_FRAMES} frames"))
            return
        return self._accept(frames[0], frames[1:], arrived)

    def _accept(self, identity, frames, arrived, owner=None):
        """Answer, drop, or queue as work (True) a message's frames; ``owner``: they were read from that
        client's request slot (:meth:`_follow`), and must be that client's request."""
        try:  # digests: on the work thread
            header, buffers = self.session.unpack(frames, check_buffers=False, slot_of=owner)
        except StaleMessage as exc:  # signed, but not for now: say why (clocks that differ are a setup error)
            self._log_dropped(exc)
            if owner is None:  # from a slot: its ZeroMQ copy is as stale, and says so
                self._reply(identity, self._error_reply({}, exc))
            return
        except Duplicate:  # the second of a request's two copies (ZeroMQ, its request slot)
            self.counts["second_copies"] += 1
            return
        except ProtocolError as exc:
            self._log_dropped(exc)
            return
        if owner is not None:
            self.counts["from_slot"] += 1
        op = header["op"]
        self.last_message = arrived
        self.counts[op if op in WORK or op in self.QUICK else "unknown"] += 1
        client = header.get("client")
        if not isinstance(client, str):
            client = header["client"] = None
        if op in WORK and client is None:
            self._reply(identity, self._error_reply(header, ProtocolError(f"a {op!r} request must name its client")))
        elif op in WORK:
            if owner is None:
                self._disarm(client, header.get("next_slot"))
            state = self.clients.seen(client, working=True)
            if self.queue.submit(client, (identity, header, buffers, state, arrived)):
                return True
            self.clients.answered(state)
            self.refused["queue_full"] += 1
            error = ProtocolError(f"this client already has {self.queue.max_queued} requests waiting; "
                                  "wait for their replies")
            self._reply(identity, self._error_reply(header, error))
        elif op in self.QUICK:
            self.clients.seen(client, working=False)
            try:
                self.session.check_buffers(header, buffers)  # quick ops carry none: nothing to hash
            except ProtocolError as exc:
                self._log_dropped(exc)
                return
            self._reply(identity, self._handle(header, buffers))
        else:
            self._reply(identity, self._error_reply(header, ProtocolError(f"unknown operation {op!r}")))

    def _carried_bytes(self, item):
        """The input a queued request really carries (wire.input_bytes): what admission charges it."""
        header, buffers = item[1], item[2]
        client, cache = header.get("client"), self.array_cache
        pool_segment = None
        if header.get("pool"):
            try:
                attachment = self.clients.attachment(client, header["pool"])
            except ProtocolError:
                attachment = None
            if attachment is not None:
                pool_segment = lambda segment: _segment_size(attachment, segment)  # noqa: E731
        cached = None
        if cache is not None:
            cached = lambda key: getattr(cache.get((client, key)), "nbytes", 0)  # noqa: E731
        return input_bytes(header, buffers, pool_segment, cached)

    def _affinity(self, item):
        """The device a queued request must run on: that of the model it reads, the first one for a model of an
        estimator that runs there only (``backend.first_device_only``); None for any other."""
        header = item[1]
        name = header.get("estimator")
        if type(name) is str and name in self.backend.first_device_only and len(self.devices) > 1:
            return self.devices.all[0].index
        return self.handles.device_of(header.get("handle"), header.get("client"))

    def _on(self, device):
        """The context a request on ``device`` runs in: the device current (where the worker drives it)."""
        return self.backend.on_device(device.index) if self.devices.driven else contextlib.nullcontext()

    def _cancel(self, client):
        """Drop the work a freed client still has waiting: it never runs, and its replies would reach no one."""
        self._disarm_client(client)
        dropped = self.queue.cancel(client)
        for _, _, _, state, _ in dropped:
            self.clients.answered(state)
        self.counts["cancelled"] += len(dropped)

    # ------------------------------------------------------------ replying

    def _reply(self, identity, frames, state=None):
        """Send a reply, from whichever thread has it (under the socket's lock); wake the reading thread if the
        send took the signal of a message that has arrived meanwhile. A large reply to a client (``state``) is
        followed until ZeroMQ lets it go: the bytes it holds unread hold back that client's next requests."""
        nbytes = sum(memoryview(frame).nbytes for frame in frames) if state is not None else 0
        if nbytes >= TRACK_REPLIES_FROM:  # its last frame goes last, and is tracked: the reply's own copy
            frames = [*frames[:-1], zmq.Frame(frames[-1], copy=False, track=True)]
        with self._router_lock:
            if self.router.closed:
                return  # stopped while this request ran: the client is told by the closed connection
            tracker = self.router.send_multipart([identity, *frames], copy=False)
            waiting = message_waits(self.router)
        if nbytes >= TRACK_REPLIES_FROM and tracker is not None:
            self.clients.replied(state, tracker, nbytes)
        if waiting and not getattr(self._local, "leading", False):
            self._wake()

    def _wake(self):
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.context.socket(zmq.PUSH)
            push.linger = 0
            push.connect(f"inproc://wakeup-{self.worker_id}")
        try:
            push.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # a thousand wakeups are waiting already: the reader is coming
            pass

    # ------------------------------------------------------------ running work

    def _work(self, item, device):
        """Run a queued work request on this executor thread, on ``device``, and send its reply."""
        identity, header, buffers, state, arrived = item
        try:
            self.session.check_buffers(header, buffers)
        except ProtocolError as exc:  # a frame that is not what was signed: dropped, like a bad signature
            self.clients.answered(state)
            self._log_dropped(exc)
            return
        try:
            with self._on(device):
                frames = self._handle(header, buffers, arrived, device)
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer, or the client waits forever
            log.exception("a request failed outside its operation")
            frames = self._error_reply(header, exc, device)
        try:
            self._publish(header, frames)
        finally:
            self.clients.answered(state)
        self._reply(identity, frames, state)
        # Only now drop the models the request released: freeing one takes milliseconds (a forest of 100
        # trees takes 10-14 ms on an H200), which the reply need not wait for. Peak memory is what cuML
        # in process has too, where rebinding a name frees the old model after the new one is fitted.
        freed, self._local.freed = self._local.freed, None
        if freed:
            self.handles.drop(freed)

    def _handle(self, header, buffers, arrived=None, device=None):
        """Run one operation, quick or work; always returns reply frames, never raises.

        ``arrived``: when the message was read (CLOCK_MONOTONIC seconds); None: now. ``device``: the device a
        work request runs on (current already).
        """
        started = time.monotonic() if arrived is None else arrived
        request = None
        try:
            freed = self.handles.release(self._releases(header), header.get("client"))
            quick = self.QUICK.get(header["op"])
            if quick is None:  # out of the table now; the models themselves go after the reply (_work)
                self._local.freed = freed
                request = FramesRequest(header, buffers, clients=self.clients, backend=self.backend,
                                        pinning=self.pinning, array_cache=self.array_cache,
                                        landing=self.landing)
                if self.devices.driven:
                    device.check()
                    request.device = device.index
            with caught_warnings() as caught:  # this thread's alone: requests of other clients run beside it
                if quick is not None:
                    self.handles.drop(freed)  # each model with its own GPU current
                    fields, reply_buffers = quick(self, header), []
                else:
                    fields, reply_buffers = request.reply(self.operations.run(request))
                    if device is not None:
                        device.served()
            # when the message arrived and its reply was ready (CLOCK_MONOTONIC, which processes on one
            # host share): the client tells the worker's share of a call from the sockets'
            reply = {"op": "reply", "id": new_id(), "parent": header.get("id"), **fields,
                     "worker_span": [started, time.monotonic()]}
            if request is not None and request.kept:
                reply["cache_kept"] = request.kept
            if caught:
                reply["warnings"] = caught
            return self.session.pack(reply, reply_buffers)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            return self._error_reply(header, exc, device)
        finally:
            if request is not None:
                request.let_go()

    def _error_reply(self, header, exc, device=None):
        reply = {"op": "error", "id": new_id(), "parent": header.get("id"), **describe(exc, to_plain)}
        if isinstance(exc, MemoryError):
            reply["message"] += memory_note(header, self.backend)
            reply["args"] = (reply["message"],)
        kind = device_failure(exc) if device is not None and self.several else None
        if kind is not None:  # the device is named, and the request alone fails: the other devices carry on
            gave_up = device.failure(kind, exc)
            what = "out of device memory" if kind == "memory" else "a CUDA error"
            reply["message"] += f" [worker: {what} on {device.name}; its other GPUs carry on" + (
                f"; {device.name} now counts as unusable: {device.unusable}]" if gave_up else "]")
            reply["args"] = (reply["message"],)
            if gave_up:
                log.error("%s is unusable from now on: %s", device.name, device.unusable)
                if self.front is not None:  # its process ends: the front fails what it still had, and goes on
                    self._stopping.set()
        return self._pack_error(reply)

    @staticmethod
    def _releases(header):
        """The handles a request asks the worker to free (``release``), checked."""
        handles = header.get("release") or []
        if not isinstance(handles, list):
            raise ProtocolError("'release' must be a list of handles")
        return handles


def parse_front(front):
    """(run id, GPU index) of the ``front`` setting ``RUN_ID:INDEX``: this process serves that GPU (the only one
    it sees) behind the front of that run (:mod:`.front`)."""
    run_id, _, index = str(front).rpartition(":")
    if not run_id or not index.isdigit():
        raise ConfigurationError(f"front must be RUN_ID:GPU_INDEX, not {front!r}")
    return run_id, int(index)


def open_devices(backend, gpus, label=None):
    """The :class:`.devices.Devices` of the ``gpus`` setting: None, the process's current device as it is (named
    GPU ``label`` where given: a process behind a front); else the GPUs it names, each one made ready
    (``backend.open_devices``)."""
    if gpus is None and label is not None:
        return Devices([backend.serve_as(label)], [label])
    if gpus is None:
        return Devices([backend.memory_budget()])
    indices = parse_gpus(gpus, backend.device_count())
    devices = Devices(backend.open_devices(indices), indices, driven=True)
    log.info("driving %s", ", ".join(f"{d.name} (budget {d.budget if d.budget is not None else 'none'})"
                                    for d in devices))
    return devices


def _segment_size(attachment, segment):
    """The size of a segment of a client's pool (0 where it has none such)."""
    try:
        return attachment._segment(segment)[1]
    except Exception:  # noqa: BLE001 - PoolError, or anything odd: the decoder refuses it later
        return 0
