"""TruncatedSVD of sparse X on the worker: scikit-learn's randomized SVD, on the GPU (CuPy) or the CPU (SciPy).

cuML's TruncatedSVD takes dense X only, so a sparse X (LSA: TF-IDF, then
TruncatedSVD) is computed here, never made dense: the randomized range finder
of Halko, Martinsson and Tropp (2011) with power iterations, each step
normalized by LU or QR, as ``sklearn.utils.extmath.randomized_svd`` computes
it and ``sklearn.decomposition.TruncatedSVD`` uses it: the same parameters
(``n_components``, ``n_iter``, ``n_oversamples``, ``power_iteration_normalizer``,
``random_state``), the same transposition of a wide X, the same signs
(``svd_flip`` on the rows of ``components_``), the same fitted attributes.

- The cuML backend computes it with ``cupyx.scipy.sparse`` (cuSPARSE) and
  CuPy's LU, QR and SVD (cuSOLVER) in X's dtype (float32 as sent); its normal
  draws are CuPy's, seeded from ``random_state``.
- The scikit-learn backend (the CPU stand-in) runs the same steps with
  scipy.sparse and LAPACK, the calls scikit-learn makes, with scikit-learn's
  draws: its model equals scikit-learn's ``TruncatedSVD`` fitted on that X.

``algorithm="arpack"`` (scikit-learn's parameter, under accel) has no solver
here: it runs the randomized one with at least as many oversamples as
components and :data:`ARPACK_ITERATIONS` power iterations normalized by LU, which on TF-IDF
matrices gives ARPACK's singular values to about 1e-5 (relative).

The fitted model is scikit-learn's ``TruncatedSVD`` with those attributes
(the portable form as it is); the cuML backend keeps cuML's, made from it by
cuML's own ``from_sklearn``, so that dense input still goes to cuML's
``transform``. A sparse X given to a fitted model's ``transform`` is
multiplied by ``components_.T`` in place, on the device on the cuML backend.
"""

import logging

import numpy as np

log = logging.getLogger(__name__)

#: the catalogue row this module serves
NAME = "TruncatedSVD"
#: power iterations at least, where scikit-learn's parameters ask for ARPACK's (near exact) answer
ARPACK_ITERATIONS = 15


def serves(name, args):
    """Whether a request is TruncatedSVD with a sparse X (scipy.sparse, as decoded): this module's work."""
    if name != NAME or not args:
        return False
    import scipy.sparse

    return scipy.sparse.issparse(args[0])


def fit(backend, params, method, args, params_from=None):
    """Fit TruncatedSVD on ``args[0]`` (sparse) with ``method`` ("fit" or "fit_transform"): (estimator, result).

    ``params``: the wrapper's (cuML's names, translated as cuML's ``as_sklearn()`` does) or, with
    ``params_from="sklearn"`` (accel), scikit-learn's class's own. ``backend.device_resident``: on the GPU.
    """
    X = args[0]
    model = sklearn_model(params, params_from)
    on_device = bool(getattr(backend, "device_resident", False))
    ops = _OnDevice() if on_device else _OnHost()
    X_transformed = _fit(model, ops.matrix(X), ops)
    estimator = _as_backend_model(backend, model) if on_device else model
    return estimator, (X_transformed if method == "fit_transform" else estimator)


def transform(backend, estimator, X):
    """``estimator.transform(X)`` for a sparse X: on the device on the cuML backend (``X @ components_.T``)."""
    if not getattr(backend, "device_resident", False):
        return estimator.transform(X)
    import cupy

    n_features = getattr(estimator, "n_features_in_", None)
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, but TruncatedSVD is expecting {n_features} features "
                         "as input.")
    ops = _OnDevice()
    components = cupy.asarray(estimator.components_)  # CuPy already under the cuML backend's transform output
    Xd = ops.matrix(X)
    return Xd @ components.T.astype(Xd.dtype, copy=False)


def sklearn_model(params, params_from=None):
    """An unfitted ``sklearn.decomposition.TruncatedSVD`` for the request's parameters, checked by scikit-learn."""
    from sklearn.decomposition import TruncatedSVD

    from sklearn_gpu_bridge.translate import to_sklearn

    if params_from is None:
        params = to_sklearn(NAME, params)
    elif params_from != "sklearn":
        from sklearn_gpu_bridge.errors import ProtocolError

        raise ProtocolError(f"unknown params_from {params_from!r}")
    takes = TruncatedSVD().get_params()
    model = TruncatedSVD(**{k: v for k, v in params.items() if k in takes})
    model._validate_params()  # scikit-learn's own errors for its parameters
    return model


