"""Every wrapper, method by method, against scikit-learn itself.

On the scikit-learn backend a bridged result must EQUAL that of the
scikit-learn estimator the backend builds from the same parameters (the
translation of cuML's parameters is cuML's own, see ``translate.TO_SKLEARN``).
On cuML, the smoke test checks that every method runs and has scikit-learn's
shapes and types.
"""

import inspect
import pickle

import numpy as np
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.datasets import load_iris, make_regression
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge.catalogue import ESTIMATORS
from sklearn_gpu_bridge.estimators import load_all
from sklearn_gpu_bridge.worker.backends import SklearnBackend

from .conftest import BACKEND, assert_same, assert_ulps

REGISTRY = load_all()

exact = pytest.mark.skipif(
    BACKEND != "sklearn",
    reason="exact equality holds on the scikit-learn backend; cuML differs in float32 and solvers",
)

_rng = np.random.default_rng(0)
X_IRIS, Y_IRIS = load_iris(return_X_y=True)
X_SMALL = StandardScaler().fit_transform(X_IRIS[::3])  # 50 rows, 3 classes
Y_SMALL = Y_IRIS[::3]
X_REG, Y_REG = make_regression(n_samples=60, n_features=5, noise=1.0, random_state=0)
X_COUNTS = _rng.integers(0, 6, size=(60, 5)).astype(float)
Y_COUNTS = (X_COUNTS[:, 0] + X_COUNTS[:, 1] > 5).astype(int) + (X_COUNTS[:, 2] > 3)
X_CATS = _rng.integers(0, 4, size=(80, 3)).astype(float)
Y_CATS = X_CATS[:, 0] * 2.0 + _rng.normal(size=80)
LABELS = np.array([3, 1, 1, 7, 3, 3, 1, 7, 7, 3])

# name -> (parameters for the comparison, data: X, y or None)
CASES = {
    "GPULinearRegression": ({}, (X_REG, Y_REG)),
    "GPULogisticRegression": ({"C": 0.5}, (X_SMALL, Y_SMALL)),
    "GPURidge": ({"alpha": 0.5}, (X_REG, Y_REG)),
    "GPULasso": ({"alpha": 0.1}, (X_REG, Y_REG)),
    "GPUElasticNet": ({"alpha": 0.1}, (X_REG, Y_REG)),
    "GPUMBSGDClassifier": ({"epochs": 20}, (X_SMALL, (Y_SMALL > 0).astype(int))),
    "GPUMBSGDRegressor": ({"epochs": 20}, (X_REG, Y_REG)),
    "GPUSVC": ({"C": 10}, (X_SMALL, Y_SMALL)),
    "GPUSVR": ({"C": 10}, (X_REG, Y_REG)),
    "GPULinearSVC": ({}, (X_SMALL, Y_SMALL)),
    "GPULinearSVR": ({}, (X_REG, Y_REG)),
    "GPUKMeans": ({"n_clusters": 3, "random_state": 0, "n_init": 1}, (X_SMALL, None)),
    "GPUDBSCAN": ({"eps": 0.8}, (X_SMALL, None)),
    "GPUHDBSCAN": ({}, (X_SMALL, None)),
    "GPUSpectralClustering": ({"n_clusters": 3, "random_state": 0}, (X_SMALL, None)),
    "GPUPCA": ({"n_components": 2}, (X_SMALL, None)),
    "GPUIncrementalPCA": ({"n_components": 2, "batch_size": 20}, (X_SMALL, None)),
    "GPUTruncatedSVD": ({"n_components": 2, "random_state": 0}, (X_SMALL, None)),
    "GPUNearestNeighbors": ({"n_neighbors": 3}, (X_SMALL, None)),
    "GPUKNeighborsClassifier": ({"n_neighbors": 3}, (X_SMALL, Y_SMALL)),
    "GPUKNeighborsRegressor": ({"n_neighbors": 3}, (X_REG, Y_REG)),
    "GPUKernelDensity": ({"bandwidth": 0.5}, (X_SMALL, None)),
    "GPURandomForestClassifier": ({"n_estimators": 5, "random_state": 0}, (X_SMALL, Y_SMALL)),
    "GPURandomForestRegressor": ({"n_estimators": 5, "random_state": 0}, (X_REG, Y_REG)),
    "GPUIsolationForest": ({"n_estimators": 10, "random_state": 0}, (X_SMALL, None)),
    "GPUTSNE": ({"perplexity": 5, "max_iter": 250, "random_state": 0}, (X_SMALL, None)),
    "GPUUMAP": ({"n_neighbors": 5, "n_epochs": 20, "random_state": 0}, (X_SMALL, None)),
    "GPUSpectralEmbedding": ({"random_state": 0, "n_neighbors": 10}, (X_SMALL, None)),
    "GPUKernelRidge": ({"alpha": 0.5}, (X_REG, Y_REG)),
    "GPUEmpiricalCovariance": ({}, (X_SMALL, None)),
    "GPULedoitWolf": ({}, (X_SMALL, None)),
    "GPUStandardScaler": ({}, (X_REG, None)),
    "GPUMinMaxScaler": ({"feature_range": (-1, 2)}, (X_REG, None)),
    "GPUMaxAbsScaler": ({}, (X_REG, None)),
    "GPUPolynomialFeatures": ({"degree": 2}, (X_REG[:, :3], None)),
    "GPULabelEncoder": ({}, (LABELS, None)),
    "GPULabelBinarizer": ({}, (LABELS, None)),
    "GPUOneHotEncoder": ({"sparse_output": False}, (X_CATS, None)),
    "GPUTargetEncoder": ({"multi_feature_mode": "independent"}, (X_CATS, Y_CATS)),
    "GPUGaussianNB": ({}, (X_SMALL, Y_SMALL)),
    "GPUMultinomialNB": ({}, (X_COUNTS, Y_COUNTS)),
    "GPUBernoulliNB": ({"binarize": 2.0}, (X_COUNTS, Y_COUNTS)),
    "GPUComplementNB": ({}, (X_COUNTS, Y_COUNTS)),
    "GPUCategoricalNB": ({}, (X_COUNTS, Y_COUNTS)),
}

