"""cuml.decomposition: matrix decompositions, declared (see spec.py)."""

from scipy import sparse
from sklearn.utils.validation import check_array, check_is_fitted

from .spec import remote_estimator

_F32 = {"transformer_tags.preserves_dtype": ["float32"]}


def _n_components(self):
    return self.components_.shape[0]


GPUPCA = remote_estimator(
    "PCA", "transformer",
    "*, copy=True, iterated_power=15, n_components=None, svd_solver='auto', tol=1e-7, whiten=False",
    features_out=_n_components, tags=_F32,
    doc="principal component analysis.",
)

GPUIncrementalPCA = remote_estimator(
    "IncrementalPCA", "transformer",
    "*, n_components=None, whiten=False, copy=True, batch_size=None",
    features_out=_n_components,
    tags={"transformer_tags.preserves_dtype": []},  # scikit-learn's computes in float64
    doc="incremental principal component analysis (fits in batches; ``partial_fit`` adds one).",
)


class _SparseTruncatedSVD:
    """Sparse X (CSR) is factored by scikit-learn's randomized SVD on the worker (cuML's class takes dense X
    only): what scikit-learn refuses of it is refused here, in its words, before anything is sent."""

    def _validate_fit(self, X, y, reset=True):
        X, y = super()._validate_fit(X, y, reset)
        k = (self._accel_params or {}).get("n_components", self.n_components)
        if sparse.issparse(X) and isinstance(k, int) and k > X.shape[1]:
            raise ValueError(f"n_components({k}) must be <= n_features({X.shape[1]}).")
        return X, y

    def inverse_transform(self, X):
        check_is_fitted(self)
        check_array(X)  # dense only, as scikit-learn's inverse_transform takes it
        return self._call_remote("inverse_transform", X, in_output_space=True)


GPUTruncatedSVD = remote_estimator(
    "TruncatedSVD", "transformer",
    "*, algorithm='full', n_components=1, n_iter=15, random_state=None, tol=1e-7",
    features_out=_n_components, tags=_F32, bases=(_SparseTruncatedSVD,),
    doc="dimensionality reduction by truncated SVD (no centering). Dense X: cuML's solver (``algorithm``). "
        "Sparse X (CSR; LSA): scikit-learn's randomized SVD on the worker, never densified, with the parameters "
        "cuML's ``as_sklearn()`` gives (``n_iter=15`` is scikit-learn's 5, ``random_state`` kept, "
        "``n_oversamples=10``, ``power_iteration_normalizer='auto'``).",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
