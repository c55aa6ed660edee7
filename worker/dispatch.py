"""The work operations (fit, call, attribute, echo, get_state, set_state), written once on decoded values.

An operation reads a :class:`Request` and returns an :class:`Answer`; it never
sees frames, pools or sockets. The worker's loop runs them on requests read
from the wire (:class:`.wire.FramesRequest`), the in-process path on requests
it builds itself, both through :meth:`Operations.run` and its one table
(:data:`WORK`). Fitted models live in a :class:`.handles.HandleTable`, each
owned by the request's ``header["client"]``.
"""

from dataclasses import dataclass, field

from sklearn_gpu_bridge.errors import ProtocolError


class Request:
    """What an operation reads: the request's header, and its values decoded only when asked.

    ``header`` holds the request's fields (op, client, estimator, method,
    handle, name, changed, params_from, finite, form ...). An operation asks
    for :meth:`arguments` only once it has checked the method it runs, so a
    refused call costs no decoding. ``device``: the GPU the request runs on,
    current on its thread (the worker sets it where it drives several); the
    models it makes are kept as that GPU's. None: the process's current device.
    """

    header: dict
    device: int | None = None

    def arguments(self) -> tuple[list, dict]:
        """(args, kwargs) of the payload, decoded."""
        raise NotImplementedError

    def params(self) -> dict:
        """The estimator parameters of a fit (a plain dict, or the cloudpickled blob, loaded)."""
        raise NotImplementedError

    def blob(self, name: str) -> bytes:
        """The blob the header's field ``name`` marks (set_state's ``"state"``)."""
        raise NotImplementedError


@dataclass
class Answer:
    """What an operation answers.

    ``values`` go into the reply's ``payload`` (arrays encoded as the
    transport encodes them); None: the reply has no payload. ``fields`` are
    top-level fields of the reply; ``blobs`` raw reply buffers, after any
    buffers of ``values``.
    """

    values: dict | None = None
    fields: dict = field(default_factory=dict)
    blobs: list = field(default_factory=list)


class Operations:
    """The work operations of one backend over one table of handles."""

    def __init__(self, backend, handles):
        self.backend = backend
        self.handles = handles

    def run(self, request: Request) -> Answer:
        """Run the operation ``request.header["op"]`` names; ProtocolError for one not in :data:`WORK`."""
        operation = self.TABLE.get(request.header["op"])
        if operation is None:
            raise ProtocolError(f"unknown operation {request.header['op']!r}")
        return operation(self, request)

    def fit(self, request):
        """Build the estimator, run its fitting method, keep it under a new handle."""
        header = request.header
        name, method = header.get("estimator"), header.get("method", "fit")
        self.backend.check_fit(name, method)
        changed = header.get("changed", [])
        if not isinstance(changed, list):
            raise ProtocolError("'changed' must be a list of parameter names")
        args, kwargs = request.arguments()
        estimator, result, dropped = self.backend.fit(name, request.params(), method, args, kwargs, changed,
                                                      header.get("params_from"), finite=header.get("finite") is True)
        handle = self.handles.add(estimator, name, header["client"], _device_of(request))
        return Answer({"result": _unless(result, estimator), "handle": handle, "dropped": dropped})

    def call(self, request):
        """A method the catalogue lists, on one of the client's fitted estimators."""
        header = request.header
        entry = self.handles.get(header.get("handle"), header["client"])
        method = header.get("method")
        self.backend.check_call(entry.name, method)  # refused before anything is decoded
        args, kwargs = request.arguments()
        result = self.backend.call(entry.name, entry.estimator, method, args, kwargs,
                                   finite=header.get("finite") is True)
        return Answer({"result": _unless(result, entry.estimator)})

    def attribute(self, request):
        """A public fitted attribute of one of the client's estimators."""
        entry = self.handles.get(request.header.get("handle"), request.header["client"])
        return Answer({"result": _unless(self.backend.attribute(entry.estimator, request.header.get("name")),
                                         entry.estimator)})

    def echo(self, request):
        """The payload's arguments, sent straight back: measures and tests the transport alone."""
        args, _ = request.arguments()
        return Answer({"result": args})

    def get_state(self, request):
        """The fitted state of one of the client's estimators: its portable and/or native blob."""
        entry = self.handles.get(request.header.get("handle"), request.header["client"])
        portable, native = self.backend.export_state(entry.estimator)
        fields = {"backend": self.backend.name, "portable": portable is not None, "native": native is not None}
        return Answer(fields=fields, blobs=[blob for blob in (portable, native) if blob is not None])

    def set_state(self, request):
        """A fitted estimator from a state blob, kept under a new handle."""
        header = request.header
        name, form = header.get("estimator"), header.get("form")
        self.backend.estimator_class(name)  # refuse unknown names and forms before touching the blob
        if form not in ("portable", "native"):
            raise ValueError(f"unknown state form {form!r}")
        estimator = self.backend.import_state(name, form, bytes(request.blob("state")))
        return Answer(fields={"handle": self.handles.add(estimator, name, header["client"], _device_of(request))})

    #: op name -> operation: the work the worker answers
    TABLE = {"fit": fit, "call": call, "attribute": attribute, "echo": echo, "get_state": get_state,
             "set_state": set_state}


WORK = Operations.TABLE


def _device_of(request):
    """The request's device; None also for a request that is a Request by its methods alone (in process)."""
    return getattr(request, "device", None)


def _unless(result, estimator):
    """A method's result, or None where it returned the estimator itself (``fit``): the client has that."""
    return None if result is estimator else result
