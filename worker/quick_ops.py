"""The quick operations: answered by the worker's reading thread itself, header in, reply fields out.

hello, attach, ping, status, release, goodbye and shutdown need no executor thread and touch no
estimator; :class:`QuickOps` is the part of :class:`~.server.Worker` that answers them, and
:attr:`QuickOps.QUICK` their one table (the work operations are :data:`.dispatch.WORK`).
"""

import gc
import os
import time

from sklearn_gpu_bridge.errors import ProtocolError, VersionMismatch
from sklearn_gpu_bridge.protocol import PROTOCOL_VERSION, Capabilities


def rss_bytes():
    """This process's resident memory (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def check_version(header):
    """VersionMismatch unless a hello speaks this worker's protocol."""
    version = header.get("protocol_version")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(f"client speaks protocol {version}, this worker speaks {PROTOCOL_VERSION}: "
                              "install the same sklearn-gpu-bridge version on both sides")


def page_faults():
    """This process's page faults so far, [minor, major] (POSIX), or None. A benchmark reads their growth over a
    case: a first touch of memory mapped anew costs a fault per page."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return [usage.ru_minflt, usage.ru_majflt]


class QuickOps:
    """Uses the worker's ``clients``, ``queue``, ``devices``, ``backend``, ``handles``, ``session`` and the rest it
    reports."""

    def _hello(self, header):
        check_version(header)
        pool, client = header.get("pool"), header.get("client")
        slot = None
        if isinstance(pool, dict) and client is not None:
            slot = self.clients.challenge(client, pool, header.get("pid"))
        capabilities = Capabilities(
            protocol_version=PROTOCOL_VERSION, worker_id=self.worker_id, backend=self.backend.name,
            fallback_reason=self.fallback_reason, float_dtype=self.backend.float_dtype, pool=False,
            pool_challenge=slot, max_frame_bytes=self.max_frame_bytes, versions=self.versions,
            array_cache=self.array_cache.max_bytes if self.array_cache is not None else 0,
            client_timeout=self._client_timeout(watched=False),
        )
        return capabilities.to_reply()

    def _client_timeout(self, watched):
        return None if watched or not self.clients.client_timeout else self.clients.client_timeout

    def _attach(self, header):
        attached, watched = self.clients.attach(header.get("client"), header.get("nonce"))
        doorbell = str(self.doorbell[0]) if attached and self.doorbell is not None else None
        return {"pool": attached, "client_timeout": self._client_timeout(watched), "doorbell": doorbell}

    def _ping(self, header):
        return {"busy": self.queue.waiting()}

    def _status(self, header):
        cache = self.array_cache
        return {
            "backend": self.backend.name, "pid": os.getpid(), "address": self.address,
            "uptime": time.time() - self.started, "handles": len(self.handles),
            "pools": len(self.clients.pools), "clients": len(self.clients), "requests": dict(self.counts),
            "refused": self._refusals(),
            "swept": dict(self.clients.swept), "rss": rss_bytes(), "page_faults": page_faults(),
            "queued": self.queue.waiting(),
            "threads": self.queue.threads, "running": self.queue.running, "peak_running": self.queue.peak,
            "watch_ms": self.watch_ms, "idle_exit": self.idle_exit, "collections": [g["collections"] for g in gc.get_stats()],
            "device_budget": self.queue.budget, "device_in_use": self.queue.in_use, "gpus": self._gpus(),
            "pinned": self.pinning.status() if self.pinning is not None else None,
            "landing": self.landing.status(),
            "labels_on_host": self.backend.host_labels.taken if self.backend.host_labels is not None else None,
            "versions": self.versions,
            "array_cache": {"entries": len(cache) if cache else 0, "bytes": cache.nbytes if cache else 0,
                            "max_bytes": cache.max_bytes if cache else 0},
        }

    def _gpus(self):
        """Each device's work and memory: requests run, running, waiting for it; its budget, the costs admitted
        (now, at most), the memory in use on it (any process's; None where unknown); the models it holds."""
        held = self.handles.per_device()
        driven = self.devices.driven
        return [device.status(held[device.index if driven else None],
                              self._memory_used(device.index if driven else None)) for device in self.devices]

    def _memory_used(self, index):
        try:
            return self.backend.device_memory_used(index)
        except Exception:  # noqa: BLE001 - informative only
            return None

    def _adopt(self, header):
        """Attach the pool a client proved its own to the front this process serves behind (:mod:`.front`)."""
        if self.front is None:
            raise ProtocolError("adopt: this worker serves behind no front")
        return {"pool": self.clients.adopt(header.get("client"), header.get("pool"), header.get("pid"))}

    def _release(self, header):
        return {}  # the handles were released by _handle

    def _goodbye(self, header):
        client = header.get("client")
        state = self.clients.get(client)
        released = self.clients.free(client, state, "goodbye", "said goodbye") if state is not None else 0
        return {"released": released}

    def _shutdown(self, header):
        self._stopping.set()
        return {}

    #: op name -> quick op, answered by the reading thread itself; the work ops are :data:`.dispatch.WORK`
    QUICK = {"hello": _hello, "attach": _attach, "ping": _ping, "status": _status, "release": _release,
             "goodbye": _goodbye, "shutdown": _shutdown, "adopt": _adopt}
