"""One report of where the calls ran, across the processes joblib starts: ``sklearn_gpu_bridge.report()`` and
accel's ``-v``.

The calls go to the session's worker; joblib's children (loky) find it through the connection file in their
environment and append their calls to the report's folder, which the report reads.
"""

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV

import sklearn_gpu_bridge as sgb
from sklearn_gpu_bridge import ledger

GRID = {"C": [0.5, 1.0, 2.0]}


def _search(n_jobs):
    return GridSearchCV(sgb.GPUSVC(), GRID, cv=3, n_jobs=n_jobs)


def _processes():
    """joblib's processes (loky), chosen explicitly: a search of GPU* fits may otherwise run them in threads."""
    return joblib.parallel_config(backend="loky")


def _fits(connection):
    return connection.status()["requests"].get("fit", 0)


def test_a_search_with_n_jobs_reports_every_fit_with_the_processes_that_made_them(connection):
    X, y = make_classification(n_samples=240, n_features=6, random_state=0)
    before = _fits(connection)
    with sgb.report() as r, _processes():
        _search(n_jobs=2).fit(X, y)
    calls = r.calls()["GPUSVC.fit"]
    assert calls["worker"] == 3 * 3 + 1 == _fits(connection) - before  # every fold's fit and the refit
    assert calls["cpu"] == 0
    pids = {entry["pid"] for entry in r.records}
    assert os.getpid() in pids and len(pids) >= 2  # the refit here, the folds in joblib's children
    assert r.calls()["GPUSVC.predict"]["worker"] == 3 * 3  # the folds' scores, in the children
    assert all(entry["pid"] != os.getpid() for entry in r.records if entry["call"] == "GPUSVC.predict")
    label = calls["workers"][0]
    assert f"worker pid {connection.info.pid}" in label
    assert ("cuML" in label) == (connection.capabilities.backend == "cuml")


def test_the_report_says_how_long_the_worker_and_the_client_took_and_the_bytes_that_moved(connection):
    X, y = make_classification(n_samples=200, n_features=6, random_state=1)
    with sgb.report() as r:
        model = sgb.GPUSVC().fit(X, y)
        labels = model.predict(X)
    fit, predict = r.calls()["GPUSVC.fit"], r.calls()["GPUSVC.predict"]
    itemsize = np.dtype(connection.capabilities.float_dtype or X.dtype).itemsize
    assert fit["sent"] == X.size * itemsize + len(y) * 4  # X as it travels, the labels as int32 codes
    assert fit["received"] == 0  # a fit sends back a handle
    assert predict["sent"] == X.size * itemsize and predict["received"] >= len(labels)
    for row in (fit, predict):
        assert row["requests"] == 1 and 0 <= row["worker_s"] <= row["client_s"]  # the worker's span, within ours


def test_the_table_names_each_call_the_worker_and_the_processes(connection):
    X, y = make_classification(n_samples=120, n_features=4, random_state=2)
    with sgb.report() as r:
        sgb.GPUStandardScaler().fit_transform(X)
        sgb.GPULogisticRegression().fit(X, y)
    text = str(r)
    lines = text.splitlines()
    assert lines[0].startswith("sklearn-gpu-bridge: 2 calls recorded, in 1 process (pid ")
    assert lines[1].startswith("  w1 = ") and f"worker pid {connection.info.pid}" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[4:]}
    assert set(rows) == {"GPUStandardScaler.fit_transform", "GPULogisticRegression.fit"}
    assert [rows["GPULogisticRegression.fit"][i] for i in (1, 2, 3)] == ["1", "0", "1"]  # worker, CPU, processes
    assert "served on the worker" in text


def test_calls_outside_the_block_are_not_in_it_and_nothing_is_left_behind(connection):
    X, y = make_classification(n_samples=100, n_features=4, random_state=3)
    model = sgb.GPUSVC().fit(X, y)
    with sgb.report() as r:
        folder = Path(r._folder)
        assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
        model.predict(X)
    model.predict(X)
    assert [entry["call"] for entry in r.records] == ["GPUSVC.predict"]
    assert not folder.exists() and not ledger.recording()
    assert "1 calls recorded" in str(r)  # what the block recorded stays


