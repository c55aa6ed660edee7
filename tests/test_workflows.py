"""scikit-learn workflows as users write them, with GPU wrappers in them, against scikit-learn itself.

Each workflow runs twice on the same data: with the ``GPU*`` wrappers, and
with the scikit-learn estimators that the worker's scikit-learn backend builds
for the same parameters (``reference``). On the scikit-learn backend the two
must agree to a few ULPs. On a cuML worker (float32, cuML's solvers) the
labels must agree on nearly every sample and the scores within a few points.

Where cuML differs from scikit-learn by design, the reference is cuML's way:
an SVC of three or more classes is one binary SVC per pair with one decision
column per class (``CumlLikeSVC``, the backend's stand-in, checked against
in-process cuML in ``test_cuml_svc_multiclass_equals_in_process_cuml``).
"""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_digits, load_iris, make_regression
from sklearn.ensemble import RandomForestClassifier, StackingClassifier, VotingClassifier
from sklearn.experimental import enable_halving_search_cv  # noqa: F401 - enables HalvingGridSearchCV
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
from sklearn.inspection import partial_dependence, permutation_importance
from sklearn.model_selection import HalvingGridSearchCV, cross_val_score, train_test_split
from sklearn.multiclass import OneVsOneClassifier, OneVsRestClassifier
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder

from sklearn_gpu_bridge import (
    GPUPCA,
    GPUSVC,
    GPUKMeans,
    GPULogisticRegression,
    GPUMultinomialNB,
    GPUNearestNeighbors,
    GPURandomForestRegressor,
    GPURidge,
    GPUStandardScaler,
    GPUTruncatedSVD,
)
from sklearn_gpu_bridge.protocol import to_plain
from sklearn_gpu_bridge.worker.backends import SklearnBackend

from .conftest import BACKEND, assert_same

pd = pytest.importorskip("pandas")


def reference(wrapper):
    """The scikit-learn estimator the scikit-learn backend builds for this wrapper's parameters."""
    params = to_plain(wrapper.get_params(deep=False) | wrapper._wire_params)
    return SklearnBackend().create(wrapper._remote_name, params)[0]


def labels_agree(got, want):
    if BACKEND == "sklearn":
        np.testing.assert_array_equal(got, want)
    else:  # float32 near a boundary
        assert np.mean(np.asarray(got) == np.asarray(want)) >= 0.95


def scores_agree(got, want, points=0.03):
    if BACKEND == "sklearn":
        assert_same(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=points)


# ---------------------------------------------------------------- text: sparse all the way

WORDS = np.array("gpu cuda kernel tensor matrix graph vertex edge protein cell gene enzyme market price trade "
                 "stock bond yield goal match team player season coach".split())


def _corpus(n=600, seed=0):
    """Documents of four topics: each draws most words from its topic's six, some from anywhere."""
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, 4, n)
    documents = []
    for topic in topics:
        own = WORDS[topic * 6:(topic + 1) * 6]
        words = np.concatenate([rng.choice(own, 12), rng.choice(WORDS, 6)])
        documents.append(" ".join(words))
    return documents, np.array(["computing", "biology", "finance", "sport"])[topics]


def test_tfidf_then_logistic_regression():
    documents, topics = _corpus()
    train, test, y_train, y_test = train_test_split(documents, topics, random_state=0)
    bridged = make_pipeline(TfidfVectorizer(), GPULogisticRegression()).fit(train, y_train)
    direct = make_pipeline(TfidfVectorizer(), reference(GPULogisticRegression())).fit(train, y_train)
    labels_agree(bridged.predict(test), direct.predict(test))
    scores_agree(bridged.predict_proba(test), direct.predict_proba(test))


def test_counts_then_multinomial_naive_bayes():
    documents, topics = _corpus(seed=1)
    bridged = make_pipeline(CountVectorizer(), GPUMultinomialNB()).fit(documents, topics)
    direct = make_pipeline(CountVectorizer(), reference(GPUMultinomialNB())).fit(documents, topics)
    labels_agree(bridged.predict(documents), direct.predict(documents))
    scores_agree(bridged.predict_proba(documents), direct.predict_proba(documents))


