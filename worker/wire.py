"""A work request as the worker reads it from the wire, and its answer as the reply carries it.

:class:`FramesRequest` is the :class:`.dispatch.Request` of a message: its
values are decoded from the message's frames, from the client's pool (views
of a memfd, copies of a file) and from the arrays the worker keeps for that
client (:mod:`.cache`), only when an operation asks. :meth:`FramesRequest.reply`
encodes an :class:`.dispatch.Answer`, its arrays into the pool block the
request gave for them (else as frames). A request holds the pool it uses
until :meth:`FramesRequest.let_go`, which first waits for the device where a
copy read pinned memory. :func:`input_bytes` reads a request's size: what
its header declares (the note on a MemoryError), or what it really carries
(admission by device memory).
"""

import logging
import math

import cloudpickle
import numpy as np

from sklearn_gpu_bridge.errors import ProtocolError
from sklearn_gpu_bridge.protocol import Decoder, Encoder
from sklearn_gpu_bridge.protocol.session import frame_buffer

from .dispatch import Request

log = logging.getLogger("sklearn_gpu_bridge.worker")

ALIGN = 64  # each array of a reply starts at a multiple of this in its output block


class FramesRequest(Request):
    """A work request read from a message: ``header`` and its ``buffers`` (frames), decoded lazily.

    ``clients`` (:class:`.clients.Clients`) finds the pool the request names;
    ``backend`` says whether inputs are copied to the device; ``pinning``,
    ``array_cache`` and ``landing`` (:class:`.landing.LandingBuffers`) are the
    worker's (None: none). ``kept`` lists the keys of
    the arrays this request asked the worker to keep, and it kept.
    """

    def __init__(self, header, buffers, *, clients, backend, pinning=None, array_cache=None, landing=None):
        self.header, self.buffers, self.landing = header, buffers, landing
        self.clients, self.backend, self.pinning, self.array_cache = clients, backend, pinning, array_cache
        self.kept = []
        self._pools = []  # attachments held until let_go
        self._read_pinned = False  # a read came from pinned memory: let_go waits for the device
        self._decoded_by = None

    # ------------------------------------------------------------ reading

    def _pool(self):
        """The pool the request names (None: none); where pools are pinned, held until :meth:`let_go`."""
        attachment = self.clients.attachment(self.header["client"], self.header.get("pool"))
        if attachment is not None and self.pinning is not None and attachment not in self._pools:
            attachment.hold()
            self._pools.append(attachment)
        return attachment

    def _decoder(self):
        """The request's one Decoder, made when the first value is asked for."""
        if self._decoded_by is None:
            self._decoded_by = self._new_decoder()
        return self._decoded_by

    def _new_decoder(self):
        header = self.header
        attachment = self._pool()
        read_pool = None
        if attachment is not None:
            retains = header["op"] == "fit" or header.get("method") == "partial_fit"
            if not (self.backend.device_resident or not retains or attachment.kind == "file"):
                # a fitted CPU estimator may keep a view of its input: never of a block the client reuses
                read_pool = lambda s, o, n: bytearray(attachment.read(s, o, n))  # noqa: E731
            elif self.pinning is None:
                read_pool = attachment.read  # a view of a memfd; files are read as copies
            else:
                def read_pool(segment, offset, nbytes):
                    view = attachment.read(segment, offset, nbytes)
                    if attachment.is_pinned(segment):
                        self._read_pinned = True
                    return view
        cache = None
        if self.array_cache is not None:
            cache = self.array_cache.for_client(header["client"], self.kept)
        landing = None
        if self.landing is not None:
            def landing(nbytes):
                view = self.landing.take(nbytes)
                if self.landing.is_pinned(view):
                    self._read_pinned = True
                return view
        return Decoder(header, self.buffers, read_pool=read_pool, cache=cache, landing=landing)

    def arguments(self):
        payload = self._decoder().decode(self.header.get("payload") or {})
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ProtocolError("payload must hold a list 'args' and a dict 'kwargs'")
        return args, kwargs

    def params(self):
        params = self.header.get("params", {})
        if isinstance(params, dict) and "__blob__" in params:
            params = cloudpickle.loads(self._decoder().decode(params))
        if not isinstance(params, dict):
            raise ProtocolError("'params' must be a dict")
        return params

    def blob(self, name):
        return bytes(self._decoder().decode(self.header.get(name)))

    # ------------------------------------------------------------ answering

    def reply(self, answer):
        """(reply fields, reply buffers) of an :class:`.dispatch.Answer`."""
        if answer.values is None:
            return answer.fields, list(answer.blobs)
        encoder, output = self._encoder()
        # a value that is not plain fails when the reply is packed, and the client gets that error instead
        payload = encoder.encode(answer.values)
        if output is not None:
            output.commit(output.used)
        return {"payload": payload, "arrays": encoder.arrays, **answer.fields}, [*encoder.buffers, *answer.blobs]

    def _encoder(self):
        """(encoder, output): results go into the output block the client gave, else as frames."""
        out = self.header.get("out")
        attachment = self._pool()
        if not out or attachment is None:
            return Encoder(host_buffer=None if self.landing is None else self.landing.take), None
        segment, start, size = out.get("segment"), out.get("offset"), out.get("nbytes")
        output = attachment.output(segment, start, size)  # validates the range once
        block, used = output.memory, 0

        def place(nbytes):
            nonlocal used
            if used + nbytes > size:
                return None
            offset = used
            used = -(-(used + nbytes) // ALIGN) * ALIGN
            output.used = used
            return segment, start + offset, block[offset : offset + nbytes]

        output.used = 0
        return Encoder(place), output

    def let_go(self):
        """Before the reply: wait for the device where a copy came from pinned memory (it runs in the
        background, and the client reuses the block once answered); then let the request's pools go."""
        pools, self._pools = self._pools, []
        try:
            if self._read_pinned:
                self._read_pinned = False
                self.backend.settle()
        finally:
            for attachment in pools:
                attachment.let_go()


def input_bytes(header, buffers=None, pool_segment=None, cached=None):
    """The bytes of the arrays a request carries: as its header describes them, or, with ``buffers`` (the
    message's frames), each at most what the message really carries for it, so that a size a request only
    declares never holds device memory others wait for (admission).

    What is carried: an inline array's bytes; a frame array's frames (each frame counted once); a pool array's
    range, where it lies within its segment (``pool_segment(segment)``: the segment's size, 0 where there is none;
    each segment counted at most once in all); a cached array's bytes (``cached(key)``, 0 where none is kept).
    """
    arrays = header.get("arrays") if isinstance(header.get("arrays"), list) else []
    sent = 0
    frames_counted, pool_sizes, pool_used = set(), {}, 0
    for desc in arrays:
        try:
            declared = max(0, math.prod(desc["shape"]) * np.dtype(desc["dtype"]).itemsize)
        except Exception:  # noqa: BLE001 - a malformed one is refused later, by the decoder
            continue
        if buffers is None:
            sent += declared
            continue
        where = desc.get("where")
        if where == "inline":
            carried = len(desc["data"]) if isinstance(desc.get("data"), bytes) else 0
        elif where == "frame":
            index = desc.get("index")
            carried = 0
            for i in index if isinstance(index, list) else [index]:
                if type(i) is int and 0 <= i < len(buffers) and i not in frames_counted:
                    frames_counted.add(i)
                    carried += frame_buffer(buffers[i]).nbytes
        elif where == "pool" and pool_segment is not None:
            segment, offset = desc.get("segment"), desc.get("offset")
            if type(segment) is int and type(offset) is int and segment not in pool_sizes:
                pool_sizes[segment] = pool_segment(segment)
            size = pool_sizes.get(segment, 0)
            carried = declared if type(offset) is int and 0 <= offset and offset + declared <= size else 0
            carried = min(carried, sum(pool_sizes.values()) - pool_used)
            pool_used += carried
        elif where == "cached" and cached is not None:
            carried = cached(desc.get("key")) or 0
        else:
            carried = 0
        sent += min(declared, carried)
    return sent


def size_text(nbytes):
    """``nbytes`` for a person: "512 bytes", "1.5 MiB"."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


def memory_note(header, backend):
    """What a MemoryError needs to be understood: the request's size and the device's memory."""
    what = ".".join(str(header[k]) for k in ("estimator", "method") if header.get(k))
    note = f" [worker: {header.get('op')} {what} on {size_text(input_bytes(header))} of input"
    if backend.device_resident:
        try:
            import cupy

            free, total = cupy.cuda.Device().mem_info
            note += f"; GPU memory: {size_text(free)} free of {size_text(total)}"
        except Exception:  # noqa: BLE001 - informative only
            log.debug("could not read the GPU's memory", exc_info=True)
    return note + "; the worker carries on]"
