"""A saved model, loaded later: where it answers, and what it weighs.

- Loaded in a fresh process where no worker is configured (no ``connection_file``, no
  ``SKLEARN_GPU_BRIDGE_CONNECTION_FILE``) and none is running (no default connection file of a live
  worker, no local worker), a model that carries a portable form predicts in process with it, and
  starts no worker. One that carries none still finds or starts a worker; a running default worker
  is used as before.
- Saved, a fitted pipeline weighs about what scikit-learn's own does: a multiclass SVC's binary SVCs
  share their support vectors in the file instead of holding one copy each.
"""

import io
import json
import pickle
import shutil
import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits, load_iris
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from sklearn_gpu_bridge import GPUSVC, GPULogisticRegression, GPUStandardScaler
from sklearn_gpu_bridge.portable import CumlLikeSVC

from .conftest import BACKEND, assert_same, bare_env

X, Y = load_iris(return_X_y=True)
LABELS = np.array(["setosa", "versicolor", "virginica"])[Y]

# ---------------------------------------------------------------- where a loaded model answers

_LOAD_AND_PREDICT = textwrap.dedent("""
    import json, sys
    import joblib
    from sklearn_gpu_bridge.client import discovery
    from sklearn_gpu_bridge.runtime.private_files import runtime_folder

    model, X = joblib.load(sys.argv[1])
    local_worker = None
    if "--fit-first" in sys.argv:  # a local worker of this process tree runs, and this process holds no connection
        from sklearn_gpu_bridge import GPUStandardScaler, reset_connection
        GPUStandardScaler().fit(X)
        local_worker = discovery._connection.info.pid
        reset_connection()
    try:
        answers = {"predict": model.predict(X), "predict_proba": model.predict_proba(X)}
        error = None
    except Exception as exc:
        answers, error = None, f"{type(exc).__name__}: {exc}"
    joblib.dump(answers, sys.argv[1] + ".answers")
    connection = discovery._connection
    print(json.dumps({
        "connected_to": None if connection is None else connection.info.pid, "local_worker": local_worker,
        "local_workers": sorted(p.name for p in runtime_folder().glob("local-*.json")),
        "error": error,
    }))
""")


def _fresh_process(tmp_path, model, *options, **env):
    """Load ``model`` in a fresh Python whose user has nothing configured and no runtime files (a
    temporary HOME and XDG_RUNTIME_DIR); what it reports, and its answers (None where it raised)."""
    path = tmp_path / "model.joblib"
    joblib.dump((model, X), path)
    base = bare_env()
    base.update(HOME=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path / "run"), SKLEARN_GPU_BRIDGE_LOCAL_BACKEND="sklearn")
    (tmp_path / "run").mkdir(mode=0o700, exist_ok=True)
    run = subprocess.run([sys.executable, "-c", _LOAD_AND_PREDICT, str(path), *options], capture_output=True, text=True,
                         env={**base, **env}, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), joblib.load(str(path) + ".answers")


def _fitted():
    """A fitted pipeline whose state is on the client already (so it outlives its worker), and its answers."""
    model = make_pipeline(GPUStandardScaler(), GPULogisticRegression()).fit(X, LABELS)
    for step in model:
        step.sklearn_model_  # noqa: B018 - the read pulls the state
    return model, {"predict": model.predict(X), "predict_proba": model.predict_proba(X)}


def _same_answers(got, expected):
    np.testing.assert_array_equal(got["predict"], expected["predict"])
    if BACKEND == "sklearn":
        assert_same(got["predict_proba"], expected["predict_proba"])
    else:  # scikit-learn's float64 on cuML's fitted state, against cuML's float32 answers
        np.testing.assert_allclose(got["predict_proba"], expected["predict_proba"], atol=1e-3)


def _default_connection_file(tmp_path):
    """Where the fresh process looks for a worker by default (runtime.connection_file.default_connection_file)."""
    folder = tmp_path / "run" / "sklearn-gpu-bridge"
    folder.mkdir(parents=True, mode=0o700)
    return folder / "worker.json"


def test_a_loaded_model_predicts_in_process_where_no_worker_is_configured_or_running(tmp_path):
    model, expected = _fitted()
    report, answers = _fresh_process(tmp_path, model)
    assert report["error"] is None
    assert report["connected_to"] is None and report["local_workers"] == [], "a worker was started to predict"
    _same_answers(answers, expected)


def test_the_default_connection_file_of_a_stopped_worker_is_no_worker(tmp_path, fresh_worker):
    model, expected = _fitted()
    shutil.copy(fresh_worker.connection_file, _default_connection_file(tmp_path))
    fresh_worker.stop()
    report, answers = _fresh_process(tmp_path, model)
    assert report["error"] is None
    assert report["connected_to"] is None and report["local_workers"] == []
    _same_answers(answers, expected)


def test_a_loaded_model_uses_the_running_default_worker(tmp_path, worker, connection):
    model, expected = _fitted()
    shutil.copy(worker.connection_file, _default_connection_file(tmp_path))
    pushed = connection.status()["requests"].get("set_state", 0)
    report, answers = _fresh_process(tmp_path, model)
    assert report["error"] is None
    assert report["connected_to"] == worker.info.pid and report["local_workers"] == []
    assert connection.status()["requests"]["set_state"] == pushed + 2  # the scaler's state and the model's
    _same_answers(answers, expected)