def test_children_started_before_the_report_are_counted_too(connection):
    """joblib keeps its processes for the next search: they know the report's folder from their start."""
    X, y = make_classification(n_samples=150, n_features=5, random_state=4)
    with _processes():
        _search(n_jobs=2).fit(X, y)  # starts joblib's processes, before any report
    with sgb.report() as r, _processes():
        _search(n_jobs=2).fit(X, y)
    assert r.calls()["GPUSVC.fit"]["worker"] == 3 * 3 + 1
    assert len({entry["pid"] for entry in r.records}) >= 2


def test_a_model_answering_with_its_portable_form_is_a_cpu_call_and_says_why(connection, tmp_path):
    X, y = make_classification(n_samples=100, n_features=4, random_state=5)
    loaded = pickle.loads(pickle.dumps(sgb.GPULogisticRegression().fit(X, y)))
    with sgb.report() as r, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sgb.config_context(connection_file=str(tmp_path / "none.json"), start_local_worker=False,
                                cpu_fallback=True):
            sgb.reset_connection()
            loaded.predict(X)
    sgb.reset_connection()
    row = r.calls()["GPULogisticRegression.predict"]
    assert (row["worker"], row["cpu"], row["requests"]) == (0, 1, 0)
    assert "portable form" in next(iter(row["reasons"]))


def test_reports_nest_and_each_keeps_its_own_calls(connection):
    X, y = make_classification(n_samples=100, n_features=4, random_state=6)
    with sgb.report() as outer:
        model = sgb.GPUSVC().fit(X, y)
        with sgb.report() as inner:
            model.predict(X)
        model.predict(X)
    assert [entry["call"] for entry in inner.records] == ["GPUSVC.predict"]
    assert [entry["call"] for entry in outer.records] == ["GPUSVC.fit", "GPUSVC.predict", "GPUSVC.predict"]


def test_threads_of_one_search_each_count_their_own_requests(connection):
    X, y = make_classification(n_samples=150, n_features=5, random_state=9)
    with sgb.report() as r, joblib.parallel_config(backend="threading", n_jobs=3):
        _search(n_jobs=3).fit(X, y)
    fits = [entry for entry in r.records if entry["call"] == "GPUSVC.fit"]
    assert len(fits) == 3 * 3 + 1 and {entry["pid"] for entry in fits} == {os.getpid()}
    assert all(entry["requests"] == 1 and entry["sent"] > 0 for entry in r.records)  # none took another's


def test_nothing_is_recorded_without_a_report(connection):
    X, y = make_classification(n_samples=60, n_features=4, random_state=7)
    sgb.GPUSVC().fit(X, y)
    assert not ledger.recording() and not ledger._records


# ---------------------------------------------------------------- accel's -v, across joblib's processes

ACCEL_SCRIPT = textwrap.dedent("""
    import joblib
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    X, y = make_classification(n_samples=300, n_features=8, random_state=0)
    with joblib.parallel_config(backend="loky"):  # processes, as joblib's default: what -v must see into
        search = GridSearchCV(LogisticRegression(), {"C": [0.5, 1.0, 2.0]}, cv=2, n_jobs=2).fit(X, y)
    print(search.best_params_)
""")