# Methods that take X and return an array, compared directly.
X_METHODS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "score_samples",
             "transform", "mahalanobis")


def _available(name):
    if name == "GPUUMAP" and BACKEND == "sklearn":
        pytest.importorskip("umap", reason="the scikit-learn backend runs UMAP with umap-learn")


def _direct(name, bridged):
    """The scikit-learn estimator the CPU backend builds for these parameters."""
    cls = REGISTRY[name]
    params = {**bridged.get_params(), **cls._wire_params}
    estimator, _ = SklearnBackend().create(name[3:], params)
    return estimator


def _fit_args(name, X, y):
    if name in ("GPULabelEncoder", "GPULabelBinarizer"):
        return (X,)
    return (X,) if y is None else (X, y)


def test_cases_cover_every_wrapper():
    assert set(CASES) == set(REGISTRY)
    assert {name[3:] for name in REGISTRY} == set(ESTIMATORS)


@exact
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_direct_sklearn(name):
    _available(name)
    params, (X, y) = CASES[name]
    bridged = REGISTRY[name](**params)
    direct = _direct(name, bridged)
    args = _fit_args(name, X, y)
    assert bridged.fit(*args) is bridged
    direct.fit(*args)
    compared = 0
    for method in X_METHODS:
        if hasattr(bridged, method) and hasattr(direct, method):
            data = args[0]
            assert_same(getattr(bridged, method)(data), getattr(direct, method)(data))
            compared += 1
    if hasattr(bridged, "inverse_transform") and hasattr(direct, "inverse_transform"):
        out = direct.transform(args[0])
        assert_same(bridged.inverse_transform(out), direct.inverse_transform(out))
    if hasattr(bridged, "fit_transform"):
        assert_same(_dense(clone(bridged).fit_transform(*args)), _dense(clone(direct).fit_transform(*args)))
        compared += 1
    if hasattr(bridged, "fit_predict"):
        assert_same(clone(bridged).fit_predict(X), clone(direct).fit_predict(X))
        compared += 1
    if hasattr(bridged, "kneighbors"):
        for got, want in zip(bridged.kneighbors(X[:7]), direct.kneighbors(X[:7])):
            assert_same(got, want)
        assert_same(bridged.kneighbors(return_distance=False), direct.kneighbors(return_distance=False))
        for mode in ("connectivity", "distance"):
            assert_same(bridged.kneighbors_graph(X[:7], mode=mode).toarray(),
                        direct.kneighbors_graph(X[:7], mode=mode).toarray())
        compared += 1
    if hasattr(bridged, "score") and y is None and hasattr(direct, "score"):
        assert_same(bridged.score(X), direct.score(X))
    if hasattr(bridged, "sample"):
        assert_same(bridged.sample(4, random_state=1), direct.sample(4, random_state=1))
    if hasattr(bridged, "get_precision"):
        assert_same(bridged.get_precision(), direct.get_precision())
        assert_same(bridged.error_norm(np.eye(X.shape[1])), direct.error_norm(np.eye(X.shape[1])))
    for attribute in ("coef_", "components_", "cluster_centers_", "labels_", "embedding_", "mean_",
                      "covariance_", "categories_", "n_iter_"):
        if getattr(direct, attribute, None) is None:  # Ridge's n_iter_ is None: the wrapper has none
            assert getattr(bridged, attribute, None) is None
        else:
            got, want = getattr(bridged, attribute), getattr(direct, attribute)
            if isinstance(want, list):
                for g, w in zip(got, want):
                    assert_same(g, w)
            else:
                assert_same(got, want)
    assert compared or name.endswith(("Covariance", "LedoitWolf"))


