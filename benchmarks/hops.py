"""What each hop of a request costs on this machine: pyzmq and threads alone, no bridge code.

    python benchmarks/hops.py [--repeats 2000] [--out results/hops-HOST.json]

A client (a DEALER in this process) sends an empty message over ipc to a
ROUTER served by a thread of a second process, which answers it:

- ``direct``: the thread that reads the request answers it (the floor: a
  ZeroMQ round trip, the worker's quick ops).
- ``handoff_inproc``: the reading thread hands the request to another thread
  (a ``threading.Condition``), which gives the reply back through an inproc
  PUSH for the reading thread to send (the worker's work ops before 2026-11-24).
- ``handoff_direct``: handed to another thread as above, which sends the reply
  itself on the ROUTER, under a lock (the socket moves between threads with a
  full memory barrier, as ZeroMQ allows).
- ``condition_pingpong``: two threads of one process waking each other with
  a Condition, per round trip (two wakeups): what a handoff costs.

On a machine of many cores a thread woken on an idle core costs far more than
on two busy ones (an interrupt between cores, virtualised on a VM): these
figures tell which hops are worth removing there.
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import tempfile
import threading
import time

import numpy as np
import zmq


def serve(address, mode, ready):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    results = ctx.socket(zmq.PULL)
    results.bind("inproc://results")
    lock = threading.Lock()
    cond = threading.Condition()
    work = []

    def executor():
        push = ctx.socket(zmq.PUSH)
        push.connect("inproc://results")
        while True:
            with cond:
                while not work:
                    cond.wait()
                frames = work.pop()
            if frames is None:
                return
            if mode == "handoff_direct":
                with lock:
                    router.send_multipart(frames)
                    if router.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the send may have taken the fd's signal
                        push.send(b"")
            else:
                push.send_multipart(frames)

    thread = threading.Thread(target=executor, daemon=True)
    thread.start()
    poller = zmq.Poller()
    # handoff_direct: the socket is polled by its fd (edge-triggered: read EVENTS after every use), never
    # used outside the lock, so that another thread may send on it
    poller.register(router.FD if mode == "handoff_direct" else router, zmq.POLLIN)
    poller.register(results, zmq.POLLIN)
    ready.set()
    while True:
        poller.poll()
        while results.poll(0):
            frames = results.recv_multipart()
            if mode != "handoff_direct":
                router.send_multipart(frames)
        while True:
            with lock:
                if not router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    break
                frames = router.recv_multipart()
            if frames[-1] == b"stop":
                with cond:
                    work.append(None)
                    cond.notify()
                return
            if mode == "direct":
                with lock:
                    router.send_multipart(frames)
            else:
                with cond:
                    work.append(frames)
                    cond.notify()


def roundtrips(mode, repeats):
    folder = tempfile.mkdtemp(prefix="sgb-hops-")
    address = f"ipc://{folder}/s"
    ready = mp.Event()
    server = mp.Process(target=serve, args=(address, mode, ready))
    server.start()
    ready.wait()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    times = []
    for i in range(repeats + 100):
        start = time.perf_counter()
        sock.send(b"x")
        sock.recv()
        if i >= 100:
            times.append(time.perf_counter() - start)
    sock.send(b"stop")
    server.join(5)
    sock.close(linger=0)
    return times


def condition_pingpong(repeats):
    cond = threading.Condition()
    turn = ["main"]

    def other():
        for _ in range(repeats + 100):
            with cond:
                while turn[0] != "other":
                    cond.wait()
                turn[0] = "main"
                cond.notify()

    thread = threading.Thread(target=other)
    thread.start()
    times = []
    for i in range(repeats + 100):
        start = time.perf_counter()
        with cond:
            turn[0] = "other"
            cond.notify()
            while turn[0] != "main":
                cond.wait()
        if i >= 100:
            times.append(time.perf_counter() - start)
    thread.join()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = {}
    for mode in ("direct", "handoff_inproc", "handoff_direct", "condition_pingpong"):
        times = condition_pingpong(args.repeats) if mode == "condition_pingpong" else roundtrips(mode, args.repeats)
        ms = np.array(times) * 1e3
        rows[mode] = {"median_ms": float(np.median(ms)), "p10_ms": float(np.percentile(ms, 10)),
                      "p90_ms": float(np.percentile(ms, 90))}
        print(f"{mode:20s} median {rows[mode]['median_ms']:.3f} ms  p10 {rows[mode]['p10_ms']:.3f}  "
              f"p90 {rows[mode]['p90_ms']:.3f}")
    if args.out:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                   "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
