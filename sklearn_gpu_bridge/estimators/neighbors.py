"""cuml.neighbors: nearest neighbors and kernel density, declared (see spec.py)."""

from scipy import sparse

from ..protocol.arrays import check_finite_now
from .base import _NO_X
from .spec import remote_estimator


class _SparseNeighbors:
    """Sparse input as cuML takes it: brute force only; queries in the fit's kind (dense ones sent as CSR).

    cuML refuses a dense query to a model fitted on sparse data, and the other
    way round; scikit-learn answers both, so the client converts the query.
    """

    def _validate_fit(self, X, y, reset=True):
        X, y = super()._validate_fit(X, y, reset)
        self._fitted_on_sparse = sparse.issparse(X)
        if self._fitted_on_sparse and self.algorithm not in ("auto", "brute"):
            raise ValueError(f"algorithm={self.algorithm!r} doesn't support sparse data")
        return X, y

    def _validate(self, X, y=_NO_X, **kwargs):
        X = super()._validate(X, y, **kwargs)
        if y is not _NO_X or kwargs.get("reset", True):  # fitting
            return X
        if getattr(self, "_fitted_on_sparse", False) and not sparse.issparse(X):
            return sparse.csr_matrix(check_finite_now(X))
        if not getattr(self, "_fitted_on_sparse", True) and sparse.issparse(X):
            return X.toarray()
        return X


_NEIGHBORS = (
    "*, n_neighbors=5, {radius}algorithm='auto', metric='euclidean', {weights}p=2, algo_params=None, "
    "metric_params=None, n_jobs=None"
)

GPUNearestNeighbors = remote_estimator(
    "NearestNeighbors", "estimator", _NEIGHBORS.format(radius="radius=1.0, ", weights=""),
    bases=(_SparseNeighbors,),
    doc="unsupervised nearest-neighbors search; ``kneighbors`` returns (distances, indices), "
        "``kneighbors_graph`` is built locally from them.",
)

GPUKNeighborsClassifier = remote_estimator(
    "KNeighborsClassifier", "classifier", _NEIGHBORS.format(radius="", weights="weights='uniform', "),
    bases=(_SparseNeighbors,), doc="classification by vote of the k nearest neighbors.",
)

GPUKNeighborsRegressor = remote_estimator(
    "KNeighborsRegressor", "regressor", _NEIGHBORS.format(radius="", weights="weights='uniform', "),
    bases=(_SparseNeighbors,), doc="regression on the k nearest neighbors.",
)

GPUKernelDensity = remote_estimator(
    "KernelDensity", "estimator",
    "*, bandwidth=1.0, kernel='gaussian', metric='euclidean', metric_params=None",
    doc="kernel density estimation.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