def test_tfidf_then_nearest_neighbors_by_cosine():
    documents, _ = _corpus(seed=2)
    X = TfidfVectorizer().fit_transform(documents)
    bridged = GPUNearestNeighbors(n_neighbors=4, metric="cosine").fit(X)
    direct = reference(GPUNearestNeighbors(n_neighbors=4, metric="cosine")).fit(X)
    distances, indices = bridged.kneighbors(X[:50])
    want_distances, want_indices = direct.kneighbors(X[:50])
    scores_agree(distances, want_distances, points=1e-4)
    # neighbours at the same distance (repeated documents) may come in either order, on any backend
    assert np.mean(indices == want_indices) >= (0.98 if BACKEND == "sklearn" else 0.9)


def test_tfidf_then_truncated_svd_then_kmeans_all_on_the_worker():
    """LSA: TF-IDF's sparse matrix reduced on the worker without densifying (cuML's TruncatedSVD takes dense
    data only), as much variance kept as scikit-learn keeps, then clustered into the topics."""
    from sklearn.decomposition import TruncatedSVD

    documents, topics = _corpus(seed=3)
    X = TfidfVectorizer().fit_transform(documents)
    svd = GPUTruncatedSVD(n_components=5, random_state=0)
    reduced = svd.fit_transform(X)
    direct = TruncatedSVD(n_components=5, random_state=0).fit(X)
    np.testing.assert_allclose(svd.explained_variance_ratio_.sum(), direct.explained_variance_ratio_.sum(),
                               rtol=0.01)
    clusters = GPUKMeans(n_clusters=4, random_state=0, n_init=3).fit_predict(reduced)
    # the clusters are the topics: each topic falls (nearly) all in one cluster
    purity = sum(np.bincount(clusters[topics == t]).max() for t in np.unique(topics)) / len(topics)
    assert purity >= 0.9


# ---------------------------------------------------------------- calibration and meta-estimators


def test_calibrated_svc_on_digits():
    """The README's recipe for SVC probabilities: CalibratedClassifierCV(GPUSVC()); ten classes."""
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, random_state=0)
    bridged = CalibratedClassifierCV(GPUSVC()).fit(X_train, y_train)
    direct = CalibratedClassifierCV(reference(GPUSVC())).fit(X_train, y_train)
    assert bridged.score(X_test, y_test) >= 0.97
    labels_agree(bridged.predict(X_test), direct.predict(X_test))
    scores_agree(bridged.predict_proba(X_test), direct.predict_proba(X_test), points=0.05)


@pytest.mark.parametrize("meta", [OneVsOneClassifier, OneVsRestClassifier])
@pytest.mark.parametrize("make", [GPULogisticRegression, GPUSVC], ids=["logistic", "svc"])
def test_one_vs_one_and_one_vs_rest(meta, make):
    X, y = load_iris(return_X_y=True)
    bridged = meta(make()).fit(X, y)
    direct = meta(reference(make())).fit(X, y)
    labels_agree(bridged.predict(X), direct.predict(X))
    scores_agree(bridged.decision_function(X), direct.decision_function(X), points=0.05)


def test_stacking_and_voting_mix_gpu_and_cpu_estimators():
    X, y = load_iris(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0, stratify=y)

    def stack(svc, final):
        forest = RandomForestClassifier(n_estimators=20, random_state=0)
        return StackingClassifier([("svc", svc), ("forest", forest)], final_estimator=final, cv=3)

    bridged = stack(GPUSVC(), GPULogisticRegression()).fit(X_train, y_train)
    direct = stack(reference(GPUSVC()), reference(GPULogisticRegression())).fit(X_train, y_train)
    labels_agree(bridged.predict(X_test), direct.predict(X_test))

    voting = VotingClassifier([("lr", GPULogisticRegression()), ("nb", GaussianNB())], voting="soft")
    direct_voting = VotingClassifier([("lr", reference(GPULogisticRegression())), ("nb", GaussianNB())],
                                     voting="soft")
    scores_agree(voting.fit(X_train, y_train).predict_proba(X_test),
                 direct_voting.fit(X_train, y_train).predict_proba(X_test))


# ---------------------------------------------------------------- inspection


def test_permutation_importance_and_partial_dependence():
    X, y = make_regression(n_samples=300, n_features=5, n_informative=3, noise=5.0, random_state=0)
    bridged, direct = GPURidge(alpha=1.0).fit(X, y), reference(GPURidge(alpha=1.0)).fit(X, y)
    got = permutation_importance(bridged, X, y, n_repeats=5, random_state=0)
    want = permutation_importance(direct, X, y, n_repeats=5, random_state=0)
    scores_agree(got.importances_mean, want.importances_mean, points=1e-3)
    for feature in (0, 3):
        got = partial_dependence(bridged, X, [feature], grid_resolution=10)
        want = partial_dependence(direct, X, [feature], grid_resolution=10)
        scores_agree(got["average"], want["average"], points=1e-2 * np.abs(want["average"]).max())

    forest = GPURandomForestRegressor(n_estimators=20, random_state=0).fit(X, y)
    importances = permutation_importance(forest, X, y, n_repeats=3, random_state=0).importances_mean
    assert set(np.argsort(importances)[-3:]) == set(np.argsort(np.abs(GPURidge().fit(X, y).coef_))[-3:])


