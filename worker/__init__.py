"""The worker process: a ZeroMQ server in front of cuML (or scikit-learn on CPU).

Worker side: it imports the shared core (protocol, pool, catalogue, errors);
nothing on the client side imports it at module level.
"""

from .backends import CumlBackend, SklearnBackend, make_backend
from .listener import check_settings
from .server import Worker

__all__ = ["CumlBackend", "SklearnBackend", "Worker", "check_settings", "make_backend"]
