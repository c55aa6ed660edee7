"""Page-locking clients' pool segments, so that the GPU copies them by DMA.

cuML copies a numpy input to the device, and a result back, through the
driver's staging buffers when the host memory is pageable; from memory that
is registered with the driver (``cudaHostRegister``) it is one DMA. On an
H100 host a 200 MB copy takes 22 ms to the device and 14 ms back from
pageable memory, 3.7 ms either way from registered memory; registering costs
about 0.04 ms per MiB already written and 0.5 ms per MiB not yet touched. A
pool segment is reused request after request, so the worker registers it once,
the first time a request moves at least ``PIN_MIN_BYTES`` through it
(:class:`sklearn_gpu_bridge.shm.PoolAttachment`), and unregisters it when
its client's pool is detached.

Registering holds the driver's lock (other threads' GPU work waits), and
locked memory cannot be swapped: a budget bounds the bytes held locked for
all clients together (an eighth of the memory this process may use: the
host's, or its cgroup's limit), and one pool may hold half of it, so a
client that describes a huge pool cannot make the worker lock the host's
memory, nor keep all of the budget from the others. Past it, segments stay
pageable; the answers are the same, only the copies slower.

The worker's landing buffers (:mod:`.landing`, where arrays sent as frames
are joined) are registered the same way, as one more pool under the budget.

Copies from registered memory are asynchronous: the worker waits for the
device (``settle``) before it answers a request that read a pinned range,
since the client reuses the block (and the worker its landing buffer) as
soon as the answer comes.
"""

import logging
import os
import threading
from collections import Counter

log = logging.getLogger(__name__)

#: at most this share of the memory the worker may use is held locked for pools, all clients together
BUDGET_SHARE = 1 / 8
CGROUP_LIMIT = "/sys/fs/cgroup/memory.max"  # cgroup v2: "max" or bytes


def to_device(array):
    """A C- or F-contiguous host array copied to the device in one copy, a DMA where it lies in a registered
    segment. The copy is synchronous: the block it came from may be reused once this returns."""
    import cupy

    device = cupy.empty(array.shape, array.dtype, order="C" if array.flags.c_contiguous else "F")
    device.data.copy_from_host(array.ctypes.data, array.nbytes)
    return device


def host_memory_bytes():
    """The host's memory, or less where this process's cgroup is limited to less."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    try:
        with open(CGROUP_LIMIT) as f:
            limit = f.read().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


class HostPinning:
    """Registers address ranges with ``register(address, nbytes)`` within ``budget`` bytes in all.

    ``register`` and ``unregister(address)`` are the driver's (the backend
    gives them); a refusal (WSL2 limits, an old driver) is said once in the
    log and leaves the range pageable.
    """

    def __init__(self, register, unregister, budget=None):
        self._register, self._unregister = register, unregister
        self.budget = int(host_memory_bytes() * BUDGET_SHARE) if budget is None else int(budget)
        self.per_pool = self.budget // 2  # what one client's pool may hold of it
        self.pinned = 0  # bytes registered now (or being registered)
        self._by_pool = Counter()  # the same, per pool
        self.refused = 0  # ranges left pageable: over the budget, or the driver said no
        self._lock = threading.Lock()
        self._warned = False

    def pin(self, address, nbytes, pool):
        """Register ``[address, address + nbytes)`` of ``pool`` (any hashable name); whether it was."""
        with self._lock:
            if self.pinned + nbytes > self.budget or self._by_pool[pool] + nbytes > self.per_pool:
                self.refused += 1
                return False
            self._count(pool, nbytes)  # counted while registering: two at once never pass a limit together
        try:
            self._register(address, nbytes)
        except Exception as exc:  # noqa: BLE001 - pinning only speeds copies up; without it they still work
            with self._lock:
                self._count(pool, -nbytes)
                self.refused += 1
                warned, self._warned = self._warned, True
            (log.debug if warned else log.warning)("pool memory stays pageable (%s: %s)", type(exc).__name__, exc)
            return False
        return True

    def unpin(self, address, nbytes, pool):
        try:
            self._unregister(address)
        except Exception as exc:  # noqa: BLE001 - the range goes with its mapping anyway
            log.debug("could not unregister pool memory: %s", exc)
        finally:
            with self._lock:
                self._count(pool, -nbytes)

    def _count(self, pool, nbytes):
        self.pinned += nbytes
        self._by_pool[pool] += nbytes
        if not self._by_pool[pool]:
            del self._by_pool[pool]

    def status(self):
        with self._lock:
            return {"pinned": self.pinned, "budget": self.budget, "refused": self.refused}
