"""How a cuML worker's process allocates device memory (the worker setting ``device_memory``).

cuML and CuPy allocate through RMM, whose default calls cudaMalloc and
cudaFree for every array; a worker takes memory from CUDA's stream-ordered
pool instead, one pool per GPU it drives (docs/performance.md, device memory).
A user's own process (cuML in process, a Dask worker) keeps what its owner chose.
"""

import logging

from sklearn_gpu_bridge.config import DEVICE_MEMORY_KINDS

log = logging.getLogger(__name__)

#: device memory that CUDA's stream-ordered pool keeps for reuse at a synchronization, at most
#: (a quarter of the device's, at most, on a small GPU)
ASYNC_POOL_KEEPS = 1 << 30


def use_device_memory(kind):
    """How this process allocates device memory for cuML and CuPy: ``"async-cupy"``, ``"async"`` or ``"cuda"``
    (leave it).

    cuML and CuPy allocate through RMM, whose default calls cudaMalloc and cudaFree for every array, and
    cudaFree waits for the whole device. A small call allocates and frees dozens of arrays (StandardScaler
    5000x20: 46, which take 0.55-0.75 ms of a 3-4 ms call in RMM's CuPy allocator on an H200).
    ``"async"``: CUDA's stream-ordered allocator
    (cudaMallocAsync), as dask-cuda's ``--rmm-async`` sets it: freed memory is reused without waiting for
    the device, and what the pool holds beyond :data:`ASYNC_POOL_KEEPS` goes back at the next
    synchronization. ``"async-cupy"`` (the default): the same, and CuPy's arrays from CuPy's own
    stream-ordered allocator (:func:`_cupy_allocates_itself`). Only the worker's own process is set so: a
    user's process (``InProcess``, a Dask worker) keeps what its owner chose.
    """
    check_device_memory(kind)
    if kind not in ("async", "async-cupy"):
        return
    import cupy
    import rmm

    try:
        _, total = cupy.cuda.Device().mem_info
        keeps = min(ASYNC_POOL_KEEPS, total // 4)
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource(release_threshold=keeps))
    except Exception as exc:  # noqa: BLE001 - a GPU or driver without memory pools: cuML's own way, said
        log.warning("CUDA's stream-ordered pool is not usable here (%s: %s); device memory is allocated as "
                    "cuML does by default", type(exc).__name__, exc)
        return
    log.info("device memory: CUDA's stream-ordered pool (keeps up to %d MiB for reuse)", keeps >> 20)
    if kind == "async-cupy":
        _cupy_allocates_itself(cupy)


def _cupy_allocates_itself(cupy):
    """CuPy's arrays from CuPy's own stream-ordered allocator (``MemoryAsyncPool``, Cython) on the device's
    default pool, not through RMM's ``rmm_cupy_allocator``, which cuML installs at import: that one runs Python
    for every array (an RMM buffer, CuPy's wrappers of it), 0.17-0.27 ms of a small call on an H200.
    ``MemoryAsyncPool`` sets the pool's release threshold to no limit (CuPy reads the threshold as a cap on the
    pool's growth), so the pool keeps what CuPy frees for reuse.

    Only where this process sees one GPU: ``MemoryAsyncPool`` makes the pool it is given the current pool of
    every visible GPU, each made current in turn, so on a host of several it would open a context on each and
    hand the first GPU's memory to any other's ``cudaMallocAsync``. There CuPy's arrays keep coming through RMM.
    """
    runtime = cupy.cuda.runtime
    if runtime.getDeviceCount() != 1:
        log.info("CuPy's arrays: through RMM (this process sees several GPUs)")
        return
    try:
        pool = runtime.deviceGetDefaultMemPool(cupy.cuda.Device().id)
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool(pool).malloc)
    except Exception as exc:  # noqa: BLE001 - RMM's allocator stays, said
        log.warning("CuPy's stream-ordered allocator is not usable here (%s: %s); CuPy's arrays come through "
                    "RMM", type(exc).__name__, exc)
        return
    log.info("CuPy's arrays: CuPy's stream-ordered allocator on the device's default pool")


def use_device_memory_on(indices, kind):
    """:func:`use_device_memory` for a worker that drives the GPUs ``indices``.

    RMM's memory resource is per device (``set_current_device_resource`` sets the current device's, and
    ``CudaAsyncMemoryResource`` makes its pool on the current device), so each GPU gets a pool of its own, made
    while it is current; the process's current device has one already (:class:`CumlBackend`). CuPy's allocator
    is one for the whole process: :func:`_cupy_allocates_itself_on` makes it RMM's, on each device's pool.
    """
    check_device_memory(kind)
    if kind not in ("async", "async-cupy"):
        return
    import cupy

    current = cupy.cuda.runtime.getDevice()
    for index in indices:
        if index != current:
            with cupy.cuda.Device(index):
                use_device_memory("async")
    if kind == "async-cupy" and list(indices) != [current]:  # the current one alone is set up already
        _cupy_allocates_itself_on(cupy, indices)


def _cupy_allocates_itself_on(cupy, indices):
    """CuPy's arrays through RMM (``rmm_cupy_allocator``, each GPU's own pool) on a worker of several GPUs (or
    of one that is not the process's first).

    CuPy's stream-ordered allocator frees an array on the stream it was made on, by default the legacy
    stream (pointer 0), which names the current device's: an array of one GPU collected while another is
    current (a cycle the collector breaks in any thread) would be freed on the other's stream. RMM's buffers
    are freed on their own device. :func:`_cupy_allocates_itself` set CuPy's allocator for the first GPU at
    start; this puts RMM's back.
    """
    try:
        from rmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
    except Exception as exc:  # noqa: BLE001 - said; CuPy's allocator stays
        log.warning("CuPy's arrays could not be given RMM's allocator on GPUs %s (%s: %s)", indices,
                    type(exc).__name__, exc)
        return
    log.info("CuPy's arrays: through RMM, on each of GPUs %s", indices)


def check_device_memory(kind):
    """ValueError for a ``device_memory`` setting that is none of :data:`DEVICE_MEMORY_KINDS` (None: leave it)."""
    if kind is not None and kind not in DEVICE_MEMORY_KINDS:
        raise ValueError(f"device_memory must be one of {', '.join(DEVICE_MEMORY_KINDS)}, not {kind!r}")
