"""The GPUs a worker drives: what each one holds and runs, and where the next request goes.

A worker drives one GPU, or several (the ``gpus`` setting). Each :class:`Device`
admits requests by device memory on its own (its budget, the costs of the
requests running on it) and counts its work. :meth:`Devices.place` chooses
where a request runs: one that reads a fitted model (a call, an attribute, a
state export) runs where the model was fitted; any other (a fit, a state
import) on the usable device with the least work (requests running there, and
waiting for it) among those where its cost fits now. A request that fits
nowhere waits; on a device with nothing running anything fits, so the first
always runs, however large.

A request that fails for its device (out of device memory, a CUDA error) fails
alone, its error naming the device; one whose CUDA errors come
:data:`ERRORS_TO_GIVE_UP` times in a row is marked unusable, with the last one
as the reason, and gets no new work. The scheduler's lock guards the counts
of running work (:mod:`.scheduler`); a device's own lock, its failures.
"""

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sklearn_gpu_bridge.errors import ConfigurationError

#: CUDA errors in a row, with no request on the device done in between, after which a device gets no more work
ERRORS_TO_GIVE_UP = 3
#: the exception types of CuPy and the CUDA Python bindings that are CUDA's own errors
CUDA_ERROR_TYPES = frozenset({"CUDARuntimeError", "CUDADriverError", "CUDARTError", "CUresultError"})


class DeviceUnusable(RuntimeError):
    """A request for a device that was marked unusable (the models fitted on it are lost)."""


@dataclass(eq=False)
class Device:
    """One GPU of the worker: its admission by memory and its work, counted as it happens."""

    index: int
    budget: int | None = None  # bytes of device memory that requests running at once may use; None: no limit
    in_use: int = 0  # the costs of the requests running here now
    peak_in_use: int = 0
    running: int = 0
    queued: int = 0  # requests waiting that can run only here: they read a model fitted here
    requests: int = 0  # requests placed here so far, the running ones too
    failed: int = 0  # requests that failed for the device (out of its memory, a CUDA error)
    unusable: str | None = None  # why no new work comes here; None: it serves
    errors_in_a_row: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self):
        return f"GPU {self.index}"

    @property
    def work(self):
        return self.running + self.queued

    def fits(self, cost):
        return not self.running or self.budget is None or self.in_use + cost <= self.budget

    def start(self, cost):
        self.requests += 1
        self.running += 1
        self.in_use += cost
        self.peak_in_use = max(self.peak_in_use, self.in_use)

    def finish(self, cost):
        self.running -= 1
        self.in_use -= cost

    def check(self):
        """Refuse a request here once the device is unusable."""
        if self.unusable is not None:
            raise DeviceUnusable(f"{self.name} of this worker is unusable ({self.unusable}); the models fitted on "
                                 "it are lost: fit them again (new fits go to the worker's other GPUs)")

    def served(self):
        """A request here ended without a failure of the device."""
        self.errors_in_a_row = 0

    def failure(self, kind, exc):
        """Count a request that failed for the device (:func:`device_failure`'s ``kind``); True when this marks
        the device unusable."""
        with self._lock:
            self.failed += 1
            if kind != "cuda" or self.unusable is not None:
                return False
            self.errors_in_a_row += 1
            if self.errors_in_a_row < ERRORS_TO_GIVE_UP:
                return False
            self.unusable = f"{self.errors_in_a_row} CUDA errors in a row, the last: {type(exc).__name__}: {exc}"
            return True

    def status(self, handles=0, memory_used=None):
        return {"index": self.index, "budget": self.budget, "in_use": self.in_use, "peak_in_use": self.peak_in_use,
                "requests": self.requests, "running": self.running, "queued": self.queued, "failed": self.failed,
                "handles": handles, "memory_used": memory_used, "unusable": self.unusable}


