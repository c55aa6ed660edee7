"""The input check the fifth session made shorter, against what it replaced, in one process.

    python benchmarks/client_checks.py [--number 3000] [--out results/...json]

- On the client, the input check of a small call: scikit-learn's ``validate_data`` against the short way
  (``estimators.base._plain_validation``), for X alone (StandardScaler) and for X and labels
  (LogisticRegression), 5000 x 20 float32, as ``e2e.py``'s small cases send.

It also timed the worker's opcode scan of a pickled header (``results/cpu-1125e/client-checks.json``); since
protocol 3 headers are msgpack, without a scan, and ``header_codec.py`` times them.

Medians of 7 ``timeit`` rounds of ``--number`` calls each, in microseconds a call.
"""

import argparse
import json
import platform
import timeit

import numpy as np
from sklearn.utils.validation import validate_data

import sklearn_gpu_bridge
from sklearn_gpu_bridge.estimators.base import _NO_X, _plain_validation


def per_call_us(run, number):
    return float(np.median(timeit.repeat(run, number=number, repeat=7))) / number * 1e6


def report(result, out=None):
    """Print ``result`` with this machine and Python named in it, as JSON, and write it to ``out`` if given."""
    result = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(), **result}
    print(json.dumps(result, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


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
    report({"microseconds a call": {"input check": validation}}, args.out)


if __name__ == "__main__":
    main()
