"""What a message's header costs to write and to read, on whichever tree is imported (before and after a
change of the header format: run it once with each on the path).

    python benchmarks/header_codec.py [--number 3000] [--out results/...json]
    PYTHONPATH=/tmp/before-site python benchmarks/header_codec.py ...   # an older tree, installed there

The headers are those of real calls (a ``fit`` and a ``predict`` of GPULogisticRegression, 5000 x 20, and
their replies), caught as the client and the worker's code pack them, plus a 1.5 KB one with long strings
and bytes. For each: writing it (``dumps_header``); reading it as the worker reads a request and as a client
reads a reply (``loads_header``: protocol 2 scanned a request's pickle opcodes first, not a reply's); and a
whole signed round of ``Session.pack`` then the worker's ``Session.unpack`` (signature, header, time, replay
memory). Medians of 7 ``timeit`` rounds of ``--number`` calls each, in microseconds a call.
"""

import argparse
import copy
import inspect
import os

import numpy as np

import sklearn_gpu_bridge
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, session

from client_checks import per_call_us, report


def real_headers():
    """{name: header dict} of a fit and a predict request and their replies, as packed in a real call (the
    worker is the local one, in its own process: its replies are caught as the client reads them)."""
    caught, pack, unpack = {}, session.Session.pack, session.Session.unpack

    def catching_pack(self, header, buffers=(), digests=None):
        if header.get("op") in ("fit", "call"):
            caught[header["op"] + " request"] = copy.deepcopy(header)
        return pack(self, header, buffers, digests)

    def catching_unpack(self, frames, *args, **kwargs):
        header, buffers = unpack(self, frames, *args, **kwargs)
        payload = header.get("payload")
        if header.get("op") == "reply" and isinstance(payload, dict):  # a fit's result carries its handle
            caught["fit reply" if "handle" in payload else "call reply"] = copy.deepcopy(header)
        return header, buffers

    session.Session.pack, session.Session.unpack = catching_pack, catching_unpack
    try:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((5000, 20)).astype(np.float32)
        sklearn_gpu_bridge.GPULogisticRegression().fit(X, (X[:, 0] > 0).astype(np.int64)).predict(X)
    finally:
        session.Session.pack, session.Session.unpack = pack, unpack
    return caught


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=3000)
    parser.add_argument("--out")
    args = parser.parse_args()
    headers = real_headers()
    headers["1.5 KB, long strings and bytes"] = {
        "op": "fit", "id": session.new_id(), "params": {"names": ["feature_%d" % i for i in range(60)],
                                                        "blob": b"x" * 400},
        "t": (1, 2, (3,)), "u": "\u00e9" * 150, "f": 1.5, "n": None}
    scans = "check_opcodes" in inspect.signature(session.loads_header).parameters  # protocol 2: pickles
    key, worker_id = os.urandom(32), session.new_id()
    client, worker = session.Session(key, peer=worker_id), session.Session(key, me=worker_id)
    rows = {}
    for name, header in headers.items():
        data = session.dumps_header(header)
        reply = "reply" in name
        read = (lambda d=data, r=reply: session.loads_header(d, check_opcodes=not r)) if scans else \
            (lambda d=data: session.loads_header(d))

        def signed_round(h=header):
            worker.unpack(client.pack({**h, "id": session.new_id()}))

        rows[name] = {"bytes": len(data), "write": per_call_us(lambda h=header: session.dumps_header(h), args.number),
                      "read": per_call_us(read, args.number)}
        if not reply:
            rows[name]["pack, then the worker's unpack"] = per_call_us(signed_round, args.number)
    report({"protocol": PROTOCOL_VERSION, "tree": os.path.dirname(session.__file__), "microseconds a call": rows},
           args.out)


if __name__ == "__main__":
    main()
