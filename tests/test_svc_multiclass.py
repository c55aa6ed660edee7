"""scikit-learn's multiclass SVC from the worker's binary SVCs: accel serves it, GPUSVC offers it.

The worker fits one binary SVC per pair of classes (cuML's on a GPU, scikit-learn's on the CPU backend)
and answers as scikit-learn's SVC (libsvm's one-vs-one): pairwise decision values, their "ovr" columns,
votes. On the scikit-learn backend every answer equals scikit-learn's SVC to a few ULPs (the pairs are
the very problems libsvm solves); on cuML, predictions nearly all and decision values within the
solvers' tolerance.
"""

import pickle

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_iris, make_classification
from sklearn.metrics.pairwise import linear_kernel
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC
from sklearn.utils.estimator_checks import parametrize_with_checks

from sklearn_gpu_bridge import GPUSVC, accel
from sklearn_gpu_bridge.accel import report

from .conftest import BACKEND, assert_ulps

X_DIGITS, Y_DIGITS = load_digits(return_X_y=True)
X_IRIS, Y_IRIS = load_iris(return_X_y=True)


def answers(model, X):
    return model.predict(X), model.decision_function(X)


def assert_like_sklearn(bridged, expected, X):
    """Predictions and decision values (``expected``: scikit-learn's, :func:`answers`): to a few ULPs on the
    scikit-learn backend; on cuML, 99.5% of the labels and decision values within the solvers' tolerance."""
    (predicted, scores), (expected, expected_scores) = answers(bridged, X), expected
    assert scores.shape == expected_scores.shape
    if BACKEND == "sklearn":
        np.testing.assert_array_equal(predicted, expected)
        assert_ulps(scores, expected_scores)
    else:
        assert (predicted == expected).mean() >= 0.995
        np.testing.assert_allclose(scores, expected_scores, rtol=2e-2, atol=2e-2)


def _served(call):
    counts = report.calls()[call]
    return counts["worker"], counts["cpu"]


# ---------------------------------------------------------------- accel: scikit-learn's SVC, served


@pytest.mark.parametrize("shape", ["ovr", "ovo"])
def test_accel_serves_a_multiclass_svc_with_scikit_learns_answers(accelerated, connection, shape):
    accel.uninstall()
    direct = SVC(decision_function_shape=shape).fit(X_DIGITS, Y_DIGITS)
    expected = answers(direct, X_DIGITS)
    accel.install()
    before = connection.status()["requests"].get("fit", 0)
    served = SVC(decision_function_shape=shape).fit(X_DIGITS, Y_DIGITS)
    assert connection.status()["requests"].get("fit", 0) == before + 1
    assert _served("SVC.fit") == (1, 0)
    assert type(served) is SVC and served.decision_function(X_DIGITS).shape[1] == (10 if shape == "ovr" else 45)
    assert_like_sklearn(served, expected, X_DIGITS)
    assert _served("SVC.predict") == (1, 0) and _served("SVC.decision_function") == (2, 0)
    # its fitted state is scikit-learn's SVC, libsvm's layout: it predicts the same without accel or a worker
    if BACKEND == "sklearn":
        np.testing.assert_array_equal(served.support_, direct.support_)
        np.testing.assert_array_equal(served.n_support_, direct.n_support_)
        assert_ulps(served.dual_coef_, direct.dual_coef_)
        assert_ulps(served.intercept_, direct.intercept_)
    on_worker = answers(served, X_DIGITS)
    accel.uninstall()
    loaded = pickle.loads(pickle.dumps(served))
    assert type(loaded) is SVC
    np.testing.assert_allclose(loaded.decision_function(X_DIGITS), on_worker[1], rtol=1e-5, atol=1e-5)
    assert (loaded.predict(X_DIGITS) == on_worker[0]).mean() >= 0.999


