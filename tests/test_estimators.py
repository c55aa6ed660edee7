"""The wrappers against direct scikit-learn: same results, same behaviour in model selection.

On the scikit-learn backend the bridged result must EQUAL direct scikit-learn
(built with cuML's defaults, which the wrappers carry). On cuML the same
tests compare within tolerance where the maths is the same (test_gpu.py
holds the cuML-specific ones).
"""

import pickle
import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pytest
from sklearn.base import clone, is_classifier
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_iris, make_classification
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.multiclass import OneVsOneClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.utils.multiclass import _ovr_decision_function

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUPCA, GPUSVC, GPUKMeans, GPULogisticRegression, GPUStandardScaler
from sklearn_gpu_bridge.errors import RemoteTraceback

from .conftest import BACKEND, assert_same

exact = pytest.mark.skipif(
    BACKEND != "sklearn",
    reason="exact equality holds on the scikit-learn backend; cuML differs in float32 and solvers",
)

X_IRIS, Y_IRIS = load_iris(return_X_y=True)
X_BC, Y_BC = load_breast_cancer(return_X_y=True)
X_BC = StandardScaler().fit_transform(X_BC)


@exact
def test_standard_scaler_equals_sklearn():
    bridged, direct = GPUStandardScaler().fit(X_IRIS), StandardScaler().fit(X_IRIS)
    assert_same(bridged.transform(X_IRIS), direct.transform(X_IRIS))
    assert_same(bridged.inverse_transform(X_IRIS), direct.inverse_transform(X_IRIS))
    assert_same(GPUStandardScaler().fit_transform(X_IRIS), direct.transform(X_IRIS))
    for name in ("mean_", "var_", "scale_", "n_samples_seen_"):
        assert_same(getattr(bridged, name), getattr(direct, name))


@exact
def test_pca_equals_sklearn():
    bridged, direct = GPUPCA(n_components=2).fit(X_BC), PCA(n_components=2).fit(X_BC)
    assert_same(bridged.transform(X_BC), direct.transform(X_BC))
    assert_same(bridged.inverse_transform(bridged.transform(X_BC)), direct.inverse_transform(direct.transform(X_BC)))
    assert_same(bridged.components_, direct.components_)
    assert_same(bridged.explained_variance_ratio_, direct.explained_variance_ratio_)
    assert list(bridged.get_feature_names_out()) == ["pca0", "pca1"]  # as scikit-learn's and cuML's PCA name them


@exact
@pytest.mark.parametrize("X, y", [(X_IRIS, Y_IRIS), (X_BC, Y_BC)], ids=["multiclass", "binary"])
def test_logistic_regression_equals_sklearn(X, y):
    bridged = GPULogisticRegression(C=0.5).fit(X, y)
    direct = LogisticRegression(C=0.5, max_iter=1000).fit(X, y)
    for method in ("predict", "predict_proba", "predict_log_proba", "decision_function"):
        assert_same(getattr(bridged, method)(X), getattr(direct, method)(X))
    assert_same(bridged.coef_, direct.coef_)
    assert_same(bridged.score(X, y), direct.score(X, y))


@exact
@pytest.mark.parametrize("X, y", [(X_IRIS, Y_IRIS), (X_BC, Y_BC)], ids=["multiclass", "binary"])
def test_svc_equals_sklearn(X, y):
    """Two classes: scikit-learn's SVC. More: cuML's way, one SVC per pair (OneVsOneClassifier), a column per class."""
    bridged = GPUSVC(C=10, gamma=0.1).fit(X, y)
    direct = SVC(C=10, gamma=0.1, cache_size=1024)
    direct = (direct if len(np.unique(y)) == 2 else OneVsOneClassifier(direct)).fit(X, y)
    assert_same(bridged.predict(X), direct.predict(X))
    assert_same(bridged.decision_function(X), direct.decision_function(X))
    if len(np.unique(y)) == 2:
        assert_same(bridged.support_vectors_, direct.support_vectors_)
    else:
        assert bridged.decision_function(X).shape == (len(X), 3)


@exact
def test_kmeans_equals_sklearn():
    bridged = GPUKMeans(n_clusters=3, random_state=0, n_init=1)
    direct = KMeans(n_clusters=3, random_state=0, n_init=1)
    assert_same(bridged.fit_predict(X_IRIS), direct.fit_predict(X_IRIS))
    assert_same(bridged.cluster_centers_, direct.cluster_centers_)
    assert_same(bridged.transform(X_IRIS), direct.transform(X_IRIS))
    assert_same(bridged.predict(X_IRIS), direct.predict(X_IRIS))
    assert_same(bridged.score(X_IRIS), direct.score(X_IRIS))
    assert_same(bridged.inertia_, direct.inertia_)