def test_a_loaded_model_uses_the_running_local_worker_of_its_process_tree(tmp_path):
    model, expected = _fitted()
    report, answers = _fresh_process(tmp_path, model, "--fit-first")
    assert report["error"] is None
    assert report["connected_to"] == report["local_worker"] is not None and len(report["local_workers"]) == 1
    _same_answers(answers, expected)


def test_a_loaded_model_that_needs_a_worker_still_starts_one(tmp_path):
    """Without a portable form (here: only a cuML worker's own state) the model cannot answer in process:
    a local worker is started, as before, and says why it cannot take the model either."""
    model, _ = _fitted()
    classifier = model[-1]
    del classifier._sklearn_model
    classifier._backend_state = ("cuml", b"cuML's own pickle")
    report, answers = _fresh_process(tmp_path, model)
    assert answers is None and report["error"].startswith("TypeError") and "no portable form" in report["error"]
    assert report["connected_to"] is not None and len(report["local_workers"]) == 1


def test_a_loaded_model_in_a_configured_process_still_goes_to_its_worker(worker, connection):
    model, expected = _fitted()
    loaded = pickle.loads(pickle.dumps(model))
    pushed = connection.status()["requests"].get("set_state", 0)
    _same_answers({"predict": loaded.predict(X), "predict_proba": loaded.predict_proba(X)}, expected)
    assert connection.status()["requests"]["set_state"] == pushed + 2


# ---------------------------------------------------------------- what a saved model weighs


def _saved_bytes(model):
    buffer = io.BytesIO()
    joblib.dump(model, buffer)
    return len(buffer.getvalue())


@pytest.mark.skipif(BACKEND != "sklearn", reason="a cuML worker's multiclass SVC also carries cuML's own pickle "
                    "(docs/estimators.md, 'What a saved model weighs')")
def test_a_saved_pipeline_weighs_at_most_a_fifth_more_than_scikit_learns():
    X, y = load_digits(return_X_y=True)
    bridged = make_pipeline(GPUStandardScaler(), GPUSVC()).fit(X, y)
    own = make_pipeline(StandardScaler(), SVC()).fit(X, y)
    bridged_bytes, own_bytes = _saved_bytes(bridged), _saved_bytes(own)
    assert bridged_bytes <= 1.2 * own_bytes, (bridged_bytes, own_bytes)


def test_a_compact_multiclass_svc_predicts_the_same_loaded_with_scikit_learn_and_on_a_worker(connection):
    X, y = load_digits(return_X_y=True)
    model = GPUSVC().fit(X, y)
    expected = model.decision_function(X), model.predict(X)
    form = model.sklearn_model_
    loaded = pickle.loads(pickle.dumps(model))
    again = loaded.sklearn_model_
    assert len(again.estimators_) == len(form.estimators_) == 45
    for before, after in zip(form.estimators_, again.estimators_):
        assert after.support_vectors_.dtype == before.support_vectors_.dtype
        assert after.support_vectors_.flags.c_contiguous
        np.testing.assert_array_equal(after.support_vectors_, before.support_vectors_)
    # scikit-learn alone
    np.testing.assert_allclose(again.decision_function(X), form.decision_function(X), rtol=1e-12, atol=1e-12)
    pushed = connection.status()["requests"].get("set_state", 0)
    assert_same(loaded.decision_function(X), expected[0])  # its portable form pushed to the worker
    np.testing.assert_array_equal(loaded.predict(X), expected[1])
    assert connection.status()["requests"]["set_state"] == pushed + 1


@pytest.mark.parametrize("case", ["ovo", "ovr", "binary", "sparse", "float32"])
def test_a_cuml_like_svc_pickles_to_the_same_model(case):
    X, y = load_digits(n_class=2 if case == "binary" else 5, return_X_y=True)
    X = sp.csr_matrix(X) if case == "sparse" else X.astype(np.float32) if case == "float32" else X
    model = CumlLikeSVC(decision_function_shape="ovr" if case == "ovr" else "ovo").fit(X, y)
    if case == "float32":  # as a cuML worker's form may hold them
        for estimator in model.estimators_:
            estimator.support_vectors_ = estimator.support_vectors_.astype(np.float32)
    blob = pickle.dumps(model)
    loaded = pickle.loads(blob)
    assert model.__dict__.keys() == loaded.__dict__.keys()
    for before, after in zip(model.estimators_, loaded.estimators_):
        assert type(after) is type(before) and before.__dict__.keys() == after.__dict__.keys()
        if sp.issparse(before.support_vectors_):
            assert (before.support_vectors_ != after.support_vectors_).nnz == 0
        else:
            assert after.support_vectors_.dtype == before.support_vectors_.dtype
            np.testing.assert_array_equal(after.support_vectors_, before.support_vectors_)
    if case != "float32":  # scikit-learn's SVC predicts from float64 support vectors only
        np.testing.assert_allclose(loaded.decision_function(X), model.decision_function(X), rtol=1e-12, atol=1e-12)
    if case in ("ovo", "ovr"):
        copies = sum(len(e.support_vectors_) for e in model.estimators_)
        distinct = len(np.unique(np.concatenate([e.support_vectors_ for e in model.estimators_]), axis=0))
        assert copies > distinct
        assert len(blob) < len(pickle.dumps(model.estimators_)) * (distinct / copies + 0.1)
