"""What writing a message into a pool slot and reading it back costs (``protocol.reply_slot``), per message.

    python benchmarks/slot_codec.py [--number 2000] [--out results/cpu-HOST/slot-codec.json]

Every small call on a host with a memfd pool goes through the slot layout
four times: the client writes its request into its request slot, the worker
reads it, writes the reply into the reply slot, and the client reads that.
Here a fit's request and its reply, packed and signed as the client and the
worker pack them, are written into a block of 1 MiB and read back: back to
back (medians of 7 rounds of ``--number``) and after a ``gc.collect()`` over
300,000 small objects (medians of ``--number // 10``), as ``e2e.py``'s table
times its calls. Run it once per tree (``PYTHONPATH=<the other tree's
site>``) to compare two.
"""

import argparse
import gc
import time
import timeit

import numpy as np

import sklearn_gpu_bridge
from client_checks import report
from sklearn_gpu_bridge.protocol import reply_slot
from sklearn_gpu_bridge.protocol.session import Session, new_id


def messages():
    """(name, frames): a fit request of StandardScaler on 5000 x 20 in the pool, and its reply."""
    session = Session(b"k" * 32, peer=new_id())
    pool_array = {"dtype": "<f4", "shape": [5000, 20], "order": "C", "where": "pool", "segment": 7,
                  "offset": 1 << 20}
    request = {"op": "fit", "estimator": "StandardScaler", "method": "fit_transform", "changed": [],
               "finite": True, "params": {"copy": True, "with_mean": True, "with_std": True},
               "id": new_id(), "client": new_id(), "pool": "sklearn-gpu-bridge-1234-0123456789abcdef",
               "reply_slot": {"segment": 7, "offset": 0, "nbytes": 1 << 20, "token": reply_slot.new_token()},
               "next_slot": {"segment": 7, "offset": 3 << 20, "nbytes": 1 << 20, "token": reply_slot.new_token()},
               "payload": {"args": [{"__array__": 0}], "kwargs": {}}, "arrays": [pool_array],
               "out": {"segment": 7, "offset": 2 << 20, "nbytes": 800_000}}
    reply = {"op": "reply", "id": new_id(), "parent": request["id"], "handle": new_id(),
             "payload": {"result": {"__array__": 0}, "handle": new_id(), "dropped": []},
             "arrays": [{**pool_array, "offset": 2 << 20}], "worker_span": [1234.5, 1234.6]}
    return [("request", session.pack(request)), ("reply", session.pack(reply))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--out")
    args = parser.parse_args()
    memory = memoryview(bytearray(1 << 20))
    heap = [{"n": i} for i in range(300_000)]  # noqa: F841 - kept alive: what a collection walks
    result = {"bridge": sklearn_gpu_bridge.__file__, "microseconds a message": {}}
    for name, frames in messages():
        token = reply_slot.new_token()

        def write_and_read():
            reply_slot.write(memory, token, frames)
            return reply_slot.read(memory)

        assert write_and_read() == [bytes(frames[0]), bytes(frames[1])]
        warm = float(np.median(timeit.repeat(write_and_read, number=args.number, repeat=7))) / args.number
        cold = []
        for _ in range(max(10, args.number // 10)):
            gc.collect()
            start = time.perf_counter()
            write_and_read()
            cold.append(time.perf_counter() - start)
        result["microseconds a message"][name] = {
            "bytes": sum(len(frame) for frame in frames), "back to back": warm * 1e6,
            "after gc.collect()": float(np.median(cold)) * 1e6}
    report(result, args.out)


if __name__ == "__main__":
    main()
