"""Choosing the path of bulk arrays: the setting, the measurement, and what the client does with them."""

import json

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge.manage import transport_select
from sklearn_gpu_bridge.manage.measure import measure
from sklearn_gpu_bridge.manage.state_file import update_state
from sklearn_gpu_bridge.runtime.connection_file import read_connection_file
from sklearn_gpu_bridge.shm.pool import default_directory


@pytest.fixture
def fake_worker_file(tmp_path):
    """A connection file (no worker behind it: resolution only reads files)."""
    path = tmp_path / "worker.json"
    path.write_text(json.dumps({"address": "tcp://127.0.0.1:5555", "key": "ab" * 32, "protocol_version": 1,
                                "pid": 4242, "backend": "cuml"}))
    path.chmod(0o600)  # as a worker writes it: a file others may read is not read
    return path


def _record(path, choice, pool_directory, pid=4242, results=()):
    update_state(path, transport={
        "choice": choice, "pool_directory": pool_directory, "measured_at": "then",
        "worker": {"address": "tcp://127.0.0.1:5555", "pid": pid}, "results": list(results),
    })


def _pool(path, **settings):
    with sklearn_gpu_bridge.config_context(connection_file=str(path), **settings):
        pool, pool_directory, _ = transport_select.client_transport()
    return pool, pool_directory


def test_frames_turns_the_pool_off(fake_worker_file, monkeypatch):
    assert _pool(fake_worker_file, transport="frames") == ("off", None)
    monkeypatch.setenv("SKLEARN_GPU_BRIDGE_TRANSPORT", "frames")
    assert _pool(fake_worker_file) == ("off", None)


def test_auto_without_a_measurement_changes_nothing(fake_worker_file):
    assert _pool(fake_worker_file) == ("auto", None)
    assert _pool(fake_worker_file, pool="off") == ("off", None)


def test_auto_follows_the_measurement_of_the_worker_running_now(fake_worker_file, tmp_path):
    _record(fake_worker_file, "frames", None)
    assert _pool(fake_worker_file) == ("off", None)
    _record(fake_worker_file, "windows-disk", str(tmp_path / "pool"))
    assert _pool(fake_worker_file) == ("auto", str(tmp_path / "pool"))
    _record(fake_worker_file, "frames", None, pid=1)  # measured against an earlier worker: ignored
    assert _pool(fake_worker_file) == ("auto", None)


def test_explicit_settings_beat_the_measurement(fake_worker_file, tmp_path, monkeypatch):
    _record(fake_worker_file, "frames", None)
    assert _pool(fake_worker_file, pool_directory=str(tmp_path)) == ("auto", str(tmp_path))
    monkeypatch.setenv("SKLEARN_GPU_BRIDGE_POOL", "auto")
    assert _pool(fake_worker_file) == ("auto", None)


def test_pool_uses_the_fastest_coherent_folder_else_the_one_start_set_up(fake_worker_file, tmp_path):
    update_state(fake_worker_file, pool_candidates=[{"name": "windows-disk", "client": "C:\\pool",
                                                               "worker": "/mnt/c/pool"}])
    assert _pool(fake_worker_file, transport="pool") == ("auto", "C:\\pool")
    _record(fake_worker_file, "frames", None, results=[
        {"name": "frames", "pool_directory": None, "coherent": True, "mb_per_s": 1400},
        {"name": "windows-disk", "pool_directory": "C:\\pool", "coherent": False},
        {"name": "wsl-disk", "pool_directory": "\\\\wsl.localhost\\U\\p", "coherent": True, "mb_per_s": 40},
    ])
    assert _pool(fake_worker_file, transport="pool") == ("auto", "\\\\wsl.localhost\\U\\p")
    assert _pool(fake_worker_file, transport="pool", pool_directory=str(tmp_path)) == ("auto", str(tmp_path))


def test_a_bad_transport_is_a_clear_error(fake_worker_file):
    with pytest.raises(ValueError, match="transport must be one of auto, pool, frames"):
        _pool(fake_worker_file, transport="carrier-pigeon")


def test_choose_prefers_frames_unless_a_pool_is_clearly_faster():
    frames = {"name": "frames", "pool_directory": None, "available": True, "coherent": True, "mb_per_s": 1000}
    pool = {"name": "shm", "pool_directory": "/dev/shm", "available": True, "coherent": True, "mb_per_s": 1050}
    stale = {"name": "windows-disk", "pool_directory": "C:\\p", "available": True, "coherent": False}
    assert transport_select.choose([frames, pool, stale]) is frames  # within 10%: the simpler path
    pool["mb_per_s"] = 5000
    assert transport_select.choose([frames, pool, stale]) is pool
    assert transport_select.choose([stale]) is None
    assert transport_select.choose([dict(stale, coherent=True, mb_per_s=9e9, available=False)]) is None


def test_measure_against_a_real_worker_checks_every_byte(worker, tmp_path):
    info = read_connection_file(worker.connection_file)
    candidates = [("frames", None), ("default", None), ("folder", default_directory()), ("unseen", str(tmp_path))]
    results = measure(info, worker.connection_file, candidates, quick=True)
    by_name = {r["name"]: r for r in results}
    assert by_name["frames"]["coherent"] and by_name["frames"]["path"] == "frame"
    assert by_name["default"]["coherent"] and by_name["default"]["path"] == "pool"
    assert by_name["folder"]["coherent"] and by_name["folder"]["path"] == "pool"
    assert by_name["frames"]["mb_per_s"] > 0 and by_name["frames"]["latency_ms"] > 0
    assert not by_name["unseen"]["available"] and "--pool-dir" in by_name["unseen"]["why"]
    assert transport_select.choose(results)["name"] in ("frames", "default", "folder")
    assert np.isfinite(by_name["default"]["mb_per_s"])