def test_accel_multiclass_svc_takes_labels_weights_and_a_precomputed_kernel(accelerated):
    labels = np.array(["setosa", "versicolor", "virginica"])[Y_IRIS]
    weights = np.linspace(0.5, 2.0, len(labels))
    cases = [
        ({"class_weight": "balanced"}, X_IRIS, {}),
        ({"class_weight": {"setosa": 3.0, "virginica": 0.5}, "C": 2.0}, X_IRIS, {"sample_weight": weights}),
        ({"kernel": "precomputed"}, X_IRIS @ X_IRIS.T, {}),
        ({"kernel": "poly", "degree": 2, "gamma": "auto", "break_ties": True}, X_IRIS, {}),
    ]
    for params, X, fit_kwargs in cases:
        served = SVC(**params).fit(X, labels, **fit_kwargs)
        accel.uninstall()
        expected = answers(SVC(**params).fit(X, labels, **fit_kwargs), X)
        accel.install()
        assert list(served.classes_) == ["setosa", "versicolor", "virginica"]
        assert_like_sklearn(served, expected, X)
    assert _served("SVC.fit") == (len(cases), 0)


def test_accel_leaves_to_the_cpu_what_the_pairs_cannot_give_and_says_why(accelerated):
    served = SVC(kernel=linear_kernel).fit(X_IRIS, Y_IRIS)  # a callable kernel: not by name on the worker
    assert _served("SVC.fit") == (0, 1)
    reason = next(iter(report.calls()["SVC.fit"]["reasons"]))
    assert reason.startswith("refused by the worker: ") and "callable kernel" in reason, reason
    accel.uninstall()
    np.testing.assert_array_equal(served.predict(X_IRIS), SVC(kernel=linear_kernel).fit(X_IRIS, Y_IRIS).predict(X_IRIS))


def test_a_grid_search_over_svc_on_digits_runs_every_fit_on_the_worker(accelerated, connection):
    grid = {"C": [0.5, 1.0, 5.0]}
    before = connection.status()["requests"].get("fit", 0)
    served = GridSearchCV(SVC(), grid, cv=3).fit(X_DIGITS, Y_DIGITS)
    assert connection.status()["requests"].get("fit", 0) - before == 3 * 3 + 1
    assert _served("SVC.fit") == (3 * 3 + 1, 0)
    assert _served("SVC.predict") == (3 * 3, 0)  # each fold's score
    assert "SVC.fit" in report.table() and "served on the worker" in report.table()
    accel.uninstall()
    direct = GridSearchCV(SVC(), grid, cv=3).fit(X_DIGITS, Y_DIGITS)
    if BACKEND == "sklearn":
        assert served.best_params_ == direct.best_params_
        np.testing.assert_allclose(served.cv_results_["mean_test_score"], direct.cv_results_["mean_test_score"],
                                   rtol=1e-12)
    else:
        np.testing.assert_allclose(served.cv_results_["mean_test_score"], direct.cv_results_["mean_test_score"],
                                   atol=0.01)


# ---------------------------------------------------------------- GPUSVC(multiclass="sklearn")


@pytest.mark.parametrize("params", [{"decision_function_shape": "ovo"}, {"decision_function_shape": "ovr"},
                                    {"decision_function_shape": "ovr", "break_ties": True, "C": 3.0}],
                         ids=["ovo", "ovr", "ovr-break-ties"])
def test_gpusvc_answers_as_scikit_learns_svc_on_digits(params):
    bridged = GPUSVC(multiclass="sklearn", **params).fit(X_DIGITS, Y_DIGITS)
    direct = SVC(**params).fit(X_DIGITS, Y_DIGITS)
    assert_like_sklearn(bridged, answers(direct, X_DIGITS), X_DIGITS)
    model = bridged.sklearn_model_  # scikit-learn's own class, which predicts what the worker does
    assert type(model) is SVC and model.decision_function_shape == params["decision_function_shape"]
    assert model.n_support_.sum() == len(model.support_) == len(model.support_vectors_)
    np.testing.assert_allclose(model.decision_function(X_DIGITS), bridged.decision_function(X_DIGITS),
                               rtol=1e-5, atol=1e-5)
    loaded = pickle.loads(pickle.dumps(bridged))
    np.testing.assert_array_equal(loaded.predict(X_DIGITS), bridged.predict(X_DIGITS))