def test_accel_v_counts_the_calls_of_joblibs_processes(tmp_path, connection):
    (tmp_path / "script.py").write_text(ACCEL_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge.accel", "-v", "script.py"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    text = run.stderr[run.stderr.index("sklearn-gpu-bridge.accel: "):]
    head, table = text[:text.index("call ")], text[text.index("call "):].splitlines()[2:]
    rows = {line.split()[0]: line.split() for line in table}
    assert rows["LogisticRegression.fit"][1:4] == ["7", "0", rows["LogisticRegression.fit"][3]]  # 3 x 2 + refit
    assert int(rows["LogisticRegression.fit"][3]) >= 2  # in this process and in joblib's
    assert rows["LogisticRegression.predict"][1] == "6"  # the folds' scores, all in joblib's processes
    assert rows["GridSearchCV.fit"][1:3] == ["0", "1"]
    assert f"worker pid {connection.info.pid}" in head and "(this one)" in head


@pytest.fixture
def dask_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def test_dask_workers_of_this_host_report_their_calls(dask_client, connection):
    import joblib

    X, y = make_classification(n_samples=120, n_features=5, random_state=8)
    with sgb.report() as r, joblib.parallel_config(backend="dask"):
        _search(n_jobs=-1).fit(X, y)
    dask_pids = set(dask_client.run(os.getpid).values())
    fits = [entry for entry in r.records if entry["call"] == "GPUSVC.fit"]
    assert len(fits) == 3 * 3 + 1
    assert {entry["pid"] for entry in fits} - {os.getpid()} <= dask_pids
    assert {entry["pid"] for entry in fits} & dask_pids  # the folds ran there, and are here


def test_calls_run_in_this_process_are_named_so_and_move_no_bytes(worker):
    """Execution in process (a dask-cuda worker's way): the report names this process, and nothing travels."""
    from sklearn_gpu_bridge.client import Connection, discovery
    from sklearn_gpu_bridge.transport.inprocess import InProcessTransport

    X, y = make_classification(n_samples=80, n_features=4, random_state=10)
    discovery.reset_connection()
    discovery._connection = Connection(InProcessTransport(backend="sklearn"))
    try:
        with sgb.report() as r:
            sgb.GPULogisticRegression().fit(X, y).predict(X)
    finally:
        discovery.reset_connection()
    rows = r.calls()
    assert rows["GPULogisticRegression.fit"]["worker"] == rows["GPULogisticRegression.predict"]["worker"] == 1
    for row in rows.values():
        assert row["sent"] == row["received"] == 0 and row["worker_s"] == row["client_s"] > 0
        assert row["workers"] == [f"the CPU (scikit-learn); in process {os.getpid()} on {socket.gethostname()}"]


def test_a_link_in_the_report_folder_is_neither_written_through_nor_read(tmp_path, monkeypatch):
    """The report folder is private, but its files are opened as if it were not: a symbolic link planted as this
    process's file (``<pid>.jsonl``) is not written through, and one planted as another process's file, or a
    file others may write, is not read into the report."""
    monkeypatch.setattr(ledger, "_child_file", None)  # this process's records file, as the test found it after
    folder = tmp_path / "report"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("unchanged\n")
    (folder / f"{os.getpid()}.jsonl").symlink_to(victim)
    entry = {"call": "GPUSVC.fit", "where": "worker", "pid": 1, "t": 0.0}
    ledger._append(str(folder), entry)
    assert victim.read_text() == "unchanged\n"

    planted = tmp_path / "planted.jsonl"
    planted.write_text(f"{json.dumps(entry)}\n")
    planted.chmod(0o600)
    (folder / "999999.jsonl").symlink_to(planted)
    shared = folder / "999998.jsonl"
    shared.write_text(f"{json.dumps(entry)}\n")
    shared.chmod(0o666)
    assert ledger._read_folder(str(folder)) == []
    shared.chmod(0o600)  # the same file, the user's alone: read
    assert ledger._read_folder(str(folder)) == [entry]


@pytest.mark.parametrize("token", ["1-../../../tmp/elsewhere", "1-/tmp/elsewhere", "1-" + "a" * 11, "x-0123456789ab"])
def test_a_report_name_from_the_environment_is_a_name_and_nothing_else(token, tmp_path):
    """A child finds its parent's report folder by the name in ``SKLEARN_GPU_BRIDGE_REPORT``: a name that is not
    ``<pid>-<12 hex digits>`` (a path, ``..``) is not followed; the child makes a report tree of its own."""
    code = textwrap.dedent("""
        import os, sys
        from sklearn_gpu_bridge import ledger
        print(ledger._child_folder(), os.environ[ledger.ENV_REPORT] != sys.argv[1])
    """)
    env = {**os.environ, ledger.ENV_REPORT: token, "XDG_RUNTIME_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code, token], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "True"]
    assert not (tmp_path / "elsewhere").exists()
