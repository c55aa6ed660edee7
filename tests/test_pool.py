"""The slotted mmap pool: leases, files, attachment checks, and real concurrent use.

Unit tests use small slots so that many segments are cheap; the rest go
through the real worker of the session, from threads and from spawned
processes, and check every array that comes back.
"""

import gc
import multiprocessing
import os
import random
import secrets
import stat
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.protocol import INLINE_MAX
from sklearn_gpu_bridge.host import pid_alive
from sklearn_gpu_bridge.shm import SLOT_SIZE, Pool, PoolAttachment, PoolError, remove_orphans

DEAD_PID = 2**22 + 12345  # above Linux's largest pid_max: no such process can exist
RESULT_TIMEOUT = 120


@pytest.fixture
def small_pool(tmp_path):
    pool = Pool(str(tmp_path), slot_size=4096, segment_slots=8)
    yield pool
    pool.close()


def _slots(lease):
    return {(lease.segment, lease.start + i) for i in range(lease.count)}


# ---------------------------------------------------------------- leasing


def test_leases_never_overlap_under_random_lease_and_release(small_pool):
    rng = random.Random(1234)
    live = {}  # id -> (lease, fill byte)
    for step in range(600):
        if live and rng.random() < 0.45:
            lease, _ = live.pop(rng.choice(list(live)))
            lease.release()
        else:
            nbytes = rng.choice([1, 100, 4096, 4097, 3 * 4096, rng.randrange(1, 12 * 4096)])
            lease = small_pool.allocate(nbytes)
            assert lease.nbytes >= nbytes and lease.count == max(1, -(-nbytes // 4096))
            fill = step % 251 + 1
            lease.buffer()[:] = bytes([fill]) * lease.nbytes
            live[step] = (lease, fill)
        taken = [_slots(lease) for lease, _ in live.values()]
        assert sum(len(s) for s in taken) == len(set().union(*taken)) == small_pool.slots_in_use
        if step % 50 == 0:  # every live lease still holds exactly what was written into it
            for lease, fill in live.values():
                assert bytes(lease.buffer()) == bytes([fill]) * lease.nbytes
    for lease, _ in live.values():
        lease.release()
    assert small_pool.slots_in_use == 0


def test_lease_larger_than_a_segment_gets_its_own_segment(small_pool):
    first = small_pool.allocate(1)
    big = small_pool.allocate(20 * 4096 + 1)  # 21 slots; a segment holds 8
    assert big.segment == 1 and big.start == 0 and big.count == 21
    assert len(big.buffer()) == 21 * 4096
    assert os.path.getsize(small_pool.paths[1]) == 21 * 4096
    big.buffer()[-1:] = b"\x07"
    assert small_pool.slots_in_use == 22
    big.release()
    first.release()
    assert small_pool.slots_in_use == 0


def test_lease_that_does_not_fit_what_is_left_grows_the_pool(small_pool):
    held = small_pool.allocate(6 * 4096)
    other = small_pool.allocate(3 * 4096)  # 2 slots left in segment 0: a new segment
    assert (held.segment, other.segment) == (0, 1)
    assert len(small_pool.paths) == 2
    held.release()
    other.release()


def test_shrink_frees_the_tail(small_pool):
    lease = small_pool.allocate(5 * 4096)
    lease.shrink(2 * 4096 + 1)
    assert lease.count == 3 and small_pool.slots_in_use == 3
    lease.shrink(10 * 4096)  # growing is not shrinking: nothing changes
    assert lease.count == 3
    tail = small_pool.allocate(2 * 4096)
    assert (tail.segment, tail.start) == (lease.segment, 3)
    lease.release()
    lease.release()  # twice is harmless
    tail.release()
    assert small_pool.slots_in_use == 0


def test_reslots_in_use_are_reused(small_pool):
    a = small_pool.allocate(3 * 4096)
    b = small_pool.allocate(2 * 4096)
    a.release()
    c = small_pool.allocate(2 * 4096)
    assert (c.segment, c.start) == (0, 0)  # in the hole a left, not a new segment
    d = small_pool.allocate(1)
    assert (d.segment, d.start) == (0, 2)
    assert len(small_pool.paths) == 1
    for lease in (b, c, d):
        lease.release()
    assert small_pool.slots_in_use == 0


@pytest.mark.parametrize("where", ["tmp", "default"])
def test_segment_files_are_sparse_owner_only_and_removed_on_close(tmp_path, where):
    pool = Pool(str(tmp_path) if where == "tmp" else None)  # default: /dev/shm on Linux
    try:
        lease = pool.allocate(16)
        (path,) = pool.paths
        info = os.stat(path)
        assert os.path.basename(path).startswith(f"sgb-pool-{os.getpid()}-")
        assert stat.S_ISREG(info.st_mode)
        assert info.st_mode & 0o777 == 0o600
        assert info.st_size == 64 * SLOT_SIZE
        assert info.st_blocks * 512 <= 4 * SLOT_SIZE  # not 64 MiB of zeros written
        lease.buffer()[:16] = b"x" * 16
        lease.release()
    finally:
        pool.close()
    assert not os.path.exists(path)


def test_close_keeps_live_arrays_valid(small_pool):
    lease = small_pool.allocate(4096)
    view = np.frombuffer(lease.buffer(), np.uint8)
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


def test_a_new_pool_removes_orphans_in_its_directory(tmp_path):
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
        PoolAttachment(str(tmp_path), name)


@pytest.fixture
def attached(small_pool):
    lease = small_pool.allocate(3 * 4096)
    lease.buffer()[:4] = b"abcd"
    yield small_pool, PoolAttachment(small_pool.directory, small_pool.name)
    lease.release()


def test_attachment_reads_what_the_owner_wrote(attached):
    pool, attachment = attached
    assert bytes(attachment.buffer(0, 0, 4)) == b"abcd"
    attachment.buffer(0, 8 * 4096 - 1, 1)[:] = b"z"  # the last byte of the segment
    assert len(attachment.buffer(0, 8 * 4096, 0)) == 0
    attachment.close()


@pytest.mark.parametrize(
    "segment, offset, nbytes",
    [
        (0, 0, 8 * 4096 + 1), (0, 8 * 4096, 1), (0, 2**62, 2**62), (0, 1, 8 * 4096), (1, 0, 1), (10**6, 0, 1),
        (-1, 0, 1), (0, -1, 1), (0, 0, -1), (0, 4096, -4096),
        (0.0, 0, 1), ("0", 0, 1), (0, None, 1), (0, 0, 1.0), (True, 0, 1), (0, False, 1),
    ],
)
def test_attachment_refuses_ranges_outside_the_pool(attached, segment, offset, nbytes):
    _, attachment = attached
    with pytest.raises(PoolError):
        attachment.buffer(segment, offset, nbytes)


def test_attachment_refuses_a_segment_that_is_a_symlink_or_empty(tmp_path):
    name = f"sgb-pool-{os.getpid()}-{secrets.token_hex(8)}"
    target = tmp_path / "target"
    target.write_bytes(b"secret" * 100)
    os.symlink(target, tmp_path / f"{name}-0")
    (tmp_path / f"{name}-1").write_bytes(b"")
    os.mkdir(tmp_path / f"{name}-2")
    attachment = PoolAttachment(str(tmp_path), name)
    for segment in (0, 1, 2):
        with pytest.raises(PoolError):
            attachment.buffer(segment, 0, 1)


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
    assert connection.pool.slots_in_use == baseline


def test_results_hold_their_slots_until_they_are_freed(connection):
    baseline = connection.pool.slots_in_use
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
    baseline = connection.pool.slots_in_use
    before = dict(connection.stats)
    result = connection.echo(big[::-1].reshape(2000, 5000), big)
    np.testing.assert_array_equal(result[0], big[::-1].reshape(2000, 5000))
    np.testing.assert_array_equal(result[1], big)
    assert connection.stats["sent_pool"] - before.get("sent_pool", 0) == 2
    assert connection.stats["received_pool"] - before.get("received_pool", 0) == 2
    assert any(os.path.getsize(p) > 64 * SLOT_SIZE for p in connection.pool.paths)
    del result
    gc.collect()
    assert connection.pool.slots_in_use == baseline