def assert_close(got, expected):
    """scikit-learn's answer to a few ULPs on the scikit-learn backend; within float32 round-off on cuML."""
    if BACKEND == "sklearn":
        assert_ulps(got, expected)
    else:
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(expected, dtype=float),
                                   rtol=1e-4, atol=1e-5)


def _dense(a):
    return a.toarray() if sparse.issparse(a) else a


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_method_runs_and_pickles(name):
    """On either backend: fit, every method, pickle, load, same answers."""
    _available(name)
    params, (X, y) = CASES[name]
    args = _fit_args(name, X, y)
    model = REGISTRY[name](**params).fit(*args)
    first = {}
    for method in X_METHODS:
        if hasattr(model, method):
            first[method] = np.asarray(getattr(model, method)(args[0]))
            assert first[method].shape[0] == len(args[0])
    loaded = pickle.loads(pickle.dumps(model))
    assert "_remote" not in loaded.__dict__
    for method, expected in first.items():  # cuML: the state went through its scikit-learn form
        assert_close(getattr(loaded, method)(args[0]), expected)


# ------------------------------------------------------------------ the declarations


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_declared_class_is_a_plain_estimator(name):
    cls = REGISTRY[name]
    module = __import__(cls.__module__, fromlist=[name])
    assert getattr(module, name) is cls  # pickles by reference
    assert getattr(sklearn_gpu_bridge, name) is cls
    assert pickle.loads(pickle.dumps(cls)) is cls
    parameters = inspect.signature(cls).parameters
    assert not {"verbose", "output_type", "handle"} & set(parameters)
    assert all(p.kind is not p.VAR_KEYWORD for p in parameters.values())
    estimator = cls()
    assert estimator.get_params() == {k: p.default for k, p in parameters.items()}
    assert clone(estimator).get_params() == estimator.get_params()
    assert ESTIMATORS[name[3:]].cuml in cls.__doc__


# cuML 26.10's fit signatures: which take sample_weight (grep "def fit(" in cuML's sources)
WEIGHTED_FIT = {
    "GPULinearRegression", "GPULogisticRegression", "GPURidge", "GPULasso", "GPUElasticNet",
    "GPUSVC", "GPUSVR", "GPULinearSVC", "GPULinearSVR", "GPUKMeans", "GPUDBSCAN", "GPUKernelDensity",
    "GPURandomForestClassifier", "GPURandomForestRegressor", "GPUKernelRidge", "GPUGaussianNB",
}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_sample_weight_where_cuml_takes_it(name):
    takes = "sample_weight" in inspect.signature(REGISTRY[name].fit).parameters
    assert takes == (name in WEIGHTED_FIT)
    if not takes and name in ("GPUStandardScaler", "GPUMultinomialNB"):
        params, (X, y) = CASES[name]
        with pytest.raises(TypeError, match="sample_weight"):
            REGISTRY[name](**params).fit(*_fit_args(name, X, y), sample_weight=np.ones(len(X)))


