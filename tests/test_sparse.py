"""Sparse input: scipy.sparse matrices and arrays go to the classes whose cuML counterpart takes them.

They travel as their three arrays (data, indices, index pointers: through
the pool like any array) and are never made dense on the way; the answers
are scikit-learn's on the same sparse input. A class whose cuML counterpart
takes dense data only refuses sparse input in scikit-learn's own words,
before anything is sent.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.manifold import trustworthiness
from sklearn.naive_bayes import MultinomialNB
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler
from sklearn.utils.validation import check_array

import sklearn_gpu_bridge
from sklearn_gpu_bridge import (
    GPUElasticNet,
    GPUKNeighborsRegressor,
    GPULasso,
    GPUMultinomialNB,
    GPUNearestNeighbors,
    GPURidge,
    GPUStandardScaler,
)
from sklearn_gpu_bridge.estimators import load_all

from .conftest import BACKEND, assert_same
from .test_coverage import CASES, X_METHODS, _available, _direct, _fit_args

REGISTRY = load_all()
SPARSE = sorted(name for name, cls in REGISTRY.items() if cls._sparse_fit and name in CASES)
DENSE_ONLY = sorted(name for name, cls in REGISTRY.items()
                    if not cls._sparse_fit and name not in ("GPULabelEncoder", "GPULabelBinarizer"))
# sparse input changes what some classes accept: their parameters for the sparse comparison
SPARSE_PARAMS = {"GPUStandardScaler": {"with_mean": False}, "GPUTSNE": {"init": "random"}}
FORMATS = {"csr_matrix": sp.csr_matrix, "csc_matrix": sp.csc_matrix, "coo_matrix": sp.coo_matrix,
           "csr_array": sp.csr_array}
WORK_OPS = ("fit", "call")


def _sparse_copy(X, to):
    """X with its small entries dropped (a third or more zeros), in format ``to``."""
    X = np.asarray(X, dtype=np.float64)
    return to(np.where(np.abs(X) > 0.3, X, 0.0))


def _sent(connection, before):
    after = connection.status()["requests"]
    return {op for op in WORK_OPS if after.get(op, 0) != before.get(op, 0)}


def _agree(bridged, direct):
    """scikit-learn's answer on the CPU backend; on cuML, float32 and cuML's solvers: labels nearly all."""
    bridged = bridged.toarray() if sp.issparse(bridged) else np.asarray(bridged)
    direct = direct.toarray() if sp.issparse(direct) else np.asarray(direct)
    if BACKEND == "sklearn":
        assert_same(bridged, direct)
    elif bridged.dtype.kind in "fc":
        np.testing.assert_allclose(bridged, direct, rtol=2e-2, atol=2e-2)
    else:
        assert np.mean(bridged == direct) >= 0.9


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SPARSE)
def test_sparse_input_gives_scikit_learns_answer(connection, name, fmt):
    _available(name)
    if name == "GPUUMAP":  # the answer to compare with is umap-learn's, on any backend
        pytest.importorskip("umap", reason="scikit-learn's side of UMAP is umap-learn")
    params, (X, y) = CASES[name]
    params = {**params, **SPARSE_PARAMS.get(name, {})}
    X = _sparse_copy(X, FORMATS[fmt])
    bridged = REGISTRY[name](**params)
    direct = _direct(name, bridged)
    args = _fit_args(name, X, y)
    direct_args = _fit_args(name, X.tocsr(), y)  # scikit-learn's IncrementalPCA cannot slice a COO matrix
    compared = 0
    if hasattr(bridged, "fit_transform") and not hasattr(bridged, "transform"):  # TSNE: fit_transform only
        got, want = bridged.fit_transform(*args), direct.fit_transform(*direct_args)
        if BACKEND == "sklearn":
            _agree(got, want)
        else:  # two implementations' embeddings differ as numbers; both must keep the neighbourhoods
            dense = X.toarray()
            assert got.shape == want.shape
            assert trustworthiness(dense, got, n_neighbors=5) >= trustworthiness(dense, want, n_neighbors=5) - 0.05
        return
    bridged.fit(*args)
    direct.fit(*direct_args)
    for method in X_METHODS:
        if hasattr(bridged, method) and hasattr(direct, method):
            _agree(getattr(bridged, method)(X), getattr(direct, method)(direct_args[0]))
            compared += 1
    if hasattr(bridged, "kneighbors"):
        for got, want in zip(bridged.kneighbors(X.tocsr()[:7]), direct.kneighbors(direct_args[0][:7])):
            _agree(got, want)
        compared += 1
    assert compared


@pytest.mark.parametrize("name", DENSE_ONLY)
def test_a_class_cuml_runs_on_dense_data_only_refuses_sparse_in_scikit_learns_words(connection, name):
    _available(name)
    params, (X, y) = CASES[name]
    with pytest.raises(TypeError) as expected:
        check_array(sp.csr_matrix(X), accept_sparse=False, input_name="X")
    before = connection.status()["requests"]
    with pytest.raises(TypeError) as got:
        REGISTRY[name](**params).fit(*_fit_args(name, sp.csr_matrix(X), y))
    assert str(got.value) == str(expected.value)
    assert not _sent(connection, before)


def test_a_large_sparse_matrix_travels_as_its_three_arrays(connection):
    """100,000 x 100,000 at 0.05% (5M values): dense it would be 80 GB; it goes as 60 MB of arrays."""
    rng = np.random.default_rng(0)
    n, nnz = 100_000, 5_000_000
    X = sp.csr_matrix((rng.integers(1, 4, nnz).astype(np.float64), (rng.integers(0, n, nnz), rng.integers(0, n, nnz))),
                      shape=(n, n))
    y = rng.integers(0, 3, n)
    before = dict(connection.stats)
    bridged = GPUMultinomialNB().fit(X, y)
    sent = {k: v - before.get(k, 0) for k, v in connection.stats.items() if k.startswith("sent_")}
    assert sum(sent.values()) == 4  # data, indices, index pointers and the labels: nothing made dense
    direct = MultinomialNB().fit(X, y)
    _agree(bridged.predict(X[:2000]), direct.predict(X[:2000]))
    _agree(bridged.predict_proba(X[:2000]), direct.predict_proba(X[:2000]))


def test_centering_sparse_data_is_refused_before_sending(connection):
    X = sp.csr_matrix(np.eye(5))
    before = connection.status()["requests"]
    with pytest.raises(ValueError, match=r"Cannot center sparse matrices: pass `with_mean=False` instead"):
        GPUStandardScaler().fit(X)
    assert not _sent(connection, before)
    _agree(GPUStandardScaler(with_mean=False).fit_transform(X), StandardScaler(with_mean=False).fit_transform(X))


@pytest.mark.parametrize("cls, refused, taken, words", [
    (GPURidge, {"solver": "eig"}, {"solver": "lsmr"}, "solver='eig' doesn't support sparse X"),
    (GPULasso, {"solver": "cd"}, {}, "solver='cd' doesn't support sparse inputs"),  # "auto" (scikit-learn's Lasso
    (GPUElasticNet, {"solver": "cd"}, {}, "solver='cd' doesn't support sparse inputs"),  # has no solver to set)
    (GPUKNeighborsRegressor, {"algorithm": "rbc"}, {"algorithm": "brute"}, "algorithm='rbc' doesn't support sparse"),
])
def test_a_solver_cuml_runs_on_dense_data_only_is_refused_for_sparse_input(connection, cls, refused, taken, words):
    X, y = sp.csr_matrix(np.eye(6)), np.arange(6.0)
    before = connection.status()["requests"]
    with pytest.raises(ValueError, match=words):
        cls(**refused).fit(X, y)
    assert not _sent(connection, before)
    cls(**taken).fit(X, y)


def test_neighbors_answer_a_dense_query_to_a_sparse_fit(connection):
    """cuML refuses to mix them (scikit-learn answers a dense query to a sparse fit): the client sends the
    query in the fit's kind, and the answer is scikit-learn's to that query."""
    X = _sparse_copy(np.random.default_rng(1).standard_normal((40, 6)), sp.csr_matrix)
    query = np.random.default_rng(2).standard_normal((5, 6))
    for fitted_on, asked in ((X, query), (X.toarray(), sp.csr_matrix(query))):
        bridged = GPUNearestNeighbors(n_neighbors=3).fit(fitted_on)
        direct = NearestNeighbors(n_neighbors=3).fit(fitted_on)
        as_fitted = sp.csr_matrix(asked) if sp.issparse(fitted_on) else asked.toarray()
        for got, want in zip(bridged.kneighbors(asked), direct.kneighbors(as_fitted)):
            _agree(got, want)


def test_sparse_input_is_cast_like_dense_input(connection):
    """Integer counts are validated to float64, then sent as the worker's float dtype (cuML: float32)."""
    X = sp.csr_matrix(np.random.default_rng(3).integers(0, 3, (50, 8)))
    y = np.arange(50) % 2
    with sklearn_gpu_bridge.config_context(precision="native"):
        native = GPUMultinomialNB().fit(X, y).predict_proba(X)
    _agree(GPUMultinomialNB().fit(X, y).predict_proba(X), native)
