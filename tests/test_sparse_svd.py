"""TruncatedSVD of sparse X (LSA: TF-IDF, then TruncatedSVD) on the worker, never made dense.

cuML's TruncatedSVD takes dense X only; the worker computes a sparse X with
scikit-learn's randomized SVD (CuPy on the cuML backend, SciPy on the
scikit-learn backend, where the answer is scikit-learn's own to a few ULPs).
The fitted model carries scikit-learn's attributes, transforms sparse and
dense X, saves, loads and answers from its portable form; accel serves
scikit-learn's TruncatedSVD on sparse X on the worker, ``algorithm="arpack"``
included.
"""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfTransformer
from sklearn.pipeline import make_pipeline

from sklearn_gpu_bridge import GPUTruncatedSVD, accel
from sklearn_gpu_bridge.accel import report

from .conftest import BACKEND, assert_same

ATTRIBUTES = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_")
WORK_OPS = ("fit", "call")


def _tfidf(n_docs=600, n_terms=300, per_doc=12, n_topics=6, seed=0):
    """Word counts of documents drawn from a few topics (Zipf-like words), as TF-IDF: a small LSA input."""
    rng = np.random.default_rng(seed)
    topic = rng.integers(0, n_topics, n_docs)
    ranks = np.minimum((np.exp(rng.random((n_docs, per_doc)) * np.log(n_terms)) - 1).astype(int), n_terms - 1)
    own = rng.random((n_docs, per_doc)) < 0.5
    words = np.where(own, (ranks + (n_terms // n_topics) * topic[:, None]) % n_terms, ranks)
    counts = sp.csr_matrix((np.ones(words.size), words.ravel(), np.arange(0, words.size + 1, per_doc)),
                           shape=(n_docs, n_terms))
    counts.sum_duplicates()
    return TfidfTransformer().fit_transform(counts).tocsr(), topic


def _sent(connection, before):
    after = connection.status()["requests"]
    return {op for op in WORK_OPS if after.get(op, 0) != before.get(op, 0)}


def _agree_as_models(bridged, direct):
    """The same SVD: scikit-learn's numbers on its backend; on cuML (float32, CuPy's draws), the same
    explained variance within 1% and the same leading subspace."""
    if BACKEND == "sklearn":
        for name in ATTRIBUTES:
            assert_same(getattr(bridged, name), getattr(direct, name))
        return
    got, want = bridged.explained_variance_ratio_.sum(), direct.explained_variance_ratio_.sum()
    assert abs(got / want - 1) < 0.01
    np.testing.assert_allclose(bridged.singular_values_[:3], direct.singular_values_[:3], rtol=1e-3)
    cosines = np.abs(np.sum(bridged.components_[:3] * direct.components_[:3], axis=1))
    np.testing.assert_allclose(cosines, 1, atol=1e-3)


def test_sparse_x_gives_scikit_learns_truncated_svd(connection):
    X, _ = _tfidf()
    bridged = GPUTruncatedSVD(n_components=8, random_state=0)
    reduced = bridged.fit_transform(X)
    direct = TruncatedSVD(n_components=8, random_state=0)  # cuML's n_iter=15 is scikit-learn's 5 (as_sklearn)
    want = direct.fit_transform(X)
    assert bridged.n_components == 8 and bridged.n_features_in_ == X.shape[1]
    assert reduced.shape == want.shape == (X.shape[0], 8)
    _agree_as_models(bridged, direct)
    if BACKEND == "sklearn":
        assert_same(reduced, want)
    # what the fitted model answers, sparse and dense, is X @ components_.T
    for given in (X[:50], X[:50].toarray(), sp.csc_matrix(X[:50]), sp.csr_array(X[:50])):
        np.testing.assert_allclose(bridged.transform(given), X[:50] @ bridged.components_.T, rtol=1e-4, atol=1e-5)


def test_explained_variance_is_within_one_percent_of_arpacks(connection):
    X, _ = _tfidf(n_docs=2000, n_terms=800, per_doc=20, n_topics=20)
    exact = TruncatedSVD(n_components=40, algorithm="arpack", random_state=0).fit(X)
    bridged = GPUTruncatedSVD(n_components=40, random_state=0).fit(X)
    ratio = bridged.explained_variance_ratio_.sum() / exact.explained_variance_ratio_.sum()
    assert 0.99 < ratio < 1.0 + 1e-6  # a randomized range finder misses a little, never more than there is


def test_the_components_signs_are_scikit_learns(connection):
    """svd_flip on the rows of components_: each row's largest entry (in magnitude) is positive."""
    X, _ = _tfidf(seed=4)
    components = GPUTruncatedSVD(n_components=6, random_state=1).fit(X).components_
    largest = components[np.arange(6), np.argmax(np.abs(components), axis=1)]
    assert (largest > 0).all()


def test_a_sparse_x_travels_as_its_three_arrays(connection):
    """2000 x 200,000 (0.1%): dense it would be 3.2 GB; it goes as data, indices and index pointers."""
    rng = np.random.default_rng(2)
    n, m, nnz = 2000, 200_000, 400_000
    X = sp.csr_matrix((rng.random(nnz), (rng.integers(0, n, nnz), rng.integers(0, m, nnz))), shape=(n, m))
    before = dict(connection.stats)
    bridged = GPUTruncatedSVD(n_components=5, random_state=0).fit(X)
    sent = {k: v - before.get(k, 0) for k, v in connection.stats.items() if k.startswith("sent_")}
    assert sum(sent.values()) == 3
    assert bridged.components_.shape == (5, m)


def test_arpack_under_accel_is_served_on_the_worker_with_arpacks_answer(connection, accelerated):
    X, _ = _tfidf(n_docs=1500, n_terms=500, per_doc=15, n_topics=10, seed=3)
    accel.uninstall()
    exact = TruncatedSVD(n_components=20, algorithm="arpack", random_state=0).fit(X)
    accel.install()
    served = TruncatedSVD(n_components=20, algorithm="arpack", random_state=0)
    reduced = served.fit_transform(X)
    again = served.transform(X[:10])
    calls = report.calls()
    assert calls["TruncatedSVD.fit_transform"]["worker"] == 1 and calls["TruncatedSVD.transform"]["worker"] == 1
    assert type(served) is TruncatedSVD and served.algorithm == "arpack"
    np.testing.assert_allclose(served.singular_values_, exact.singular_values_, rtol=1e-4)
    np.testing.assert_allclose(served.explained_variance_ratio_.sum(), exact.explained_variance_ratio_.sum(),
                               rtol=1e-4)
    np.testing.assert_allclose(np.abs(np.sum(served.components_ * exact.components_, axis=1)), 1, atol=1e-3)
    np.testing.assert_allclose(again, reduced[:10], rtol=1e-4, atol=1e-5)


def test_scikit_learns_randomized_parameters_are_honoured_under_accel(connection, accelerated):
    X, _ = _tfidf(seed=5)
    params = dict(n_components=5, n_iter=3, n_oversamples=4, power_iteration_normalizer="QR", random_state=7)
    accel.uninstall()
    direct = TruncatedSVD(**params).fit(X)
    accel.install()
    served = TruncatedSVD(**params).fit(X)
    _agree_as_models(served, direct)


def test_a_saved_model_loads_transforms_on_a_new_worker_and_answers_in_process(connection, tmp_path, worker):
    from .conftest import own_worker

    X, _ = _tfidf(seed=6)
    fitted = GPUTruncatedSVD(n_components=4, random_state=0).fit(X)
    want = fitted.transform(X[:20])
    saved = pickle.dumps(fitted)
    portable = pickle.loads(saved).sklearn_model_
    assert type(portable) is TruncatedSVD  # scikit-learn's own class: it loads where the bridge is not installed
    np.testing.assert_allclose(portable.transform(X[:20]), want, rtol=1e-4, atol=1e-5)
    with own_worker(tmp_path, worker):  # a worker that never saw it: the state is pushed back
        loaded = pickle.loads(saved)
        np.testing.assert_allclose(loaded.transform(X[:20]), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(loaded.transform(X[:20].toarray()), want, rtol=1e-4, atol=1e-5)


def test_lsa_pipeline_tfidf_svd_kmeans_finds_the_topics(connection):
    X, topic = _tfidf(n_docs=900, n_terms=600, per_doc=30, n_topics=3, seed=7)
    clusters = make_pipeline(GPUTruncatedSVD(n_components=10, random_state=0),
                             KMeans(n_clusters=3, n_init=5, random_state=0)).fit_predict(X)
    purity = sum(np.bincount(clusters[topic == t]).max() for t in range(3)) / len(topic)
    assert purity >= 0.9


def test_what_scikit_learn_refuses_is_refused_before_sending(connection):
    X, _ = _tfidf(n_terms=30)
    before = connection.status()["requests"]
    with pytest.raises(ValueError, match=r"n_components\(31\) must be <= n_features\(30\)\."):
        GPUTruncatedSVD(n_components=31).fit(X)
    with pytest.raises(ValueError, match=r"n_components\(31\) must be <= n_features\(30\)\."):
        TruncatedSVD(n_components=31).fit(X)
    assert not _sent(connection, before)
    fitted = GPUTruncatedSVD(n_components=2, random_state=0).fit(X)
    before = connection.status()["requests"]
    with pytest.raises(TypeError, match="Sparse data was passed"):
        TruncatedSVD(n_components=2).fit(X).inverse_transform(sp.csr_matrix(np.ones((3, 2))))
    with pytest.raises(TypeError, match="Sparse data was passed"):
        fitted.inverse_transform(sp.csr_matrix(np.ones((3, 2))))
    assert not _sent(connection, before)
    np.testing.assert_allclose(fitted.inverse_transform(np.ones((3, 2))), np.ones((3, 2)) @ fitted.components_,
                               rtol=1e-4, atol=1e-6)


def test_parameters_scikit_learn_refuses_are_refused_by_the_worker_in_its_words(connection):
    X, _ = _tfidf()
    with pytest.raises(ValueError, match="The 'n_iter' parameter of TruncatedSVD must be"):
        GPUTruncatedSVD(n_components=2, n_iter=-1).fit(X)
    wrapper = GPUTruncatedSVD()
    wrapper._accel_params = TruncatedSVD(n_components=3, algorithm="arpack").get_params()
    with pytest.raises(ValueError, match=r"0 < k < min\(A.shape\)"):
        wrapper.fit(X[:3])
