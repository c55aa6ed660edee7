"""The two checks the fifth session made shorter, each against what it replaced, in one process.

    python benchmarks/client_checks.py [--number 3000] [--out results/...json]

- On the client, the input check of a small call: scikit-learn's ``validate_data`` against the short way
  (``estimators.base._plain_validation``), for X alone (StandardScaler) and for X and labels
  (LogisticRegression), 5000 x 20 float32, as ``e2e.py``'s small cases send.
- On the worker, the opcode check of a request's signed header: ``pickletools.genops`` (the scan before)
  against ``session.check_plain_opcodes``, and the unpickling that follows either, for the header of a real
  ``fit`` request (caught as the client packs it) and for a 1.5 KB one with long strings and bytes.

Medians of 7 ``timeit`` rounds of ``--number`` calls each, in microseconds a call.
"""

import argparse
import json
import pickletools
import platform
import timeit

import numpy as np
from sklearn.utils.validation import FLOAT_DTYPES, validate_data

import sklearn_gpu_bridge
from sklearn_gpu_bridge.estimators.base import _NO_X, _plain_validation
from sklearn_gpu_bridge.protocol import session


def per_call_us(run, number):
    return float(np.median(timeit.repeat(run, number=number, repeat=7))) / number * 1e6


def genops_scan(data):
    """The scan before check_plain_opcodes."""
    for opcode, _, _ in pickletools.genops(data):
        if opcode.name not in session.PLAIN_OPCODES:
            raise ValueError(opcode.name)


def fit_header():
    """The header of a real fit request of GPUStandardScaler (the client's own pack, on the running worker)."""
    caught = []
    pack = session.Session.pack

    def catching(self, header, buffers=(), digests=None):
        frames = pack(self, header, buffers, digests)
        caught.append(frames[1])
        return frames

    session.Session.pack = catching
    try:
        sklearn_gpu_bridge.GPUStandardScaler().fit(np.ones((5000, 20), np.float32) + np.arange(20))
    finally:
        session.Session.pack = pack
    return next(h for h in caught if session.loads_header(h, check_opcodes=False)["op"] == "fit")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=3000)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5000, 20)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    validation = {}
    for name, estimator, labels in (("StandardScaler (X)", sklearn_gpu_bridge.GPUStandardScaler(), _NO_X),
                                    ("LogisticRegression (X, y)", sklearn_gpu_bridge.GPULogisticRegression(), y)):
        settings = {"accept_sparse": False, **estimator._validation}
        both = () if labels is _NO_X else (labels,)
        assert _plain_validation(estimator, X, labels, settings) is not None  # the short way takes it
        validation[name] = {
            "validate_data": per_call_us(lambda: validate_data(estimator, X, *both, **settings), args.number),
            "short way": per_call_us(lambda: _plain_validation(estimator, X, labels, settings), args.number),
        }
    headers = {"fit request": fit_header(),
               "1.5 KB, long strings and bytes": session.dumps_header(
                   {"op": "fit", "params": {"names": ["feature_%d" % i for i in range(60)], "blob": b"x" * 400},
                    "big": 2**200, "t": (1, 2, (3,)), "u": "\u00e9" * 150, "f": 1.5, "n": None})}
    header_check = {}
    for name, data in headers.items():
        header_check[name] = {
            "bytes": len(data),
            "genops scan": per_call_us(lambda d=data: genops_scan(d), args.number),
            "check_plain_opcodes": per_call_us(lambda d=data: session.check_plain_opcodes(d), args.number),
            "unpickling after the check": per_call_us(lambda d=data: session.loads_header(d, check_opcodes=False),
                                                      args.number),
        }
    result = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "microseconds a call": {"input check": validation, "header check": header_check}}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
