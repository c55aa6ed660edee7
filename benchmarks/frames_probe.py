"""Where 200 MB sent as 1 MiB frames over TCP loopback spends its time, on this host.

The path of a large array from Windows to a worker in WSL2, or to another host, step by step: the client's
BLAKE3 of the array, the worker's check of its frames, the join of the frames (into fresh memory, and into the
worker's reused landing buffers), the float64 -> float32 cast (numpy's, and the client's on all cores), plain pyzmq between two processes over one, two
and four connections (malloc keeping frame-sized blocks, as the worker does), and the bridge's own echo of the
array through a scikit-learn worker on TCP (``last_timing``: to the worker, on it, back).

    python benchmarks/frames_probe.py        # prints the figures; about a minute
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import zmq

FRAME = 1 << 20


def timed(function, n=3):
    """Milliseconds of ``n`` calls, as text."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1e3)
    return " ".join(f"{t:.1f}" for t in times)


def receiver(streams):
    """The receiving process: answer each message (``streams`` of them, one per connection) with the time all
    of them had arrived."""
    router = zmq.Context(io_threads=streams).socket(zmq.ROUTER)
    print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    while True:
        message = router.recv_multipart(copy=False)
        if len(message) == 2 and bytes(message[1]) == b"hi":
            router.send_multipart([message[0], b"hi"])
            continue
        identities = [message[0]]
        while len(identities) < streams:
            identities.append(router.recv_multipart(copy=False)[0])
        arrived = str(time.monotonic()).encode()
        for identity in identities:
            router.send_multipart([identity, arrived])


def plain_zmq(frames, streams):
    """Milliseconds from the first send to the arrival of all frames, split over ``streams`` connections."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(512 << 20))
    process = subprocess.Popen([sys.executable, __file__, "receiver", str(streams)], stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        port = int(process.stdout.readline())
        context = zmq.Context(io_threads=streams)
        dealers = [context.socket(zmq.DEALER) for _ in range(streams)]
        for dealer in dealers:
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"hi")
            dealer.recv()
        share = len(frames) // streams
        times = []
        for _ in range(6):
            started = time.monotonic()
            for k, dealer in enumerate(dealers):
                dealer.send_multipart(frames[k * share:(k + 1) * share] if k < streams - 1 else frames[k * share:],
                                      copy=False)
            arrived = max(float(dealer.recv()) for dealer in dealers)
            times.append((arrived - started) * 1e3)
        context.destroy(linger=0)
        return times
    finally:
        process.kill()
        process.wait()


def main():
    import sklearn_gpu_bridge as sgb
    from sklearn_gpu_bridge.manage.launcher import LaunchedWorker
    from sklearn_gpu_bridge.protocol.arrays import _cast, _join
    from sklearn_gpu_bridge.protocol.session import buffer_digest, span_digest
    from sklearn_gpu_bridge.worker.landing import LandingBuffers

    print("cores", os.cpu_count())
    X = np.random.default_rng(0).standard_normal(50_000_000, dtype=np.float32)
    raw = memoryview(X).cast("B")
    frames = [raw[at:at + FRAME] for at in range(0, raw.nbytes, FRAME)]
    received = [bytes(frame) for frame in frames]
    print("blake3 200MB AUTO ms:", timed(lambda: buffer_digest(raw)))
    print("span digest 200x1MiB ms:", timed(lambda: span_digest(received)))
    landing = LandingBuffers()
    print("join fresh ms:", timed(lambda: _join([memoryview(b) for b in received], raw.nbytes)))
    print("join landing ms:", timed(lambda: _join([memoryview(b) for b in received], raw.nbytes, landing.take), 4))
    Y = np.random.default_rng(1).standard_normal((1_000_000, 50))
    print("cast f64->f32 1Mx50 ms:", timed(lambda: Y.astype(np.float32)))  # numpy's, in one thread
    print("cast f64->f32 1Mx50 on all cores ms:", timed(lambda: _cast(Y, np.dtype(np.float32), "C", "X")))
    for streams in (1, 2, 4):
        times = plain_zmq(frames, streams)
        print(f"raw zmq heap=True streams={streams}: " + " ".join(f"{t:.0f}" for t in times), flush=True)

    folder = tempfile.mkdtemp(prefix="sgb-frames-")
    worker = LaunchedWorker(folder, backend="sklearn", bind="127.0.0.1")
    try:
        sgb.set_config(connection_file=str(worker.connection_file), start_local_worker=False, pool="off",
                       array_cache="off")
        connection = sgb.get_connection()
        for _ in range(6):
            connection.echo(X.reshape(1_000_000, 50))
            there, on, back = connection.last_timing
            print(f"bridge echo 200MB: to worker {there * 1e3:.0f} ms, on worker {on * 1e3:.0f} ms, "
                  f"back {back * 1e3:.0f} ms", flush=True)
        print(connection.status()["landing"])
    finally:
        sgb.reset_connection()
        worker.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["receiver"]:
        receiver(int(sys.argv[2]))
    else:
        main()