@exact
def test_sample_weight_passes_through():
    from sklearn.linear_model import Ridge

    weights = np.linspace(0.1, 2.0, len(X_REG))
    bridged = REGISTRY["GPURidge"]().fit(X_REG, Y_REG, sample_weight=weights)
    assert_same(bridged.coef_, Ridge().fit(X_REG, Y_REG, sample_weight=weights).coef_)


# ------------------------------------------------------------------ pandas, labels, partial_fit

TRANSFORMERS = sorted(n for n, c in REGISTRY.items() if hasattr(c, "get_feature_names_out")
                      and n not in ("GPULabelEncoder", "GPULabelBinarizer"))


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_dataframes_in_feature_names_out_and_pandas_output(name):
    pd = pytest.importorskip("pandas")
    _available(name)
    params, (X, y) = CASES[name]
    columns = [f"f_{i}" for i in range(X.shape[1])]
    frame = pd.DataFrame(X, columns=columns)
    model = REGISTRY[name](**params).fit(frame, y)
    assert list(model.feature_names_in_) == columns
    names = model.get_feature_names_out()
    if hasattr(model, "transform"):
        out = model.set_output(transform="pandas").transform(frame)
        assert isinstance(out, pd.DataFrame)
        assert list(out.columns) == list(names)
        np.testing.assert_array_equal(out.index, frame.index)
    out = clone(model).set_output(transform="pandas").fit_transform(frame, y)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == list(names)


def test_feature_names_follow_scikit_learn():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(X_REG[:, :2], columns=["a", "b"])
    assert list(REGISTRY["GPUStandardScaler"]().fit(frame).get_feature_names_out()) == ["a", "b"]
    poly = REGISTRY["GPUPolynomialFeatures"]().fit(frame)
    assert list(poly.get_feature_names_out()) == ["1", "a", "b", "a^2", "a b", "b^2"]
    assert list(REGISTRY["GPUPCA"](n_components=1).fit(frame).get_feature_names_out()) == ["pca0"]
    cats = pd.DataFrame({"colour": [1, 2, 2, 3]})
    assert list(REGISTRY["GPUOneHotEncoder"]().fit(cats).get_feature_names_out()) == \
        ["colour_1", "colour_2", "colour_3"]


CLASSIFIERS = sorted(n for n, c in REGISTRY.items() if getattr(c, "_target", None) == "labels")


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_string_labels_come_back_as_given(name):
    params, (X, y) = CASES[name]
    names = np.array(["cat", "dog", "emu"])
    labels = names[y]
    model = REGISTRY[name](**params).fit(X, labels)
    np.testing.assert_array_equal(model.classes_, np.unique(labels))
    predicted = model.predict(X)
    assert predicted.dtype == labels.dtype and set(predicted) <= set(labels)
    if BACKEND == "sklearn":  # cuML's forests (n_streams > 1) do not repeat exactly
        by_code = REGISTRY[name](**params).fit(X, y).predict(X)  # the same model, on the codes
        np.testing.assert_array_equal(predicted, names[by_code])


@exact
@pytest.mark.parametrize("name", ["GPUGaussianNB", "GPUMultinomialNB", "GPUStandardScaler",
                                  "GPUMinMaxScaler", "GPUMaxAbsScaler", "GPUIncrementalPCA"])
def test_partial_fit_equals_sklearn(name):
    params, (X, y) = CASES[name]
    bridged = REGISTRY[name](**params)
    direct = _direct(name, bridged)
    labels = None if y is None else np.array(["a", "b", "c"])[y]
    for part in np.array_split(np.arange(len(X)), 3):
        if labels is None:
            bridged.partial_fit(X[part])
            direct.partial_fit(X[part])
        else:
            bridged.partial_fit(X[part], labels[part], classes=["a", "b", "c"])
            direct.partial_fit(X[part], labels[part], classes=["a", "b", "c"])
        method = "predict_proba" if labels is not None else "transform"
        assert_same(getattr(bridged, method)(X), getattr(direct, method)(X))  # state follows each update
    if labels is not None:
        np.testing.assert_array_equal(bridged.predict(X), direct.predict(X))
        with pytest.raises(ValueError, match="unseen labels"):
            bridged.partial_fit(X[:2], ["a", "zebra"])