@pytest.mark.parametrize(
    "labels",
    [np.array(["setosa", "versicolor", "virginica"]), np.array([-5, 3, 10]), np.array([1.0, 2.0, 7.0])],
    ids=["str", "noncontiguous-int", "float"],
)
@pytest.mark.parametrize("Estimator", [GPUSVC, GPULogisticRegression])
def test_labels_come_back_as_given(Estimator, labels):
    y = labels[Y_IRIS]
    model = Estimator().fit(X_IRIS, y)
    np.testing.assert_array_equal(model.classes_, labels)
    predicted = model.predict(X_IRIS)
    assert predicted.dtype == y.dtype
    assert set(predicted) <= set(labels)
    assert (predicted == y).mean() > 0.9


@exact
@exact
def test_class_weight_keyed_by_user_labels():
    """As cuML: the class weights become sample weights, then one SVC per pair of classes is fitted."""
    y = np.array(["a", "b", "c"])[Y_IRIS]
    weights = {"a": 1.0, "b": 5.0, "c": 0.2}
    bridged = GPUSVC(class_weight=weights).fit(X_IRIS, y)
    sample_weight = np.array([weights[label] for label in y])
    pairs = [(i, j) for i in range(3) for j in range(i + 1, 3)]
    confidences = []
    for i, j in pairs:
        rows = (Y_IRIS == i) | (Y_IRIS == j)
        svc = SVC(cache_size=1024).fit(X_IRIS[rows], Y_IRIS[rows] == j, sample_weight=sample_weight[rows])
        confidences.append(svc.decision_function(X_IRIS))
    confidences = np.column_stack(confidences)
    assert_same(bridged.decision_function(X_IRIS), _ovr_decision_function((confidences >= 0).astype(int), confidences, 3))


def _pipelines(multiclass=False):
    bridged = Pipeline([("sc", GPUStandardScaler()), ("svm", GPUSVC())])
    svc = SVC(cache_size=1024)
    direct = Pipeline([("sc", StandardScaler()), ("svm", OneVsOneClassifier(svc) if multiclass else svc)])
    return bridged, direct


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_grid_search_on_pipeline(n_jobs):
    bridged, direct = _pipelines(multiclass=True)
    found = GridSearchCV(bridged, {"svm__C": [0.1, 1, 10]}, cv=3, n_jobs=n_jobs).fit(X_IRIS, Y_IRIS)
    expected = GridSearchCV(direct, {"svm__estimator__C": [0.1, 1, 10]}, cv=3).fit(X_IRIS, Y_IRIS)
    if BACKEND == "sklearn":
        assert found.best_params_["svm__C"] == expected.best_params_["svm__estimator__C"]
        assert_same(found.cv_results_["mean_test_score"], expected.cv_results_["mean_test_score"])
        assert_same(found.predict(X_IRIS), expected.predict(X_IRIS))
    else:  # float32 and another SMO: scores agree to a few points
        np.testing.assert_allclose(found.cv_results_["mean_test_score"],
                                   expected.cv_results_["mean_test_score"], atol=0.05)


def test_cross_val_score():
    bridged, direct = _pipelines()
    found, expected = cross_val_score(bridged, X_BC, Y_BC, cv=5), cross_val_score(direct, X_BC, Y_BC, cv=5)
    if BACKEND == "sklearn":
        assert_same(found, expected)
    else:
        np.testing.assert_allclose(found, expected, atol=0.05)


def test_clone_and_params():
    model = GPUSVC(C=3.0, kernel="linear").fit(X_IRIS, Y_IRIS)
    copy = clone(model)
    assert copy.get_params() == model.get_params()
    assert not copy.__sklearn_is_fitted__()
    assert is_classifier(copy)
    with pytest.raises(NotFittedError):
        copy.predict(X_IRIS)
    copy.set_params(C=0.5)
    assert copy.C == 0.5 and model.C == 3.0


def test_pickle_carries_state_not_handle():
    model = GPULogisticRegression().fit(X_IRIS, Y_IRIS)
    loaded = pickle.loads(pickle.dumps(model))
    assert "_remote" not in loaded.__dict__
    assert isinstance(loaded.sklearn_model_, LogisticRegression) or BACKEND == "cuml"
    assert_same(loaded.predict_proba(X_IRIS), model.predict_proba(X_IRIS))


