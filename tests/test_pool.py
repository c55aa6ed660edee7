"""The slotted pool: blocks, segments (sealed memfds, or files), attachment checks, and real concurrent use.

Unit tests use small slots so that many segments are cheap; the rest go
through the real worker of the session, from threads and from spawned
processes, and check every array that comes back.
"""

import errno
import gc
import multiprocessing
import os
import random
import secrets
import stat
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.protocol import INLINE_MAX
from sklearn_gpu_bridge.runtime.private_files import pid_alive
from sklearn_gpu_bridge.shm import SLOT_SIZE, Pool, PoolAttachment, PoolError, remove_orphans
from sklearn_gpu_bridge.shm.pool import MEMFD, PIN_MIN_BYTES
from sklearn_gpu_bridge.worker.pinning import HostPinning

from .conftest import BACKEND, DriverStandIn

DEAD_PID = 2**22 + 12345  # above Linux's largest pid_max: no such process can exist
RESULT_TIMEOUT = 120
needs_memfd = pytest.mark.skipif(not MEMFD, reason="memfd segments exist on Linux only")


@pytest.fixture(params=["file", pytest.param("memfd", marks=needs_memfd)])
def small_pool(tmp_path, request):
    pool = Pool(str(tmp_path) if request.param == "file" else None, slot_size=4096, segment_slots=8)
    assert pool.kind == request.param
    yield pool
    pool.close()


def _slots(block):
    return {(block.segment, block.start + i) for i in range(block.count)}


# ---------------------------------------------------------------- blocks


