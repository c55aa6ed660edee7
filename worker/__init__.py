"""The worker process: a ZeroMQ server in front of cuML (or scikit-learn on CPU)."""

from .backends import CLASSES, CumlBackend, SklearnBackend, make_backend
from .server import Worker

__all__ = ["CLASSES", "CumlBackend", "SklearnBackend", "Worker", "make_backend"]