def solver_settings(model, shape):
    """(n_oversamples, n_iter, power_iteration_normalizer) the randomized solver runs with for ``model``."""
    n_oversamples, n_iter = model.n_oversamples, model.n_iter
    if model.algorithm == "arpack":
        k = model.n_components
        if not 0 < k < min(shape):
            raise ValueError(f"`k` must be an integer satisfying `0 < k < min(A.shape)`; got k={k}, "
                             f"A.shape={tuple(shape)}")  # SciPy's svds, as scikit-learn's arpack path calls it
        # ARPACK takes none of the randomized solver's parameters: enough of each, and a stable normalizer
        n_oversamples = min(max(n_oversamples, k), min(shape) - k)
        return n_oversamples, max(n_iter, ARPACK_ITERATIONS), "LU"
    if model.n_components > shape[1]:
        raise ValueError(f"n_components({model.n_components}) must be <= n_features({shape[1]}).")
    normalizer = model.power_iteration_normalizer
    if normalizer == "auto":
        normalizer = "none" if n_iter <= 2 else "LU"
    return n_oversamples, n_iter, normalizer


def _fit(model, X, ops):
    """Fit ``model`` (scikit-learn's TruncatedSVD) on ``X`` with ``ops``' arrays; returns ``X @ components_.T``.

    The steps of scikit-learn's ``TruncatedSVD.fit_transform`` (randomized) and ``_randomized_svd``: a wide X is
    factored transposed; signs follow the largest entry of each row of ``components_``.
    """
    from sklearn.utils.validation import check_random_state

    n_samples, n_features = X.shape
    if n_features < 2:
        raise ValueError(f"Found array with {n_features} feature(s) (shape={X.shape}) while a minimum of 2 is "
                         "required by TruncatedSVD.")
    k = model.n_components
    n_oversamples, n_iter, normalizer = solver_settings(model, X.shape)
    transpose = n_samples < n_features
    M, Mt = ops.transposed(X) if transpose else (X, ops.transpose(X))
    random_state = check_random_state(model.random_state)

    Q = ops.gaussian(random_state, (M.shape[1], k + n_oversamples), M.dtype)
    normalize = {"QR": ops.qr, "LU": ops.lu, "none": lambda A: (A, None)}[normalizer]
    for _ in range(n_iter):
        Q, _ = normalize(M @ Q)
        Q, _ = normalize(Mt @ Q)
    Q, _ = ops.qr(M @ Q)
    Uhat, s, Vt = ops.projected_svd(Q, M, Mt)
    VT = (Q @ Uhat)[:, :k].T if transpose else Vt[:k, :]
    VT = ops.flip(VT)

    X_transformed = X @ VT.T
    model.components_ = ops.host(VT)
    model.explained_variance_ = ops.host(ops.var(X_transformed))
    model.explained_variance_ratio_ = model.explained_variance_ / ops.total_variance(X)
    model.singular_values_ = ops.host(s[:k])
    model.n_features_in_ = n_features
    return X_transformed


class _OnHost:
    """scipy.sparse and LAPACK: the calls scikit-learn's randomized SVD makes, so the same numbers."""

    @staticmethod
    def matrix(X):
        return X.tocsr() if X.format not in ("csr", "csc") else X

    @staticmethod
    def transpose(X):
        return X.T

    def transposed(self, X):
        return X.T, X

    @staticmethod
    def gaussian(random_state, shape, dtype):
        Q = random_state.normal(size=shape)
        return Q.astype(np.float32, copy=False) if dtype == np.float32 else Q

    @staticmethod
    def lu(A):
        from scipy import linalg

        return linalg.lu(A, permute_l=True, check_finite=False)

    @staticmethod
    def qr(A):
        from scipy import linalg

        return linalg.qr(A, mode="economic", check_finite=False)

    @staticmethod
    def projected_svd(Q, M, Mt):
        from scipy import linalg

        return linalg.svd(Q.T @ M, full_matrices=False, lapack_driver="gesdd")

    @staticmethod
    def flip(VT):
        from sklearn.utils.extmath import svd_flip

        return svd_flip(None, VT, u_based_decision=False)[1]

    @staticmethod
    def var(X_transformed):
        return np.var(X_transformed, axis=0)

    @staticmethod
    def total_variance(X):
        from sklearn.utils.sparsefuncs import mean_variance_axis

        return mean_variance_axis(X, axis=0)[1].sum()

    @staticmethod
    def host(value):
        return value