class Devices:
    """The devices a worker drives, and where each request runs (:meth:`place`).

    ``driven``: the worker makes each request's device current on the thread that runs it (``gpus`` set);
    False: one device, the process's current one, used as it is.
    """

    def __init__(self, budgets: Sequence[int | None], indices: Sequence[int] | None = None, driven=False):
        indices = range(len(budgets)) if indices is None else indices
        self.all = [Device(index, budget) for index, budget in zip(indices, budgets, strict=True)]
        self._by_index = {device.index: device for device in self.all}
        self.driven = driven

    def __len__(self):
        return len(self.all)

    def __iter__(self):
        return iter(self.all)

    def get(self, index):
        """The device of that index, or None."""
        return self._by_index.get(index)

    @property
    def budget(self):
        """All the devices' budgets together; None where one has none."""
        budgets = [device.budget for device in self.all]
        return None if None in budgets else sum(budgets)

    @property
    def in_use(self):
        return sum(device.in_use for device in self.all)

    def place(self, cost, index=None, room=True):
        """The device a request of ``cost`` bytes starts on now, or None while it must wait (under the scheduler's
        lock). ``index``: the device it must run on (that of the model it reads); else the usable device with the
        least work among those where it fits (``room=False``: wherever, memory aside)."""
        pinned = self._by_index.get(index)
        if pinned is not None:
            return pinned if not room or pinned.fits(cost) or pinned.unusable else None
        usable = [device for device in self.all if device.unusable is None] or self.all  # none: fail at once
        fitting = [device for device in usable if not room or device.fits(cost)]
        return min(fitting, key=lambda d: (d.work, d.in_use, d.index), default=None)


def parse_gpus(gpus, count) -> list[int]:
    """The indices of the GPUs the ``gpus`` setting names: ``"all"`` (the ``count`` this process sees; one where
    ``count`` is None, the CPU backend's stand-in), or a list such as ``"0,1"`` (or a list or tuple of ints).
    ConfigurationError for anything else, or a GPU this process does not see."""
    if isinstance(gpus, str) and gpus.strip().lower() == "all":
        return list(range(count if count is not None else 1))
    words = gpus.split(",") if isinstance(gpus, str) else list(gpus) if isinstance(gpus, Iterable) else [gpus]
    try:
        indices = [int(str(word).strip()) for word in words]
    except ValueError:
        indices = []
    if not indices or min(indices) < 0 or len(set(indices)) != len(indices):
        raise ConfigurationError(f"gpus must be 'all' or distinct GPU indices such as 0,1; not {gpus!r}")
    if count is not None and max(indices) >= count:
        raise ConfigurationError(f"gpus {gpus!r}: this process sees {count} GPU(s), numbered from 0 (CUDA numbers "
                                 "them within CUDA_VISIBLE_DEVICES where that is set)")
    return indices


def device_failure(exc):
    """What ``exc`` says of the device it ran on: ``"memory"`` (out of device memory), ``"cuda"`` (a CUDA error),
    or None (the request's own failure: bad input, a parameter the estimator refuses ...).

    cuML's out-of-memory errors are MemoryErrors (RMM's ``bad_alloc``, CuPy's ``OutOfMemoryError``); CUDA's
    errors come as CuPy's or CUDA Python's exception types, or as RuntimeErrors whose text RAFT and RMM write
    ("CUDA error ... cudaErrorIllegalAddress ..."). An exception that says nothing itself (CuPy's allocator
    asserts on its way out of a CUDA error) is read through to the one it was raised from or while handling;
    one with words of its own (a user's ValueError) is what it says.
    """
    seen = []
    while exc is not None and not isinstance(exc, DeviceUnusable) and len(seen) < 8:
        kind = _failure_kind(exc)
        if kind is not None or str(exc):
            return kind
        seen.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if any(exc is e for e in seen):
            return None
    return None  # a DeviceUnusable is counted when its device was given up


def _failure_kind(exc):
    text = str(exc)
    if "cudaErrorMemoryAllocation" in text or "CUDA_ERROR_OUT_OF_MEMORY" in text:
        return "memory"
    if isinstance(exc, MemoryError):  # RMM's bad_alloc also carries a sticky error met while allocating
        return "cuda" if _OTHER_CUDA_ERROR.search(text) else "memory"
    if type(exc).__name__ in CUDA_ERROR_TYPES or "CUDA error" in text or "cudaError" in text:
        return "cuda"
    return None


#: a CUDA error named in an allocator's MemoryError that is not the want of memory (cudaErrorIllegalAddress ...)
_OTHER_CUDA_ERROR = re.compile(r"cudaError(?!MemoryAllocation)\w+|CUDA_ERROR_(?!OUT_OF_MEMORY)\w+")