def test_gpusvc_ties_go_to_the_lowest_class_as_libsvms_votes():
    """Noise in five classes: many samples get as many votes for two classes; libsvm picks the lower one."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 4)), rng.integers(0, 5, 300)
    bridged = GPUSVC(multiclass="sklearn", C=0.5).fit(X, y)
    direct = SVC(C=0.5, decision_function_shape="ovo").fit(X, y)
    X = rng.standard_normal((2000, 4))
    dec = direct.decision_function(X)
    votes = np.zeros((len(X), 5), dtype=int)
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    for column, (i, j) in enumerate(pairs):
        votes[:, i] += dec[:, column] > 0
        votes[:, j] += dec[:, column] <= 0
    tied = (votes == votes.max(axis=1, keepdims=True)).sum(axis=1) > 1
    assert tied.sum() >= 20, tied.sum()  # the data has ties to break
    np.testing.assert_array_equal(direct.predict(X), np.argmax(votes, axis=1))
    predicted = bridged.predict(X)
    if BACKEND == "sklearn":  # each pair fitted on its own: a decision value within a few ULPs of 0 may vote apart
        clear = np.abs(dec).min(axis=1) > 1e-9
        assert clear.mean() > 0.99
        np.testing.assert_array_equal(predicted[clear], direct.predict(X)[clear])
    else:
        assert (predicted == direct.predict(X)).mean() >= 0.95


def test_gpusvc_class_and_sample_weights_as_libsvm_applies_them():
    y = np.array(["a", "b", "c"])[Y_IRIS]
    weights = np.linspace(0.2, 3.0, len(y))
    bridged = GPUSVC(multiclass="sklearn", class_weight={"a": 1.0, "b": 5.0, "c": 0.2}, decision_function_shape="ovr")
    direct = SVC(class_weight={"a": 1.0, "b": 5.0, "c": 0.2}, cache_size=1024)
    expected = answers(direct.fit(X_IRIS, y, sample_weight=weights), X_IRIS)
    assert_like_sklearn(bridged.fit(X_IRIS, y, sample_weight=weights), expected, X_IRIS)


def test_gpusvc_of_two_classes_answers_as_before():
    X, y = make_classification(200, 6, random_state=0)
    own, cumls = GPUSVC(multiclass="sklearn").fit(X, y), GPUSVC().fit(X, y)
    np.testing.assert_allclose(own.decision_function(X), cumls.decision_function(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(own.predict(X), cumls.predict(X))


def test_gpusvc_cuml_multiclass_is_left_as_it_was():
    bridged = GPUSVC().fit(X_IRIS, Y_IRIS)
    assert bridged.decision_function(X_IRIS).shape == (len(X_IRIS), 3)  # cuML's: a column per class
    assert type(bridged.sklearn_model_).__name__ == "CumlLikeSVC"


@pytest.mark.parametrize("params, message", [
    ({"multiclass": "libsvm"}, "multiclass must be one of"),
    ({"break_ties": True}, "break_ties=True is scikit-learn's: it needs multiclass='sklearn'"),
])
def test_gpusvc_refuses_what_it_cannot_answer_before_sending_anything(connection, params, message):
    before = connection.status()["requests"].get("fit", 0)
    with pytest.raises(ValueError, match=message):
        GPUSVC(**params).fit(X_IRIS, Y_IRIS)
    assert connection.status()["requests"].get("fit", 0) == before


def test_gpusvc_break_ties_with_ovo_is_scikit_learns_error_at_predict():
    model = GPUSVC(multiclass="sklearn", break_ties=True).fit(X_IRIS, Y_IRIS)  # ovo: cuML's default
    with pytest.raises(ValueError, match="break_ties must be False when decision_function_shape is 'ovo'"):
        model.predict(X_IRIS)


_WEIGHTS = "sample_weight is not equivalent to removing/repeating samples (so in scikit-learn too)"


@parametrize_with_checks(
    [GPUSVC(multiclass="sklearn", decision_function_shape="ovr")],
    expected_failed_checks=lambda _: {"check_sample_weight_equivalence_on_dense_data": _WEIGHTS,
                                      "check_sample_weight_equivalence_on_sparse_data": _WEIGHTS},
)
def test_gpusvc_answering_as_scikit_learn_passes_scikit_learns_checks(estimator, check):
    check(estimator)