# ---------------------------------------------------------------- searches


def test_halving_grid_search():
    X, y = load_digits(return_X_y=True)
    X = X[:600] / 16.0
    y = y[:600]
    grid = {"C": [0.1, 1, 10], "gamma": ["scale", 0.01]}
    bridged = HalvingGridSearchCV(GPUSVC(), grid, random_state=0, cv=3).fit(X, y)
    direct = HalvingGridSearchCV(reference(GPUSVC()), grid, random_state=0, cv=3).fit(X, y)
    assert bridged.best_params_ == direct.best_params_
    scores_agree(bridged.cv_results_["mean_test_score"], direct.cv_results_["mean_test_score"], points=0.02)


def test_cross_val_score_of_a_pipeline_with_a_clone_per_fold():
    X, y = load_iris(return_X_y=True)
    pipe = make_pipeline(GPUStandardScaler(), GPUSVC(C=3.0))
    direct = make_pipeline(reference(GPUStandardScaler()), reference(GPUSVC(C=3.0)))
    scores_agree(cross_val_score(pipe, X, y, cv=5), cross_val_score(direct, X, y, cv=5), points=0.04)
    assert clone(pipe).get_params()["gpusvc__C"] == 3.0


# ---------------------------------------------------------------- pandas in and out


def test_pandas_in_pandas_out():
    X, y = load_iris(return_X_y=True, as_frame=True)
    X = X.assign(kind=np.where(X["petal width (cm)"] > 1.0, "wide", "narrow"))
    numeric = list(X.columns[:4])
    prepare = ColumnTransformer([("scale", GPUStandardScaler(), numeric),
                                 ("kind", OneHotEncoder(sparse_output=False), ["kind"])])
    pipe = Pipeline([("prepare", prepare), ("pca", GPUPCA(n_components=3))]).set_output(transform="pandas")
    out = pipe.fit_transform(X)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["pca0", "pca1", "pca2"]
    assert out.index.equals(X.index)
    direct = Pipeline([("prepare", ColumnTransformer([("scale", reference(GPUStandardScaler()), numeric),
                                                      ("kind", OneHotEncoder(sparse_output=False), ["kind"])])),
                       ("pca", reference(GPUPCA(n_components=3)))]).set_output(transform="pandas")
    want = direct.fit_transform(X)
    assert list(want.columns) == list(out.columns)  # the names scikit-learn's PCA gives
    if BACKEND == "sklearn":
        assert_same(out.to_numpy(), want.to_numpy())
    else:  # components' signs are each library's choice
        np.testing.assert_allclose(np.abs(out.to_numpy()), np.abs(want.to_numpy()), atol=1e-3)
    scaled = GPUStandardScaler().set_output(transform="pandas").fit_transform(X[numeric])
    assert list(scaled.columns) == numeric
    model = GPULogisticRegression().fit(X[numeric], y.map({0: "setosa", 1: "versicolor", 2: "virginica"}))
    assert list(model.feature_names_in_) == numeric and model.predict(X[numeric]).dtype.kind in "OU"


# ---------------------------------------------------------------- cuML's own ways, against cuML in process


@pytest.mark.gpu
def test_cuml_svc_multiclass_equals_in_process_cuml():
    """On a cuML worker: the bridged multiclass SVC is cuML's (one column per class), and its portable
    form (built from cuML's pairwise models) answers as cuML does, without cuML."""
    from cuml.svm import SVC as CumlSVC

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    bridged = GPUSVC(C=3.0).fit(X, y)
    direct = CumlSVC(C=3.0).fit(X, y)
    labels_agree(bridged.predict(X), np.asarray(direct.predict(X)))
    np.testing.assert_allclose(bridged.decision_function(X), np.asarray(direct.decision_function(X)),
                               rtol=1e-3, atol=1e-3)
    portable = bridged.sklearn_model_
    np.testing.assert_allclose(portable.decision_function(X), np.asarray(direct.decision_function(X)),
                               rtol=1e-3, atol=1e-3)