def test_label_encoders_with_strings():
    words = np.array(["pear", "apple", "fig", "apple", "pear"])
    encoder = REGISTRY["GPULabelEncoder"]().fit(words)
    np.testing.assert_array_equal(encoder.classes_, ["apple", "fig", "pear"])
    np.testing.assert_array_equal(encoder.transform(["fig", "pear"]), [1, 2])
    np.testing.assert_array_equal(encoder.inverse_transform([0, 2]), ["apple", "pear"])
    np.testing.assert_array_equal(REGISTRY["GPULabelEncoder"]().fit_transform(words), [2, 0, 1, 0, 2])
    with pytest.raises(ValueError, match="unseen labels"):
        encoder.transform(["kiwi"])
    lenient = REGISTRY["GPULabelEncoder"](handle_unknown="ignore").fit(words)
    np.testing.assert_array_equal(lenient.transform(["kiwi", "fig"]), [-1, 1])
    binarizer = REGISTRY["GPULabelBinarizer"](sparse_output=True).fit(words)
    indicator = binarizer.transform(["fig", "apple"])
    assert sparse.issparse(indicator)
    np.testing.assert_array_equal(indicator.toarray(), [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(binarizer.inverse_transform(indicator), ["fig", "apple"])


@exact
def test_one_hot_encoder_with_string_categories():
    from sklearn.preprocessing import OneHotEncoder

    X = np.array([["red", "S"], ["blue", "M"], ["red", "L"], ["green", "M"]], dtype=object)
    bridged = REGISTRY["GPUOneHotEncoder"](handle_unknown="ignore").fit(X)
    direct = OneHotEncoder(handle_unknown="ignore", dtype=np.float32).fit(X)
    out = bridged.transform(X)
    assert sparse.issparse(out)  # cuML's default sparse_output=True
    assert_same(out.toarray(), direct.transform(X).toarray())
    assert list(bridged.get_feature_names_out()) == list(direct.get_feature_names_out())
    np.testing.assert_array_equal(bridged.inverse_transform(out), X)


def test_class_weight_dict_keyed_by_user_labels_everywhere():
    labels = np.array(["x", "y", "z"])[Y_SMALL]
    weights = {"x": 1.0, "y": 4.0, "z": 0.5}
    for name in ("GPULogisticRegression", "GPULinearSVC", "GPURandomForestClassifier"):
        params = CASES[name][0]
        model = REGISTRY[name](**params, class_weight=weights).fit(X_SMALL, labels)
        assert set(model.predict(X_SMALL)) <= set(labels)


def test_a_parameter_that_changes_the_answer_is_never_dropped(connection):
    """A worker whose class has no such parameter refuses a user-set one instead of ignoring it;
    one that only tunes speed or memory (cache_size, n_streams ...) is left out quietly."""
    X, y = CASES["GPUSVC"][1]
    if BACKEND == "sklearn":  # scikit-learn's SVC has no nochange_steps
        with pytest.raises(ValueError, match=r"no parameter\(s\) \['nochange_steps'\]; refusing to ignore"):
            REGISTRY["GPUSVC"](nochange_steps=5).fit(X, y)
    REGISTRY["GPUSVC"](cache_size=512.0).fit(X, y)
    REGISTRY["GPUSVC"](nochange_steps=1000).fit(X, y)  # its default: nothing to refuse


def test_min_max_scaler_scales_to_its_feature_range(connection):
    """cuML's MinMaxScaler takes feature_range (keyword) though its signature reads (*args, **kwargs)."""
    X = CASES["GPUMinMaxScaler"][1][0]
    out = REGISTRY["GPUMinMaxScaler"](feature_range=(-1, 1)).fit_transform(X)
    assert_close(out.min(axis=0), -np.ones(X.shape[1]))
    assert_close(out.max(axis=0), np.ones(X.shape[1]))