class _OnDevice:
    """cupyx.scipy.sparse (cuSPARSE) and CuPy's LU, QR and SVD (cuSOLVER): the same steps on the GPU."""

    def __init__(self):
        import cupy
        import cupyx.scipy.sparse

        self.cupy, self.sparse = cupy, cupyx.scipy.sparse

    def matrix(self, X):
        """A scipy.sparse X as a CuPy CSR matrix (32-bit indices, as cuSPARSE's routines here take them)."""
        X = X.tocsr() if X.format != "csr" else X
        if X.nnz >= 2**31 or max(X.shape) >= 2**31:
            raise ValueError(f"a sparse X of {X.nnz} values and shape {X.shape} needs 64-bit indices, "
                             "which TruncatedSVD on the GPU does not take")
        cp = self.cupy
        return self.sparse.csr_matrix(
            (cp.asarray(X.data), cp.asarray(X.indices, dtype=cp.int32), cp.asarray(X.indptr, dtype=cp.int32)),
            shape=X.shape)

    @staticmethod
    def transpose(X):
        return X.T.tocsr()  # its own CSR: cuSPARSE multiplies a transposed CSR several times slower

    def transposed(self, X):
        return X.T.tocsr(), X

    def gaussian(self, random_state, shape, dtype):
        seed = int(random_state.randint(np.iinfo(np.int32).max))
        return self.cupy.random.RandomState(seed).standard_normal(shape, dtype=dtype)

    @staticmethod
    def lu(A):
        from cupyx.scipy.linalg import lu

        return lu(A, permute_l=True, overwrite_a=True, check_finite=False)

    def qr(self, A):
        return self.cupy.linalg.qr(A, mode="reduced")

    def projected_svd(self, Q, M, Mt):
        """svd(Q.T @ M), wide: through the QR of its transpose (tall), then the SVD of the small R."""
        cp = self.cupy
        Qb, Rb = cp.linalg.qr(Mt @ Q, mode="reduced")  # (Q.T @ M).T = Qb @ Rb
        W, s, Zt = cp.linalg.svd(Rb.T, full_matrices=False)  # Q.T @ M = Rb.T @ Qb.T = W s (Qb @ Zt.T).T
        return W, s, Zt @ Qb.T

    def flip(self, VT):
        cp = self.cupy
        rows = cp.arange(VT.shape[0])
        signs = cp.sign(VT[rows, cp.argmax(cp.abs(VT), axis=1)])
        signs[signs == 0] = 1
        return VT * signs[:, None]

    def var(self, X_transformed):
        return self.cupy.var(X_transformed, axis=0)

    def total_variance(self, X):
        """The sum of X's column variances (zeros counted), in float64: sum(x**2)/n - sum(mean**2)."""
        cp = self.cupy
        n_samples, n_features = X.shape
        data = X.data.astype(cp.float64)
        column_sums = cp.bincount(X.indices, weights=data, minlength=n_features)
        total = float((data * data).sum()) / n_samples - float(((column_sums / n_samples) ** 2).sum())
        return np.asarray(total, dtype=X.dtype)

    @staticmethod
    def host(value):
        return value.get()


def _as_backend_model(backend, model):
    """cuML's TruncatedSVD made from the fitted scikit-learn ``model`` (cuML's ``from_sklearn``), so that dense
    input goes to cuML's own transform; the scikit-learn model itself where cuML does not take it."""
    cls = backend.estimator_class(NAME)
    try:
        return cls.from_sklearn(model)
    except Exception as exc:  # noqa: BLE001 - scikit-learn's model still answers (on the host), said
        log.warning("TruncatedSVD: cuML does not take the sparse fit's model (%s: %s); it answers on the CPU",
                    type(exc).__name__, exc)
        return model
