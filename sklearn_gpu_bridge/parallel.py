"""Memory-bound work on large arrays, split over cores.

One core's memcpy or sum does not reach a server's memory bandwidth: on a
16-core server a 200 MB copy takes 40 ms in one thread and 12 ms in eight.
numpy releases the GIL while it copies or sums, so plain threads do it.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: threads for large copies and checks
THREADS = min(8, os.cpu_count() or 1)
#: below this many bytes, one thread: where a core copies 16 GB/s, splitting 4-16 MB costs more than it saves;
#: where it copies 5 GB/s, 12.8 MB take 2.5 ms to copy and 2 ms to check in one thread.
PARALLEL_MIN = 4 << 20

_executor = None  # (pid, executor): a forked child makes its own
_lock = threading.Lock()


def _chunks(nbytes):
    """(threads, bytes per chunk) for an array of ``nbytes``; 1 thread when small."""
    threads = min(THREADS, nbytes // (PARALLEL_MIN // 4) or 1)
    if nbytes < PARALLEL_MIN or threads < 2:
        return 1, nbytes
    return threads, -(-nbytes // threads)


def run_chunks(function, pieces):
    """``[function(*piece) for piece in pieces]``, on the pool of threads (in order)."""
    global _executor
    with _lock:
        if _executor is None or _executor[0] != os.getpid():
            _executor = (os.getpid(), ThreadPoolExecutor(THREADS, thread_name_prefix="sgb-parallel"))
        executor = _executor[1]
    return [future.result() for future in [executor.submit(function, *piece) for piece in pieces]]


BLOCK = 1 << 20  # bytes: a checked copy sums each block while it is still in cache


def _copy_chunk(target, source):
    if target.dtype == source.dtype:  # nothing to overflow
        np.copyto(target, source)
        return
    with np.errstate(over="raise"):  # numpy's error state is per thread: set it in each
        np.copyto(target, source, casting="same_kind")


def _copy_chunk_checked(target, source):
    """Copy, and whether the copied values sum to a finite number, block by block: one pass over memory."""
    step = max(1, BLOCK // max(target.itemsize, source.itemsize))
    total = 0.0
    with np.errstate(over="raise"):
        for at in range(0, target.size, step):
            block = target[at : at + step]
            np.copyto(block, source[at : at + step], casting="same_kind")
            total += float(block.sum())
    return bool(np.isfinite(total))


def copy_into(target, source, check_finite=False):
    """``target[...] = source`` for two arrays of one shape and memory order, casting on the way.

    A float64 -> float32 cast that overflows raises FloatingPointError (the
    caller words the error). Large arrays are copied in chunks on all cores.
    ``check_finite``: also sum what was copied, in the same pass (scikit-learn's
    fast finite test); returns whether every sum is finite (else None).
    """
    order = "F" if source.flags.f_contiguous and not source.flags.c_contiguous else "C"
    flat_target, flat_source = target.reshape(-1, order=order), source.reshape(-1, order=order)
    copy = _copy_chunk_checked if check_finite else _copy_chunk
    threads, step = _chunks(max(flat_source.nbytes, flat_target.nbytes))
    if threads == 1:
        results = [copy(flat_target, flat_source)]
    else:
        step = -(-flat_source.size // threads)
        results = run_chunks(copy, [(flat_target[at : at + step], flat_source[at : at + step])
                                    for at in range(0, flat_source.size, step)])
    return all(results) if check_finite else None


def all_sums_finite(X):
    """Whether every chunk of a float array sums to a finite number (scikit-learn's fast test).

    True means no NaN and no inf. False means there may be one (or the sum
    overflowed): scikit-learn's own check then decides, and words the error.
    """
    flat = X.ravel(order="K")  # a view for C- and F-ordered arrays (validated arrays are one or the other)
    threads, step = _chunks(flat.nbytes)
    if threads == 1:
        return bool(np.isfinite(flat.sum()))
    step //= flat.itemsize
    sums = run_chunks(np.sum, [(flat[at : at + step],) for at in range(0, flat.size, step)])
    return bool(np.isfinite(sum(sums)))
