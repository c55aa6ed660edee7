"""What a request's hops cost when the threads have slept through a call: pyzmq, threads and shared memory alone.

    python benchmarks/wakeups.py [--calls 400] [--work-ms 3] [--out results/wakeups-HOST.json]

``hops.py`` times round trips back to back: every thread is still running
when the next message comes. A bridged call is different: the client waits
through the whole fit (milliseconds), so its threads and the worker's ZeroMQ
I/O thread sleep, and each must be woken again to carry the reply. On a VM of
many cores a halted vCPU is woken by the host, which costs far more than
waking a running one. Here a worker process (a thread reads a ROUTER, hands
the request to an executor thread that "works" ``--work-ms``, then answers)
serves a client in this process, in these ways:

- ``zmq``: the bridge as it is: the executor sends the reply on the ROUTER,
  the client sleeps in ``poll`` until it comes.
- ``zmq_client_spins``: the same, the client polling without sleeping.
- ``shm_reply``: the executor also writes a sequence number into memory
  both processes map; the client spins on it (the ZeroMQ reply is read
  later). Two of the reply's three wakeups (both I/O threads) are not waited for.
- ``shm_both``: the reply as ``shm_reply``; the request too is announced
  in the shared memory, and the executor watches it for ``--watch-ms`` after
  each reply (the next call of a fit+predict pair comes within that).
- ``zmq_no_handoff``: the reading thread works and answers itself (no executor).

Each way, ``--calls`` calls in pairs (a second call 0.3 ms of client work
after the first) with the work asleep (``sleep``: a thread waiting on the
GPU that yields) and busy (``spin``: CUDA's default wait when there are more
cores than GPUs); the figure is the call's time less the work.
"""

import argparse
import json
import mmap
import multiprocessing as mp
import os
import platform
import tempfile
import threading
import time

import numpy as np
import zmq

WAYS = ("zmq", "zmq_client_spins", "shm_reply", "shm_both", "zmq_no_handoff")
REQUEST, TAKEN, REPLY = 0, 1, 2  # int64 words of the shared page


def work(kind, seconds):
    if kind == "sleep":
        time.sleep(seconds)
    else:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def wait_word(words, index, value, seconds=None):
    """Spin until ``words[index] >= value`` (releasing the GIL between looks); False if ``seconds`` pass first."""
    end = None if seconds is None else time.perf_counter() + seconds
    while words[index] < value:
        if end is not None and time.perf_counter() > end:
            return False
        time.sleep(0)
    return True


def serve(address, way, kind, seconds, watch, page, ready):
    words = np.frombuffer(page, dtype=np.int64)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    lock, cond, queue = threading.Lock(), threading.Condition(), []
    claimed = threading.Lock()  # the executor and the reader agree on who runs an announced request

    def run(identity, seq):
        work(kind, seconds)
        if way in ("shm_reply", "shm_both"):
            words[REPLY] = seq
        with lock:
            router.send_multipart([identity, str(seq).encode()])

    def executor():
        identity = None
        while True:
            with cond:
                while not queue:
                    cond.wait()
                item = queue.pop(0)
            if item is None:
                return
            identity, seq = item
            run(identity, seq)
            if way == "shm_both":  # watch for the next request for a while
                while wait_word(words, REQUEST, seq + 1, watch):
                    with claimed:
                        seq = int(words[REQUEST])
                        if words[TAKEN] >= seq:
                            break
                        words[TAKEN] = seq
                    run(identity, seq)

    thread = threading.Thread(target=executor, daemon=True)
    thread.start()
    ready.set()
    while True:
        router.poll()
        while True:
            with lock:
                if not router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                identity, body = router.recv_multipart()
            if body == b"stop":
                with cond:
                    queue.append(None)
                    cond.notify()
                return
            seq = int(body)
            if way == "shm_both":
                with claimed:
                    if words[TAKEN] >= seq:
                        continue  # the executor saw it first
                    words[TAKEN] = seq
            if way == "zmq_no_handoff":
                run(identity, seq)
            else:
                with cond:
                    queue.append((identity, seq))
                    cond.notify()


def calls(way, kind, seconds, watch, n):
    folder = tempfile.mkdtemp(prefix="sgb-wakeups-")
    address = f"ipc://{folder}/s"
    page = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED: the forked worker maps the same page
    words = np.frombuffer(page, dtype=np.int64)
    ready = mp.get_context("fork").Event()
    server = mp.get_context("fork").Process(target=serve, args=(address, way, kind, seconds, watch, page, ready))
    server.start()
    ready.wait()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    firsts, seconds_ = [], []
    for seq in range(1, 2 * (n + 10) + 1):
        if seq % 2 == 1:
            time.sleep(0.02)  # between pairs: everything goes idle, as between a user's calls
        else:
            work("spin", 0.0003)  # the client's work between fit and predict
        start = time.perf_counter()
        if way == "shm_both":
            words[REQUEST] = seq
        sock.send(str(seq).encode())
        if way in ("shm_reply", "shm_both"):
            wait_word(words, REPLY, seq)
        else:
            while True:
                if way == "zmq_client_spins":
                    while not sock.poll(0):
                        pass
                else:
                    poller.poll()
                if int(sock.recv()) == seq:
                    break
        took = time.perf_counter() - start - seconds
        if seq > 20:
            (firsts if seq % 2 == 1 else seconds_).append(took)
        while sock.poll(0):  # replies already answered through the shared page
            sock.recv()
    sock.send(b"stop")
    server.join(5)
    sock.close(linger=0)
    return firsts, seconds_


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="pairs of calls per way and kind of work")
    parser.add_argument("--work-ms", type=float, default=3.0)
    parser.add_argument("--watch-ms", type=float, default=2.0)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = {}
    for kind in ("sleep", "spin"):
        for way in args.ways.split(","):
            firsts, seconds = calls(way, kind, args.work_ms / 1e3, args.watch_ms / 1e3, args.calls)
            row = rows[f"{way} ({kind})"] = {
                "first_median_ms": float(np.median(firsts) * 1e3), "second_median_ms": float(np.median(seconds) * 1e3),
                "first_p90_ms": float(np.percentile(firsts, 90) * 1e3),
                "second_p90_ms": float(np.percentile(seconds, 90) * 1e3)}
            print(f"{way:18s} work {kind:5s}: first call +{row['first_median_ms']:.3f} ms "
                  f"(p90 {row['first_p90_ms']:.3f}), second +{row['second_median_ms']:.3f} ms "
                  f"(p90 {row['second_p90_ms']:.3f})", flush=True)
    if args.out:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                   "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "params": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
