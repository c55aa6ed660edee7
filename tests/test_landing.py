"""Arrays sent as frames land in buffers the worker reuses; one that a model still refers to is never reused."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from sklearn_gpu_bridge.client import connect
from sklearn_gpu_bridge.worker.landing import PAGE, LandingBuffers
from sklearn_gpu_bridge.worker.pinning import HostPinning

from .conftest import BACKEND, DriverStandIn, WorkerProcess

MiB = 1 << 20


def test_a_buffer_is_reused_once_nothing_refers_to_it():
    landing = LandingBuffers(keep_bytes=64 * MiB, min_bytes=MiB)
    first = landing.take(8 * MiB)
    address = first.ctypes.data
    first[:] = 1
    del first
    again = landing.take(8 * MiB)
    assert again.ctypes.data == address
    kept = again.reshape(-1, 8)[::2]  # what a fitted estimator keeps of its input: a view of a view
    del again
    other = landing.take(7 * MiB)
    other[:] = 2
    assert other.ctypes.data != address
    assert (kept == 1).all()
    assert landing.status() == {"kept": 15 * MiB, "reused": 1, "made": 2, "heap": False, "pinned": 0}


def test_free_buffers_stay_within_their_budget_and_small_ones_are_not_kept():
    landing = LandingBuffers(keep_bytes=16 * MiB, min_bytes=MiB)
    landing.take(8 * MiB)
    landing.take(12 * MiB)  # 8 + 12 free would pass 16: the 8 goes
    assert landing.status()["kept"] == 12 * MiB
    landing.take(MiB // 2)
    landing.take(100 * MiB)  # more than the budget on its own: handed out, not kept
    assert landing.status() == {"kept": 0, "reused": 0, "made": 3, "heap": False, "pinned": 0}


def test_a_buffer_is_page_locked_when_first_reused_and_unlocked_before_it_goes():
    """Registered once its pages are written (cheap then), on whole pages of its own (the driver refuses a page
    registered twice), and unregistered before its memory is freed."""
    driver = DriverStandIn()
    landing = LandingBuffers(keep_bytes=16 * MiB, min_bytes=MiB,
                             pinning=HostPinning(driver.register, driver.unregister, budget=1 << 40))
    first = landing.take(8 * MiB + 100)
    assert first.ctypes.data % PAGE == 0 and not landing.is_pinned(first) and driver.calls == []
    first[:] = 1
    del first
    again, small = landing.take(8 * MiB), landing.take(5 * MiB)  # the other buffer is made beside it, unlocked
    assert landing.is_pinned(again) and not landing.is_pinned(small)
    ((_, address, nbytes),) = driver.calls
    assert address == again.ctypes.data and nbytes == 8 * MiB + PAGE  # whole pages, all of them the buffer's
    del again, small
    for _ in range(3):
        assert landing.is_pinned(landing.take(8 * MiB))  # registered once, reused locked
    assert len(driver.calls) == 1 and landing.status()["pinned"] == 8 * MiB + PAGE
    landing.take(15 * MiB)  # the free 8 MiB buffer goes to make room: unregistered first
    assert driver.calls[-1] == ("unregister", address) and driver.ranges == {}
    assert landing.status()["pinned"] == 0


def test_landing_buffers_stay_within_the_pinning_budget_and_a_refusal_is_not_asked_again():
    driver = DriverStandIn()
    pinning = HostPinning(driver.register, driver.unregister, budget=12 * MiB)  # 6 MiB for the buffers
    landing = LandingBuffers(keep_bytes=64 * MiB, min_bytes=MiB, pinning=pinning)
    landing.take(8 * MiB)
    for _ in range(3):
        assert not landing.is_pinned(landing.take(8 * MiB))
    assert driver.attempts == 0 and pinning.refused == 1 and landing.status()["reused"] == 3


def test_a_request_that_read_a_locked_landing_buffer_waits_for_the_device_before_its_reply(tmp_path):
    """A real worker on TCP (frames) with a recording backend, and a real client: the same 8 MB array three
    times lands in one buffer, locked when first reused; from then on the request settles before its reply."""
    from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
    from sklearn_gpu_bridge.worker.backends import SklearnBackend
    from sklearn_gpu_bridge.worker.server import Worker

    driver, settled = DriverStandIn(), []

    class RecordingBackend(SklearnBackend):
        def host_pinning(self):
            return HostPinning(driver.register, driver.unregister, budget=1 << 40)

        def settle(self):
            settled.append(len(driver.ranges))

    worker = Worker(RecordingBackend(), connection_file=str(tmp_path / "worker.json"), bind="127.0.0.1",
                    threads=1, array_cache_mb=0).start()
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    connection = connect(read_connection_file(tmp_path / "worker.json"), pool="off", array_cache="off")
    try:
        X = np.random.default_rng(0).standard_normal((20_000, 50))  # 8 MB: 8 frames
        for sent in range(1, 4):
            np.testing.assert_array_equal(connection.echo(X)[0], X)
            assert settled == [1] * (sent - 1)  # the first request landed in a new buffer, not locked
        assert len(driver.calls) == 1 and connection.status()["landing"]["pinned"] == -(-X.nbytes // PAGE) * PAGE
    finally:
        connection.close()
        worker._stopping.set()
        thread.join(timeout=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("user_setting", [None, "MALLOC_TRIM_THRESHOLD_"])
def test_malloc_keeps_frames_in_its_heap_unless_the_user_said_otherwise(user_setting):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if user_setting:
        env[user_setting] = str(64 * MiB)
    code = "from sklearn_gpu_bridge.worker.landing import keep_frames_in_heap; print(keep_frames_in_heap())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("False" if user_setting else "True")


def test_a_model_that_keeps_its_input_keeps_its_buffer(tmp_path):
    """Over TCP (frames of 1 MiB), a NearestNeighbors fitted on X keeps a view of the buffer X landed in: the
    arrays sent after it land in other buffers (reused among themselves), and the model still finds X."""
    process, connection = WorkerProcess(tmp_path, bind="127.0.0.1"), None
    try:
        connection = connect(process.info, pool="off", array_cache="off")
        rng = np.random.default_rng(0)
        X = rng.standard_normal((20_000, 50))  # 8 MB: 8 frames
        fitted = connection.fit("NearestNeighbors", {"algorithm": "brute"}, "fit", [X], {})
        for _ in range(3):
            other = rng.standard_normal((20_000, 50))
            (back,) = connection.echo(other)
            np.testing.assert_array_equal(back, other)
        distances, indices = connection.call(fitted.handle, "kneighbors", [X[:5]], {"n_neighbors": 1})
        np.testing.assert_allclose(distances, 0, atol=1e-6)
        np.testing.assert_array_equal(indices.ravel(), np.arange(5))
        landing = connection.status()["landing"]
        if BACKEND == "cuml":  # the model holds X on the device: its buffer is free at once, locked when reused
            assert landing["reused"] >= 1 and landing["pinned"] > 0
        else:  # scikit-learn's model keeps a view of X: the arrays after it land in another buffer
            assert landing["made"] >= 2 and landing["reused"] >= 1 and landing["pinned"] == 0
        assert landing["heap"] is (sys.platform.startswith("linux") and not any(k.startswith("MALLOC_") for k in os.environ))
    finally:
        if connection is not None:
            connection.close()
        process.stop()


class DeviceArray:
    """What the encoder reads of a CuPy array, held on the host: its layout, and ``get(out=...)``."""

    __cuda_array_interface__ = {}

    def __init__(self, host):
        self.host, self.flags, self.dtype, self.shape = host, host.flags, host.dtype, host.shape
        self.size, self.nbytes = host.size, host.nbytes

    def get(self, out=None):
        if out is None:
            return self.host.copy()
        out[...] = self.host
        return out


def test_a_device_result_sent_as_frames_is_copied_into_a_reused_buffer():
    """The worker's reply over TCP: a device array comes to the host in a landing buffer (page-locked memory on
    a GPU worker), whose frames ZeroMQ holds until sent; once they are let go, the next reply reuses it."""
    from sklearn_gpu_bridge.protocol.arrays import Decoder, Encoder

    landing = LandingBuffers(keep_bytes=64 * MiB, min_bytes=MiB)
    result = np.random.default_rng(0).standard_normal((1000, 1000))  # 8 MB
    for sent in range(2):
        encoder = Encoder(max_frame=MiB, host_buffer=landing.take)
        marker = encoder.encode(DeviceArray(result))
        kept = landing._kept[0]
        assert len(landing._kept) == 1 and all(
            kept.ctypes.data <= np.frombuffer(frame, np.uint8).ctypes.data < kept.ctypes.data + kept.nbytes
            for frame in encoder.buffers)  # every frame is a view of the kept buffer: no copy of its own
        np.testing.assert_array_equal(Decoder({"arrays": encoder.arrays}, encoder.buffers).decode(marker), result)
        del encoder, marker, kept
    assert landing.status()["made"] == 1 and landing.status()["reused"] == 1


def test_a_smaller_result_in_a_reused_buffer_carries_none_of_the_earlier_ones_bytes():
    """Buffers serve every client in turn: a reply that reuses the buffer of a larger one (another client's)
    sends its own bytes only, not the tail of the earlier result that still lies in the buffer."""
    from sklearn_gpu_bridge.protocol.arrays import Decoder, Encoder

    landing = LandingBuffers(keep_bytes=64 * MiB, min_bytes=MiB)
    secret = np.full((1024, 1024), 7.0)  # 8 MiB of another client's result
    encoder = Encoder(max_frame=MiB, host_buffer=landing.take)
    encoder.encode(DeviceArray(secret))
    del encoder
    mine = np.arange(6 * MiB // 8, dtype=np.float64).reshape(-1, 64)  # 6 MiB: fits in the 8 MiB buffer
    encoder = Encoder(max_frame=MiB, host_buffer=landing.take)
    marker = encoder.encode(DeviceArray(mine))
    assert landing.status()["reused"] == 1  # the same buffer, its last 2 MiB still the earlier result's
    sent = b"".join(bytes(frame) for frame in encoder.buffers)
    assert sent == mine.tobytes()  # its own bytes, exactly as many
    np.testing.assert_array_equal(Decoder({"arrays": encoder.arrays}, encoder.buffers).decode(marker), mine)


@pytest.mark.gpu
def test_a_cuml_result_over_tcp_lands_in_locked_buffers_and_is_right(tmp_path):
    """A cuML worker on TCP: StandardScaler's output (a device array) comes back through reused, page-locked
    buffers, and is scikit-learn's."""
    from sklearn.preprocessing import StandardScaler

    process, connection = WorkerProcess(tmp_path, bind="127.0.0.1"), None
    try:
        connection = connect(process.info, pool="off", array_cache="off")
        X = np.random.default_rng(0).standard_normal((20_000, 100)).astype(np.float32)  # 8 MB
        for _ in range(3):
            Xt = connection.fit("StandardScaler", {}, "fit_transform", [X], {}).result
            np.testing.assert_allclose(Xt, StandardScaler().fit_transform(X), atol=1e-4)
        landing = connection.status()["landing"]
        assert landing["reused"] >= 3 and landing["pinned"] > 0
    finally:
        if connection is not None:
            connection.close()
        process.stop()
