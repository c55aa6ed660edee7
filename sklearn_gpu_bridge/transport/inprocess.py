"""cuML in this process: the wrappers' operations without the ZeroMQ hop.

Inside a process that has cuML and a GPU of its own (a dask-cuda worker: one
process per GPU, ``CUDA_VISIBLE_DEVICES`` set by dask-cuda), a second process
and a round trip per call buy nothing. :class:`InProcess` answers the same
operations as :class:`~sklearn_gpu_bridge.client.connection.Connection` with the worker's
own backend, run here: the same parameter checks and translation, the same
encoding of arguments and results (so the same dtypes, sparse handling and
types come back), and the same portable fitted state. Only the transport is
gone.

Which one a process uses is the ``execution`` setting (:func:`execution_mode`).
"""

import itertools
import os
import sys
import threading
from collections import Counter

from ..catalogue import is_cuml_alias
from ..config import get_setting
from ..errors import ConfigurationError
from ..protocol import PROTOCOL_VERSION, Capabilities, to_plain
from ..protocol.arrays import Decoder, Encoder

EXECUTION_MODES = ("auto", "worker", "in_process")


def _in_dask_worker():
    """The Dask worker this code runs in, or None (never imports distributed itself)."""
    worker_module = sys.modules.get("distributed.worker")
    if worker_module is None:
        return None
    try:
        return worker_module.get_worker()
    except ValueError:  # not in a task (client.run, say): a Dask worker process still has its running Worker
        running = (w for w in list(getattr(worker_module.Worker, "_instances", ()))
                   if getattr(getattr(w, "status", None), "name", None) == "running")
        return next(running, None)


def _cuml_importable():
    """Whether the real cuML can be imported here (this package's ``cuml`` alias is not cuML)."""
    module = sys.modules.get("cuml")
    if module is not None and not is_cuml_alias(module):
        return True
    from ..accel.cuml_alias import real_cuml_importable

    return real_cuml_importable()


def execution_mode():
    """Where this process's GPU* calls run: {"mode": "in_process" | "worker", "reason": ..., "gpu": ...}.

    ``execution="auto"`` (the default) runs cuML in this process when it is a Dask
    worker with cuML importable (dask-cuda gives each such worker its own GPU),
    and goes through a bridge worker everywhere else (a Windows client, a CPU
    Dask worker, a plain script). ``"worker"`` and ``"in_process"`` force it.
    Try ``client.run(sklearn_gpu_bridge.execution_mode)`` on a Dask cluster.
    """
    setting = get_setting("execution")
    if setting not in EXECUTION_MODES:
        raise ConfigurationError(f"execution={setting!r}: choose one of {EXECUTION_MODES}")
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0] or None
    if setting == "in_process":
        return {"mode": "in_process", "reason": "execution=in_process", "gpu": gpu}
    if setting == "worker":
        return {"mode": "worker", "reason": "execution=worker", "gpu": None}
    dask_worker = _in_dask_worker()
    if dask_worker is None:
        return {"mode": "worker", "reason": "not in a Dask worker", "gpu": None}
    if not _cuml_importable():
        return {"mode": "worker", "reason": f"Dask worker {dask_worker.address} has no cuML", "gpu": None}
    return {"mode": "in_process", "reason": f"Dask worker {dask_worker.address} with cuML", "gpu": gpu}


class InProcess:
    """The operations of a connection, answered by a cuML backend in this process."""

    pool = None
    process = None

    def __init__(self, backend="cuml"):
        from ..worker.backends import make_backend  # cuML is imported here, once per process

        self.backend, _ = make_backend(backend)  # "sklearn": the same path on the CPU, for tests
        self.backend.warm_up()
        self.pid = os.getpid()
        self.closed = False
        self.stats = Counter()
        self._handles = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        versions = {"sklearn-gpu-bridge": __import__("sklearn_gpu_bridge").__version__, **self.backend.versions()}
        self.capabilities = Capabilities(
            protocol_version=PROTOCOL_VERSION, worker_id=f"in-process-{self.pid}-{id(self):x}", backend=self.backend.name,
            fallback_reason=None, float_dtype=self.backend.float_dtype, pool=False, pool_challenge=None,
            max_frame_bytes=1 << 62, versions=versions, array_cache=0, client_timeout=None)

    # ------------------------------------------------------------ the hop, without the hop

    def _arguments(self, args, kwargs):
        """The arguments as the worker would decode them: the same casts and checks, read-only views.

        A backend that copies its input to the device is given views of the
        caller's arrays; another (the CPU one) gets copies, since its fitted
        model may keep what it was given.
        """
        from ..client.connection import features_as_sent

        encoder = Encoder()
        encoded = encoder.encode([features_as_sent(args, self.capabilities.float_dtype), kwargs])
        buffers = encoder.buffers if self.backend.device_resident else [bytes(b) for b in encoder.buffers]
        return Decoder({"arrays": encoder.arrays}, buffers).decode(encoded)

    @staticmethod
    def _result(result, estimator):
        """A result as the client would decode the worker's reply (plain values, numpy arrays)."""
        encoder = Encoder()
        try:
            encoded = to_plain(encoder.encode({"result": None if result is estimator else result}))
        except TypeError as exc:
            raise TypeError(f"a result of type {exc} cannot be sent to the client") from None
        return Decoder({"arrays": encoder.arrays}, encoder.buffers, writeable=True).decode(encoded)["result"]

    def _add(self, estimator, name):
        with self._lock:
            handle = f"h{next(self._ids)}"
            self._handles[handle] = (name, estimator)
        return handle

    def _get(self, handle):
        try:
            return self._handles[handle]
        except KeyError:
            raise KeyError(f"no fitted estimator {handle!r} in this process") from None

    # ------------------------------------------------------------ operations (as Connection's)

    def fit(self, estimator, params, method, args, kwargs, changed=(), params_from=None, finite=False):
        from ..client.connection import Fitted

        self.backend.check_fit(estimator, method)
        args, kwargs = self._arguments(args, kwargs)
        model, result, dropped = self.backend.fit(estimator, params, method, args, kwargs, list(changed), params_from,
                                                  finite=finite)
        return Fitted(self._add(model, estimator), self._result(result, model), dropped)

    def call(self, handle, method, args, kwargs, *, n_classes=0, finite=False):
        name, model = self._get(handle)
        self.backend.check_call(name, method)
        args, kwargs = self._arguments(args, kwargs)
        return self._result(self.backend.call(name, model, method, args, kwargs, finite=finite), model)

    def attribute(self, handle, name):
        _, model = self._get(handle)
        return self._result(self.backend.attribute(model, name), model)

    def get_state(self, handle):
        _, model = self._get(handle)
        portable, native = self.backend.export_state(model)
        return self.backend.name, portable, native

    def set_state(self, estimator, form, blob):
        return self._add(self.backend.import_state(estimator, form, bytes(blob)), estimator)

    def status(self):
        return {"backend": self.backend.name, "mode": "in_process", "versions": self.capabilities.versions,
                "handles": len(self._handles), "address": f"in process {self.pid}"}

    @property
    def last_timing(self):
        return None

    def schedule_release(self, handle):
        self._handles.pop(handle, None)

    def close(self):
        self.closed = True
        self._handles.clear()

    retire = close