def test_blocks_never_overlap_under_random_allocate_and_release(small_pool):
    rng = random.Random(0)
    live = {}  # id -> (block, fill byte)
    for step in range(400):
        if live and rng.random() < 0.45:
            block, _ = live.pop(rng.choice(list(live)))
            block.release()
        else:
            nbytes = rng.choice([1, 4095, 4096, 4097, 3 * 4096, 9 * 4096, 20 * 4096])
            block = small_pool.allocate(nbytes)
            assert block.nbytes >= nbytes and block.count == max(1, -(-nbytes // 4096))
            fill = step % 251 + 1
            block.buffer()[:] = bytes([fill]) * block.nbytes
            live[step] = (block, fill)
        taken = [_slots(block) for block, _ in live.values()] + [_slots(small_pool.handshake)]
        assert sum(len(s) for s in taken) == len(set().union(*taken)) == small_pool.slots_in_use + 1
        if step % 50 == 0:  # every live block still holds exactly what was written into it
            for block, fill in live.values():
                assert bytes(block.buffer()) == bytes([fill]) * block.nbytes
    for block, _ in live.values():
        block.release()
    assert small_pool.slots_in_use == 0


def test_a_block_freed_by_a_collection_inside_the_pools_lock_does_not_deadlock(small_pool):
    """A thread's request slot is freed when its link is collected (transport.link.Link.__del__); a link in a reference
    cycle is collected by whichever allocation starts a collection, which may be one the pool makes while it
    holds its own lock. Freeing a block there must not wait for that lock."""

    class Holder:  # a link's stand-in: frees its block when collected
        def __init__(self, block):
            self.block, self.cycle = block, self

        def __del__(self):
            self.block.release()

    freed = threading.Event()

    def collect_inside_the_lock():
        Holder(small_pool.allocate(1))  # unreachable at once, but held by its cycle until a collection
        with small_pool._lock:
            gc.collect()
        freed.set()

    thread = threading.Thread(target=collect_inside_the_lock, daemon=True)
    thread.start()
    assert freed.wait(10), "freeing a block from a collection inside the pool's lock deadlocked"


def test_a_block_larger_than_a_segment_gets_its_own_segment(small_pool):
    first = small_pool.allocate(1)
    big = small_pool.allocate(20 * 4096 + 1)  # 21 slots; a segment holds 8
    assert big.segment != first.segment and big.start == 0
    assert len(big.buffer()) == 21 * 4096
    big.buffer()[-1:] = b"\x07"
    assert small_pool.slots_in_use == 22
    assert small_pool.segment_bytes == [8 * 4096, 21 * 4096]
    big.release()
    first.release()
    assert small_pool.slots_in_use == 0
    assert small_pool.segment_bytes == [8 * 4096, 21 * 4096]  # a pool never shrinks while open


def test_released_slots_are_reused(small_pool):
    a = small_pool.allocate(3 * 4096)
    b = small_pool.allocate(2 * 4096)
    a.release()
    c = small_pool.allocate(2 * 4096)
    assert (c.segment, c.start) == (small_pool.handshake.segment, 1)  # in the hole a left, after the handshake
    for block in (b, c):
        block.release()
    assert small_pool.slots_in_use == 0


def test_file_segments_are_sparse_owner_only_and_removed_on_close(tmp_path):
    pool = Pool(str(tmp_path))
    try:
        block = pool.allocate(16)
        (path,) = pool.paths
        info = os.stat(path)
        assert os.path.basename(path).startswith(f"sgb-pool-{os.getpid()}-")
        assert stat.S_ISREG(info.st_mode)
        assert info.st_mode & 0o777 == 0o600
        assert info.st_size == 64 * SLOT_SIZE
        assert info.st_blocks * 512 <= 4 * SLOT_SIZE  # not 64 MiB of zeros written
        block.buffer()[:16] = b"x" * 16
        block.release()
    finally:
        pool.close()
    assert not os.path.exists(path)


@needs_memfd
def test_memfd_segments_are_sealed_and_leave_no_file():
    """A client cannot shrink (or grow) memory the worker maps: a truncate fails, so no SIGBUS is possible."""
    pool = Pool()
    try:
        assert pool.kind == "memfd" and pool.paths == []
        fd = pool.handshake.segment
        assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{pool.name}-0")
        for size in (0, 4096, 10 * 64 * SLOT_SIZE):
            with pytest.raises(OSError) as refused:
                os.ftruncate(fd, size)
            assert refused.value.errno == errno.EPERM
    finally:
        pool.close()


def test_close_keeps_live_arrays_valid(small_pool):
    block = small_pool.allocate(4096)
    view = np.frombuffer(block.buffer(), np.uint8)
    view[:] = 9
    small_pool.close()
    assert not any(os.path.exists(p) for p in small_pool.paths)
    assert int(view.sum()) == 9 * 4096


def _fake_pool_file(directory, pid, segment=0):
    path = os.path.join(directory, f"sgb-pool-{pid}-{secrets.token_hex(8)}-{segment}")
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_remove_orphans_removes_only_files_of_dead_pids(tmp_path):
    assert not pid_alive(DEAD_PID) and pid_alive(os.getpid())
    dead = [_fake_pool_file(tmp_path, DEAD_PID, s) for s in (0, 1)]
    live = _fake_pool_file(tmp_path, os.getpid())
    parent = _fake_pool_file(tmp_path, os.getppid())
    unrelated = [tmp_path / f"sgb-pool-{DEAD_PID}-notes.txt", tmp_path / f"other-{DEAD_PID}"]
    for path in unrelated:
        path.write_text("keep")
    assert remove_orphans(str(tmp_path)) == 2
    assert not any(os.path.exists(p) for p in dead)
    assert os.path.exists(live) and os.path.exists(parent)
    assert all(p.exists() for p in unrelated)
    assert remove_orphans(str(tmp_path / "missing")) == 0


def test_a_new_file_pool_removes_orphans_in_its_directory(tmp_path):
    dead = _fake_pool_file(tmp_path, DEAD_PID)
    pool = Pool(str(tmp_path))
    try:
        assert not os.path.exists(dead)
    finally:
        pool.close()


# ---------------------------------------------------------------- the worker's attachment


@pytest.mark.parametrize(
    "name",
    ["../x", "..", "", None, "sgb-pool-1-zz", "sgb-pool-1-0123456789ABCDEF", "sgb-pool-x-0123456789abcdef",
     "sgb-pool-1-0123456789abcdef-0", "sgb-pool-1-0123456789abcdef/../../etc",
     "../sgb-pool-1-0123456789abcdef", "/tmp/sgb-pool-1-0123456789abcdef", "sgb-pool-1-0123456789abcdef\n"],
)
def test_attachment_refuses_names_that_are_not_pool_names(tmp_path, name):
    with pytest.raises(PoolError, match="not a pool name"):
        PoolAttachment({"name": name, "kind": "file", "pid": os.getpid(), "segment": 0}, [str(tmp_path)])


@pytest.fixture
def attached(small_pool):
    block = small_pool.allocate(3 * 4096)
    block.buffer()[:4] = b"abcd"
    attachment = PoolAttachment(small_pool.describe(), [small_pool.directory or "/nowhere"])
    yield small_pool, attachment, block
    attachment.close()
    block.release()


def test_attachment_reads_and_writes_what_the_owner_sees(attached):
    pool, attachment, block = attached
    assert bytes(attachment.read(block.segment, block.offset, 4)) == b"abcd"
    out = attachment.output(block.segment, block.offset + 8, 3)
    out.memory[:] = b"xyz"
    out.commit(3)
    assert bytes(block.buffer()[8:11]) == b"xyz"
    end = len(pool._segments[0].view)
    assert len(attachment.read(block.segment, end, 0)) == 0


def test_the_challenge_nonce_lands_in_the_owners_handshake_area_only(attached):
    pool, attachment, block = attached
    before = bytes(block.buffer())
    slot, nonce = attachment.challenge()
    assert pool.read_nonce(slot) == nonce and len(nonce) == 32
    assert bytes(block.buffer()) == before  # no data block touched


@pytest.mark.parametrize(
    "offset, nbytes",
    [(0, 8 * 4096 + 1), (8 * 4096, 1), (2**62, 2**62), (1, 8 * 4096), (-1, 1), (0, -1), (4096, -4096),
     (None, 1), (0, 1.0), (False, 1)],
)
def test_attachment_refuses_ranges_outside_the_pool(attached, offset, nbytes):
    _, attachment, block = attached
    with pytest.raises(PoolError):
        attachment.read(block.segment, offset, nbytes)


@pytest.mark.parametrize("segment", [10**6, -1, 0.0, "0", True, None])
def test_attachment_refuses_segments_that_are_not_the_pools(attached, segment):
    _, attachment, _ = attached
    with pytest.raises(PoolError):
        attachment.read(segment, 0, 1)


def test_attachment_refuses_a_segment_file_that_is_a_symlink_or_empty(tmp_path):
    name = f"sgb-pool-{os.getpid()}-{secrets.token_hex(8)}"
    (tmp_path / f"{name}-0").write_bytes(b"x" * 8192)
    target = tmp_path / "target"
    target.write_bytes(b"secret" * 100)
    os.symlink(target, tmp_path / f"{name}-1")
    (tmp_path / f"{name}-2").write_bytes(b"")
    os.mkdir(tmp_path / f"{name}-3")
    attachment = PoolAttachment({"name": name, "kind": "file", "pid": os.getpid(), "segment": 0}, [str(tmp_path)])
    for segment in (1, 2, 3):
        with pytest.raises(PoolError):
            attachment.read(segment, 0, 1)


@needs_memfd
def test_memfd_attachment_refuses_an_fd_that_is_not_a_sealed_segment_of_that_pool(tmp_path):
    pool, other = Pool(), Pool()
    plain = open(tmp_path / "plain", "wb")
    unsealed = os.memfd_create(f"{pool.name}-0")  # the right name, no seals
    os.ftruncate(unsealed, 8192)
    try:
        for segment in (other.handshake.segment, plain.fileno(), unsealed, 10**6):
            with pytest.raises(PoolError):
                PoolAttachment({**pool.describe(), "segment": segment})
        attachment = PoolAttachment(pool.describe())
        with pytest.raises(PoolError):
            attachment.read(other.handshake.segment, 0, 1)  # another pool's segment, named in a request
        attachment.close()
    finally:
        plain.close()
        os.close(unsealed)
        pool.close()
        other.close()


# ---------------------------------------------------------------- pinning (page-locking for the GPU's DMA)


def _address_of(view):
    return np.frombuffer(view, np.uint8).ctypes.data


@pytest.fixture
def big_pool():
    """A memfd pool of 1 MiB slots (the real size), its blocks, and a way to attach it with a pinning."""
    pool = Pool()
    attachments = []

    def attach(pinning):
        attachment = PoolAttachment(pool.describe(), [], pinning=pinning)
        attachments.append(attachment)
        return attachment

    yield pool, attach
    for attachment in attachments:
        attachment.close()
    pool.close()


@needs_memfd
def test_a_segment_is_pinned_once_when_a_large_range_moves_through_it_and_unpinned_on_close(big_pool):
    pool, attach = big_pool
    block = pool.allocate(PIN_MIN_BYTES + 1)
    np.frombuffer(block.buffer(), np.uint8)[:] = 7
    driver = DriverStandIn()
    pinning = HostPinning(driver.register, driver.unregister, budget=1 << 40)
    attachment = attach(pinning)
    small = attachment.read(block.segment, block.offset, PIN_MIN_BYTES - 1)
    assert driver.calls == [] and pinning.pinned == 0  # a small range does not pin
    data = attachment.read(block.segment, block.offset, PIN_MIN_BYTES + 1)
    assert np.frombuffer(data, np.uint8).min() == 7  # what the client wrote, through the pinned mapping
    out = attachment.output(block.segment, block.offset, PIN_MIN_BYTES)
    [(_, address, nbytes)] = driver.calls  # the whole segment, once for both ranges
    mapping = attachment._segments[block.segment][2]
    assert address == _address_of(mapping) and nbytes == len(mapping)
    for view in (data, out.memory, small):
        assert address <= _address_of(view) < address + nbytes
    assert pinning.pinned == attachment.pinned_bytes == nbytes
    attachment.close()
    assert driver.calls[-1] == ("unregister", address) and driver.ranges == {} and pinning.pinned == 0


@needs_memfd
def test_two_requests_that_meet_a_new_segment_at_once_register_it_once(big_pool):
    pool, attach = big_pool
    block = pool.allocate(PIN_MIN_BYTES)
    driver = DriverStandIn(delay=0.2)
    pinning = HostPinning(driver.register, driver.unregister, budget=1 << 40)
    attachment = attach(pinning)
    with ThreadPoolExecutor(4) as threads:
        views = list(threads.map(lambda _: attachment.read(block.segment, block.offset, PIN_MIN_BYTES), range(4)))
    assert len(views) == 4 and driver.attempts == 1 and pinning.status()["refused"] == 0


@needs_memfd
def test_a_segment_stays_registered_until_the_last_request_that_holds_the_pool_lets_go(big_pool):
    """A client that leaves while its request still runs: the GPU may still be copying from the pinned pages."""
    pool, attach = big_pool
    block = pool.allocate(PIN_MIN_BYTES)
    driver = DriverStandIn()
    pinning = HostPinning(driver.register, driver.unregister, budget=1 << 40)
    attachment = attach(pinning)
    attachment.hold()
    attachment.read(block.segment, block.offset, PIN_MIN_BYTES)
    attachment.close()  # the client said goodbye, or died
    assert len(driver.ranges) == 1 and pinning.pinned > 0
    attachment.let_go()
    assert driver.ranges == {} and pinning.pinned == 0


@needs_memfd
def test_a_client_cannot_make_the_worker_lock_more_memory_than_its_budget(big_pool):
    """A hostile client describes a pool far larger than it needs and moves ranges through every segment."""
    pool, attach = big_pool
    blocks = [pool.allocate(64 << 20) for _ in range(3)]  # three segments of 64 MiB (sparse)
    driver = DriverStandIn()
    pinning = HostPinning(driver.register, driver.unregister, budget=160 << 20)  # one pool: at most 80 MiB
    attachment = attach(pinning)
    for block in blocks:
        assert len(attachment.read(block.segment, block.offset, 64 << 20)) == 64 << 20  # still served
    assert sum(driver.ranges.values()) == pinning.pinned == attachment.pinned_bytes == 64 << 20
    assert pinning.status()["refused"] == 2  # the pool's share is spent: the others stay pageable
    others = [attach(pinning), attach(pinning)]  # two more clients' pools share what is left
    for other in others:
        assert len(other.read(blocks[2].segment, blocks[2].offset, 64 << 20)) == 64 << 20
    assert sum(driver.ranges.values()) == pinning.pinned == 128 << 20 <= pinning.budget
    assert [other.pinned_bytes for other in others] == [64 << 20, 0]


@needs_memfd
def test_two_segments_of_one_pool_registered_at_once_stay_within_its_share(big_pool):
    pool, attach = big_pool
    blocks = [pool.allocate(64 << 20) for _ in range(2)]
    driver = DriverStandIn(delay=0.2)
    pinning = HostPinning(driver.register, driver.unregister, budget=160 << 20)  # one pool: at most 80 MiB
    attachment = attach(pinning)
    with ThreadPoolExecutor(2) as threads:
        list(threads.map(lambda block: attachment.read(block.segment, block.offset, 64 << 20), blocks))
    assert driver.attempts == 1 and pinning.pinned == attachment.pinned_bytes == 64 << 20


@needs_memfd
def test_a_driver_that_refuses_leaves_the_segment_pageable_and_is_not_asked_again(big_pool):
    pool, attach = big_pool
    block = pool.allocate(PIN_MIN_BYTES)
    np.frombuffer(block.buffer(), np.uint8)[:] = 3
    driver = DriverStandIn(fail=True)
    pinning = HostPinning(driver.register, driver.unregister, budget=1 << 40)
    attachment = attach(pinning)
    for _ in range(3):
        assert np.frombuffer(attachment.read(block.segment, block.offset, PIN_MIN_BYTES), np.uint8).max() == 3
    assert pinning.pinned == 0 and pinning.status()["refused"] == 1
    attachment.close()
    assert driver.ranges == {}


def test_file_segments_are_never_pinned(tmp_path):
    """Files are read with pread into a copy: there is no mapping to register."""
    pool = Pool(str(tmp_path))
    driver = DriverStandIn()
    try:
        block = pool.allocate(PIN_MIN_BYTES)
        attachment = PoolAttachment(pool.describe(), [str(tmp_path)],
                                    pinning=HostPinning(driver.register, driver.unregister, budget=1 << 40))
        attachment.read(block.segment, block.offset, PIN_MIN_BYTES)
        attachment.close()
    finally:
        pool.close()
    assert driver.calls == []


def test_the_worker_says_what_it_holds_pinned(connection):
    """cuML's worker pins a segment a large array went through; scikit-learn's has no pinning."""
    array = np.arange((PIN_MIN_BYTES + 8) // 8, dtype=np.float64)
    np.testing.assert_array_equal(connection.echo(array)[0], array)
    pinned = connection.status()["pinned"]
    if BACKEND == "cuml":
        assert pinned["pinned"] >= PIN_MIN_BYTES and pinned["budget"] > 0
    else:
        assert pinned is None


# ---------------------------------------------------------------- through the real worker

DTYPES = ("float32", "float64", "int64", "bool")


def _random_array(rng):
    dtype = DTYPES[rng.integers(len(DTYPES))]
    shape = tuple(int(n) for n in rng.integers(0, 300, rng.integers(1, 3), endpoint=True))
    if dtype == "bool":
        array = rng.random(shape) < 0.5
    elif dtype == "int64":
        array = rng.integers(-(2**62), 2**62, shape)
    else:
        array = rng.standard_normal(shape).astype(dtype)
    if rng.random() < 0.3:
        array = np.asfortranarray(array)
    if array.ndim == 2 and rng.random() < 0.2:
        array = array[::2, ::-1]
    return array


def _echo_and_check(connection, seed, count, per_call=2):
    rng = np.random.default_rng(seed)
    pooled = 0
    for _ in range(count):
        arrays = [_random_array(rng) for _ in range(per_call)]
        result = connection.echo(*arrays)
        assert len(result) == len(arrays)
        for out, original in zip(result, arrays):
            assert out.shape == original.shape and out.dtype == original.dtype
            np.testing.assert_array_equal(out, original)
            pooled += original.nbytes > INLINE_MAX
    return pooled


def test_threads_share_the_pool_without_mixing_arrays(connection):
    baseline = connection.pool.slots_in_use
    before = connection.stats["sent_pool"]
    with ThreadPoolExecutor(4) as executor:
        futures = [executor.submit(_echo_and_check, connection, seed, 50) for seed in range(4)]
        pooled = sum(f.result(timeout=RESULT_TIMEOUT) for f in futures)
    assert pooled > 20  # the pool really was used, from every thread at once
    assert connection.stats["sent_pool"] > before
    gc.collect()
    # the executor's threads are gone, and their arrays' blocks; where replies are watched for (reply_wait spin,
    # auto beside a cuML worker), each gone thread's request slot is kept as a spare for other threads' requests
    # (the worker may still write into it: test_threads_that_end_leave_no_sockets_or_slots_behind)
    spares = len(connection.transport._spare_request_slots)
    assert spares <= 4
    assert connection.pool.slots_in_use == baseline + spares


@pytest.mark.parametrize("reply_wait", ["spin", "sleep"])
def test_threads_that_end_leave_no_sockets_or_slots_behind(connection, reply_wait):
    """A program that starts thread after thread (a ThreadPoolExecutor per task) must not keep each gone
    thread's sockets, their descriptors, or its request slot until the process exits. (A gone thread's request
    slot is kept for the next thread's requests, since the worker may still write into it: one slot, reused.)"""
    def calls():
        for _ in range(2):
            connection.echo(np.ones(1000))

    def descriptors():
        return len(os.listdir("/proc/self/fd"))

    with sklearn_gpu_bridge.config_context(reply_wait=reply_wait):
        calls()  # this thread's own link, made before the count
        gc.collect()
        slots, fds = connection.pool.slots_in_use, descriptors()
        gc.disable()  # a link must go with its thread, not wait for a collection
        try:
            for _ in range(60):
                thread = threading.Thread(target=calls)
                thread.start()
                thread.join()
            assert connection.pool.slots_in_use <= slots + 1  # 60 threads in turn: one spare request slot
            assert descriptors() < fds + 10  # each thread's link held 3 (two sockets, one connection): 180 kept
        finally:
            gc.enable()


def test_a_forked_child_leaves_its_parents_links_alone(connection, monkeypatch):
    """A child forked while another thread holds a link inherits that link, and drops it (the thread is not in
    the child): dropping it must not close the parent's sockets from the child."""
    from sklearn_gpu_bridge.transport.link import Link

    closed_in_child, real_close = os.pipe(), Link.close
    parent = os.getpid()

    def close(link):
        if os.getpid() != parent:
            os.write(closed_in_child[1], b"x")
        return real_close(link)

    monkeypatch.setattr(Link, "close", close)
    called, done = threading.Event(), threading.Event()

    def hold_a_link():
        connection.echo(np.ones(3))
        called.set()
        done.wait(30)

    thread = threading.Thread(target=hold_a_link)
    thread.start()
    try:
        assert called.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: the other thread's link is dropped with its thread state
            try:
                gc.collect()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        done.set()
        thread.join(30)
    os.close(closed_in_child[1])
    assert os.read(closed_in_child[0], 16) == b"", "a forked child closed a link of its parent's"
    os.close(closed_in_child[0])
    assert connection.echo(np.ones(3))[0].shape == (3,)  # the parent's links work on


def _slots_after_a_first_request(connection):
    """The pool's slots in use once this thread has made a request: where replies are watched for, the
    thread's link keeps a request slot from its first request on, for as long as the thread lives."""
    connection.echo(np.ones(3))
    gc.collect()
    return connection.pool.slots_in_use


def test_results_hold_their_slots_until_they_are_freed(connection):
    baseline = _slots_after_a_first_request(connection)
    big = np.random.default_rng(5).standard_normal((300, 300))
    results = [connection.echo(big)[0] for _ in range(3)]
    assert connection.pool.slots_in_use > baseline
    for result in results:
        np.testing.assert_array_equal(result, big)  # none overwritten by a later request
    del result, results
    gc.collect()
    assert connection.pool.slots_in_use == baseline


def _child_echoes(connection_file, seed, count):
    """Runs in a spawned process: its own connection to the same worker."""
    sklearn_gpu_bridge.set_config(connection_file=connection_file, start_local_worker=False)
    try:
        connection = sklearn_gpu_bridge.get_connection()
        assert connection.pool is not None and connection.pool.name.split("-")[2] == str(os.getpid())
        pooled = _echo_and_check(connection, seed, count)
        return count, pooled
    finally:
        sklearn_gpu_bridge.reset_connection()


def test_two_processes_share_one_worker(worker, connection):
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as executor:
        futures = [executor.submit(_child_echoes, str(worker.connection_file), 100 + i, 30) for i in range(2)]
        results = [f.result(timeout=RESULT_TIMEOUT) for f in futures]
    assert [count for count, _ in results] == [30, 30]
    assert all(pooled > 0 for _, pooled in results)
    assert _echo_and_check(connection, 7, 3) >= 0  # this process's connection still works


def test_array_larger_than_a_segment_round_trips(connection):
    big = np.random.default_rng(3).standard_normal(10_000_000)  # 80 MB: 77 slots, a segment holds 64
    assert big.nbytes > 64 * SLOT_SIZE
    baseline = _slots_after_a_first_request(connection)
    before = dict(connection.stats)
    result = connection.echo(big[::-1].reshape(2000, 5000), big)
    np.testing.assert_array_equal(result[0], big[::-1].reshape(2000, 5000))
    np.testing.assert_array_equal(result[1], big)
    assert connection.stats["sent_pool"] - before.get("sent_pool", 0) == 2
    assert connection.stats["received_pool"] - before.get("received_pool", 0) == 2
    assert any(len(segment.view) > 64 * SLOT_SIZE for segment in connection.pool._segments)
    del result
    gc.collect()
    assert connection.pool.slots_in_use == baseline


@needs_memfd
def test_the_workers_status_counts_its_page_faults(worker):
    """A benchmark reads the worker's page faults over a case (e2e.py): a pool new to the worker costs it a
    fault per page it first reads or writes (a few per 2 MiB where shared memory is in huge pages)."""
    sklearn_gpu_bridge.reset_connection()  # a new client: a pool whose segments the worker has never touched
    connection = sklearn_gpu_bridge.get_connection()
    before = connection.status()["page_faults"]
    array = np.random.default_rng(4).standard_normal(2_500_000)  # 20 MB in, 20 MB out
    np.testing.assert_array_equal(connection.echo(array)[0], array)
    after = connection.status()["page_faults"]
    assert len(before) == len(after) == 2 and all(type(count) is int for count in before + after)
    assert after[0] - before[0] >= 2 * array.nbytes // (2 << 20)


@needs_memfd
def test_a_worker_waits_for_the_device_before_answering_a_request_that_read_pinned_memory(tmp_path):
    """A real worker (in this process, so that its backend can be a recording one) and a real client: the
    request that read a pinned range settles before its reply, a small one from an unpinned segment does not,
    and the segment is unregistered when the client says goodbye."""
    from sklearn_gpu_bridge.client import connect
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
    from sklearn_gpu_bridge.worker.backends import SklearnBackend
    from sklearn_gpu_bridge.worker.server import Worker

    driver, settled = DriverStandIn(), []

    class RecordingBackend(SklearnBackend):
        def host_pinning(self):
            return HostPinning(driver.register, driver.unregister, budget=1 << 40)

        def settle(self):
            settled.append(driver.attempts)

    worker = Worker(RecordingBackend(), connection_file=str(tmp_path / "worker.json"), threads=1).start()
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    connection = connect(read_connection_file(tmp_path / "worker.json"))
    try:
        small = np.arange(100_000, dtype=np.float64)  # 0.8 MB: in segment 0, not pinned yet
        np.testing.assert_array_equal(connection.echo(small)[0], small)
        assert settled == [] and driver.attempts == 0
        large = np.arange((PIN_MIN_BYTES + 8) // 8, dtype=np.float64)
        np.testing.assert_array_equal(connection.echo(large)[0], large)
        assert settled == [1] and len(driver.ranges) == 1  # registered, then waited for, before the reply
        assert connection.status()["pinned"]["pinned"] == sum(driver.ranges.values())
    finally:
        connection.close()
        worker._stopping.set()
        thread.join(timeout=10)
    assert driver.ranges == {} and worker.pinning.pinned == 0