def test_joblib_round_trip_in_new_process_with_new_worker(tmp_path, fresh_worker, worker):
    """Fit against one worker; load in a NEW process that talks to ANOTHER worker."""
    sklearn_gpu_bridge.reset_connection()
    from .conftest import use_worker

    use_worker(worker)
    bridged, _ = _pipelines()
    bridged.fit(X_IRIS, Y_IRIS)
    expected = bridged.predict(X_IRIS)
    joblib.dump(bridged, tmp_path / "model.joblib")
    np.save(tmp_path / "X.npy", X_IRIS)
    script = textwrap.dedent(f"""
        import joblib, numpy as np, sklearn_gpu_bridge
        sklearn_gpu_bridge.set_config(connection_file={str(fresh_worker.connection_file)!r},
                                      start_local_worker=False)
        model = joblib.load({str(tmp_path / "model.joblib")!r})
        np.save({str(tmp_path / "pred.npy")!r}, model.predict(np.load({str(tmp_path / "X.npy")!r})))
        print(sklearn_gpu_bridge.get_connection().status()["handles"])
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.split()[-1]) == 2  # both steps pushed their state to the new worker
    np.testing.assert_array_equal(np.load(tmp_path / "pred.npy"), expected)


def test_bad_input_fails_locally_with_sklearns_message(connection):
    model = GPUSVC().fit(X_IRIS, Y_IRIS)
    before = connection.status()["requests"].get("call", 0)
    with pytest.raises(ValueError, match="X has 3 features, but GPUSVC is expecting 4 features"):
        model.predict(X_IRIS[:, :3])
    with pytest.raises(ValueError, match="Input X contains NaN"):
        model.predict(np.full((2, 4), np.nan))
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        model.predict(X_IRIS[0])
    assert connection.status()["requests"].get("call", 0) == before  # nothing was sent


def test_remote_error_keeps_its_type_and_traceback():
    # scikit-learn: "number of classes has to be greater than one"; cuML: "... only 1 class"
    with pytest.raises(ValueError, match=r"\bclass") as info:
        GPUSVC().fit(X_IRIS, np.zeros(len(X_IRIS)))
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "Traceback" in info.value.__cause__.text


def test_handles_are_released_when_wrappers_die(connection):
    import gc

    baseline = connection.status()["handles"]
    for _ in range(20):
        GPUStandardScaler().fit(X_IRIS)
    gc.collect()
    assert connection.status()["handles"] <= baseline + 1  # the last one is released with the next request
    connection.status()
    assert connection.status()["handles"] == baseline


def test_large_arrays_use_the_pool():
    X = make_classification(n_samples=20000, n_features=40, random_state=0)[0]
    connection = sklearn_gpu_bridge.get_connection()
    before = connection.stats.copy()
    out = GPUStandardScaler().fit_transform(X)
    assert connection.stats["sent_pool"] == before["sent_pool"] + 1
    assert connection.stats["received_pool"] == before["received_pool"] + 1
    assert_same(out, StandardScaler().fit_transform(X).astype(out.dtype))


@pytest.mark.parametrize("y", [
    np.array([3, 1, 3, 7]), np.array([-128, 127, 0], np.int8), np.array([True, False, True]),
    np.array([2, 10**6, 5]), np.array([5]), np.arange(3000) * 7, np.array([0, 2**63 - 1]),
    np.array([2, 1], np.uint64), np.array(["b", "a", "b"]), np.array([0.0, 2.0, 1.0]),
    np.array([0, 1, 1, 0], np.int32), np.array([4, 3, 3]), np.zeros(3, np.uint8), np.array([1, 0, 1], np.uint32),
    np.array([-1, 0, 0], np.int16), np.array([False, False]),
], ids=lambda y: f"{y.dtype}-{y.size}-{y.flat[0]}")
def test_label_codes_are_numpy_unique_after_the_target_check(y):
    """The counting path for narrow integer labels gives exactly np.unique's classes and codes (as int32,
    the codes' travelling dtype)."""
    from sklearn_gpu_bridge.estimators.base import _classes_and_codes

    classes, codes = _classes_and_codes(y)
    expected_classes, expected_codes = np.unique(y, return_inverse=True)
    assert classes.dtype == expected_classes.dtype
    assert codes.dtype == np.int32
    np.testing.assert_array_equal(classes, expected_classes)
    np.testing.assert_array_equal(codes, expected_codes)


def test_continuous_targets_are_refused_with_scikit_learns_message():
    from sklearn_gpu_bridge.estimators.base import _classes_and_codes

    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        _classes_and_codes(np.array([0.5, 1.0, 2.0]))
