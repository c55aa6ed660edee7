"""Searches over a Dask cluster through joblib's dask backend: the same answer as in one process, every
fit on the cluster's workers.

A CPU ``LocalCluster`` of two worker processes (no GPU here): each Dask worker
has no cuML, so its wrappers go through a bridge worker of their own, as they
would on any machine without cuML. On the GPU machine benchmarks/dask_grid.py
does the same on a ``LocalCUDACluster`` with cuML in each worker's process.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

import sklearn_gpu_bridge as sgb

distributed = pytest.importorskip("distributed")

GRID = {"svm__C": [0.1, 1, 10]}


def _record_where(record_dir):
    """A scorer that writes down the process it ran in (it runs in the same task as the fit)."""

    def score(estimator, X, y):
        from sklearn_gpu_bridge import execution_mode

        line = {"pid": os.getpid(), "mode": execution_mode()["mode"]}
        with open(Path(record_dir) / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return float((estimator.predict(X) == y).mean())

    return score


def _search(scoring=None, n_jobs=None):
    return GridSearchCV(Pipeline([("sc", sgb.GPUStandardScaler()), ("svm", sgb.GPUSVC())]), GRID, cv=3,
                        scoring=scoring, n_jobs=n_jobs)


@pytest.fixture(scope="module")
def dask_client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def test_a_search_on_the_cluster_matches_the_sequential_one_and_runs_every_fit_there(dask_client, tmp_path):
    X, y = make_classification(300, 8, n_informative=5, random_state=0)
    sequential = _search().fit(X, y)
    record = tmp_path / "where"
    record.mkdir()
    with joblib.parallel_config(backend="dask", scatter=[X, y]):
        distributed_search = _search(scoring=_record_where(record), n_jobs=-1).fit(X, y)
    np.testing.assert_allclose(distributed_search.cv_results_["mean_test_score"],
                               sequential.cv_results_["mean_test_score"], rtol=1e-6, atol=1e-9)
    assert distributed_search.best_params_ == sequential.best_params_
    where = [json.loads(line) for path in record.glob("*.jsonl") for line in path.read_text().splitlines()]
    workers = set(dask_client.run(os.getpid).values())
    assert len(where) == 3 * len(GRID["svm__C"])  # one scoring per fit (the refit is scored by no one)
    assert {line["pid"] for line in where} <= workers and os.getpid() not in {line["pid"] for line in where}
    assert {line["mode"] for line in where} == {"worker"}  # no cuML in these workers: through a bridge worker


def test_every_task_of_the_search_ran_on_the_cluster(dask_client):
    """The task stream lists the search's tasks, each on one of the two workers."""
    X, y = make_classification(200, 6, random_state=1)
    with distributed.get_task_stream(client=dask_client) as stream:
        with joblib.parallel_config(backend="dask"):
            _search(n_jobs=-1).fit(X, y)
    workers = set(dask_client.scheduler_info()["workers"])
    fits = [t for t in stream.data if "fit_and_score" in str(t.get("key"))]  # joblib sends them in batches
    assert fits and {t["worker"] for t in fits} <= workers


def test_each_worker_says_where_its_calls_run(dask_client):
    modes = dask_client.run(sgb.execution_mode)
    assert len(modes) == 2
    assert all(mode["mode"] == "worker" and "has no cuML" in mode["reason"] for mode in modes.values())


def _certificates(folder):
    """A private CA and one certificate it signed (docs/scale-out.md's openssl commands, as written there)."""
    commands = [
        "openssl req -x509 -nodes -newkey rsa:2048 -days 2 -subj /CN=sgb-test-ca -keyout ca.key -out ca.pem",
        "openssl req -nodes -newkey rsa:2048 -subj /CN=sgb-cluster -keyout node.key -out node.csr",
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out node.pem",
    ]
    for command in commands:
        subprocess.run(command.split(), cwd=folder, check=True, capture_output=True, timeout=60)
    for name in ("ca.key", "node.key"):
        (folder / name).chmod(0o600)
    return {name: str(folder / f"{name}") for name in ("ca.pem", "node.pem", "node.key")}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_tls_recipe_scheduler_and_worker_from_dasks_cli_and_a_client_with_certificates(tmp_path):
    """docs/scale-out.md on CPUs: `dask scheduler` and `dask worker` over tls:// (as `dask cuda worker`
    takes the same --tls-* options), a search from a client holding the certificate; a client without
    one is refused."""
    certs = _certificates(tmp_path)
    tls = ["--tls-ca-file", certs["ca.pem"], "--tls-cert", certs["node.pem"], "--tls-key", certs["node.key"]]
    scheduler_file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen([*dask, "--protocol", "tls", "--port", "0", "--no-dashboard", "--scheduler-file",
                                  str(scheduler_file), *tls], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                   str(scheduler_file), "--nthreads", "1", "--no-dashboard", *tls],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tls://")
        security = distributed.security.Security(tls_ca_file=certs["ca.pem"], tls_client_cert=certs["node.pem"],
                                                 tls_client_key=certs["node.key"], require_encryption=True)
        X, y = make_classification(200, 6, random_state=2)
        with distributed.Client(address, security=security, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with joblib.parallel_config(backend="dask"):
                search = _search(n_jobs=-1).fit(X, y)
        np.testing.assert_allclose(search.cv_results_["mean_test_score"],
                                   _search().fit(X, y).cv_results_["mean_test_score"], rtol=1e-6, atol=1e-9)
        # a peer with a certificate of its own CA (it knows the cluster's CA): the scheduler refuses the handshake
        (tmp_path / "stranger").mkdir()
        own = _certificates(tmp_path / "stranger")
        stranger = distributed.security.Security(tls_ca_file=certs["ca.pem"], tls_client_cert=own["node.pem"],
                                                 tls_client_key=own["node.key"], require_encryption=True)
        with pytest.raises((OSError, TimeoutError)):
            distributed.Client(address, security=stranger, timeout=5)
    finally:
        for process in (worker, scheduler):
            if process is not None:
                process.terminate()
                process.wait(30)


def test_x_and_y_reach_the_cluster_once_per_search_not_once_per_fit(dask_client, monkeypatch):
    """joblib's dask backend scatters an argument over 1 kB once per search (with or without
    ``scatter=``); the fits then read it on the workers. Counted at the real Client.scatter."""
    X, y = make_classification(2000, 50, random_state=3)  # 800 kB
    scattered = []
    real = distributed.Client.scatter

    def counting(self, data, *args, **kwargs):
        scattered.append(data)
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(distributed.Client, "scatter", counting)
    with distributed.get_task_stream(client=dask_client) as stream:
        with joblib.parallel_config(backend="dask"):
            _search(n_jobs=-1).fit(X, y)
    fits = [t for t in stream.data if "fit_and_score" in str(t.get("key"))]
    sent_x = [d for d in scattered if isinstance(d, np.ndarray) and d.shape == X.shape]
    assert len(fits) >= 2 and len(sent_x) == 1
