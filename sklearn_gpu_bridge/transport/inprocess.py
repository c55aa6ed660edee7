"""cuML in this process: the worker's own operation table, called without the ZeroMQ hop.

Inside a process that has cuML and a GPU of its own (a dask-cuda worker: one process per GPU,
``CUDA_VISIBLE_DEVICES`` set by dask-cuda), a second process and a round trip per call buy nothing.
:class:`InProcessTransport` hands each request to the worker's
:class:`~sklearn_gpu_bridge.worker.dispatch.Operations`, run here: the same parameter checks and
translation, the same encoding of arguments and results (so the same dtypes, sparse handling and
types come back), and the same portable fitted state. Only the hop is gone.

This is the one place the client side imports the worker, and only when a process asks for it
(``execution`` setting, :func:`sklearn_gpu_bridge.client.discovery.execution_mode`).
"""

import os

import cloudpickle

from ..protocol import PROTOCOL_VERSION, Capabilities, to_plain
from ..protocol.arrays import Decoder, Encoder
from ..version import __version__
from .base import Transport


class _LocalRequest:
    """A request as the worker's operations read it (``worker.dispatch.Request``), from Python values.

    The arguments go through the wire's encoding and back, so the operations see what a worker
    would decode: the same casts and checks, read-only views. A backend that copies its input to
    the device is given views of the caller's arrays; another (the CPU one) gets copies, since its
    fitted model may keep what it was given.
    """

    def __init__(self, header, payload, blobs, copy):
        self.header, self._payload, self._blobs, self._copy = header, payload, blobs or {}, copy

    def arguments(self):
        payload = self._payload or {}
        encoder = Encoder()
        encoded = encoder.encode([payload.get("args", []), payload.get("kwargs", {})])
        buffers = [bytes(b) for b in encoder.buffers] if self._copy else encoder.buffers
        args, kwargs = Decoder({"arrays": encoder.arrays}, buffers).decode(encoded)
        return args, kwargs

    def params(self):
        if "params" in self._blobs:
            return cloudpickle.loads(self._blobs["params"])
        return self.header.get("params", {})

    def blob(self, name):
        return bytes(self._blobs[name])


def _as_received(values):
    """Values as a client decodes them from a worker's reply (plain values, writeable numpy arrays)."""
    encoder = Encoder()
    try:
        encoded = to_plain(encoder.encode(values))
    except TypeError as exc:
        raise TypeError(f"a result of type {exc} cannot be sent to the client") from None
    return Decoder({"arrays": encoder.arrays}, encoder.buffers, writeable=True).decode(encoded)


class InProcessTransport(Transport):
    """Requests answered by a worker backend in this process (``backend="sklearn"``: the CPU one, for tests)."""

    def __init__(self, backend="cuml"):
        super().__init__()
        # the one edge from the client side to the worker's: cuML is imported here, once per process
        from ..worker.backends import make_backend
        from ..worker.dispatch import Operations
        from ..worker.handles import HandleTable

        self.backend, _ = make_backend(backend)
        self.backend.warm_up()
        self.operations = Operations(self.backend, HandleTable())
        self.pid = os.getpid()
        self.client_id = f"in-process-{self.pid}-{id(self):x}"
        self.versions = {"sklearn-gpu-bridge": __version__, **self.backend.versions()}
        self.capabilities = Capabilities(
            protocol_version=PROTOCOL_VERSION, worker_id=self.client_id, backend=self.backend.name,
            fallback_reason=None, float_dtype=self.backend.float_dtype, pool=False, pool_challenge=None,
            max_frame_bytes=1 << 62, versions=self.versions, array_cache=0, client_timeout=None)

    def _run(self, header, payload=None, blobs=None):
        header = {**header, "client": self.client_id}
        request = _LocalRequest(header, payload, blobs, copy=not self.backend.device_resident)
        return self.operations.run(request)

    def request(self, header, payload=None, *, blobs=None, out_nbytes=0):
        answer = self._run(header, payload, blobs)
        value = _as_received(answer.values) if answer.values is not None else None
        return answer.fields, value, answer.blobs

    def roundtrip(self, header, *, timeout=None):
        if header["op"] == "status":
            return {"backend": self.backend.name, "mode": "in_process", "versions": self.versions,
                    "handles": len(self.operations.handles), "address": f"in process {self.pid}"}, []
        answer = self._run(header)
        return answer.fields, answer.blobs

    def ping(self, timeout=2.0):
        return not self.closed

    def schedule_release(self, handle):
        self.operations.handles.release([handle], self.client_id)

    def close(self):
        self.closed = True
        self.operations.handles.release_client(self.client_id)
