"""cuml.linear_model: linear models, declared (see spec.py)."""

from scipy import sparse

from .spec import remote_estimator


class _SparseSolvers:
    """cuML fits sparse X with some solvers only; another one is refused before sending, in cuML's words."""

    _sparse_solvers = ()  #: the solvers that take sparse X
    _sparse_refusal = ""  #: cuML's message, formatted with ``solver``

    def _validate_fit(self, X, y, reset=True):
        X, y = super()._validate_fit(X, y, reset)
        if sparse.issparse(X) and self.solver not in self._sparse_solvers:
            raise ValueError(self._sparse_refusal.format(solver=self.solver))
        return X, y


class _RidgeSparse(_SparseSolvers):
    _sparse_solvers = ("auto", "lsmr")
    _sparse_refusal = "solver={solver!r} doesn't support sparse X, please select solver='lsmr' or solver='auto' instead"


class _CoordinateDescentSparse(_SparseSolvers):
    _sparse_solvers = ("auto", "qn")
    _sparse_refusal = "solver={solver!r} doesn't support sparse inputs, please use solver='auto' or solver='qn' instead"


GPULinearRegression = remote_estimator(
    "LinearRegression", "regressor",
    "*, algorithm='auto', fit_intercept=True, copy_X=True",
    doc="ordinary least squares (eig, svd or qr on the GPU; ``algorithm`` picks).",
)

GPULogisticRegression = remote_estimator(
    "LogisticRegression", "classifier",
    "*, penalty='l2', tol=1e-4, C=1.0, fit_intercept=True, class_weight=None, max_iter=1000, "
    "linesearch_max_iter=50, l1_ratio=None, solver='qn', lbfgs_memory=5, penalty_normalized=True",
    doc="logistic regression (quasi-Newton solver on the GPU).",
)

GPURidge = remote_estimator(
    "Ridge", "regressor",
    "alpha=1.0, *, fit_intercept=True, solver='auto', tol=1e-4, max_iter=None, copy_X=True",
    bases=(_RidgeSparse,), doc="linear least squares with l2 regularization.",
)

GPULasso = remote_estimator(
    "Lasso", "regressor",
    "alpha=1.0, *, fit_intercept=True, max_iter=1000, tol=1e-3, solver='auto', selection='cyclic'",
    bases=(_CoordinateDescentSparse,), doc="linear model with l1 regularization (coordinate descent or quasi-Newton).",
)

GPUElasticNet = remote_estimator(
    "ElasticNet", "regressor",
    "alpha=1.0, *, l1_ratio=0.5, fit_intercept=True, max_iter=1000, tol=1e-3, solver='auto', "
    "selection='cyclic'",
    bases=(_CoordinateDescentSparse,), doc="linear model with combined l1 and l2 regularization.",
)


class _BinaryOnly:
    """cuML's MBSGDClassifier is binary; so is this wrapper, on every backend."""

    def _validate_fit(self, X, y, reset=True):
        X, codes = super()._validate_fit(X, y, reset)
        if reset and len(self.classes_) > 2:
            raise ValueError(
                f"Only binary classification is supported. cuML's MBSGDClassifier got "
                f"{len(self.classes_)} classes"
            )
        return X, codes


_MBSGD_PARAMS = (
    "*, loss={loss!r}, penalty='l2', alpha=0.0001, l1_ratio=0.15, fit_intercept=True, epochs=1000, "
    "tol=1e-3, shuffle=True, learning_rate='constant', eta0=0.001, power_t=0.5, batch_size=32, "
    "n_iter_no_change=5"
)

GPUMBSGDClassifier = remote_estimator(
    "MBSGDClassifier", "classifier", _MBSGD_PARAMS.format(loss="hinge"), bases=(_BinaryOnly,),
    tags={"classifier_tags.multi_class": False},
    doc="binary linear classifier (hinge, log or squared loss) fitted by mini-batch SGD. "
        "The scikit-learn backend runs SGDClassifier with the translated parameters.",
)

GPUMBSGDRegressor = remote_estimator(
    "MBSGDRegressor", "regressor", _MBSGD_PARAMS.format(loss="squared_loss"),
    doc="linear regression fitted by mini-batch SGD. The scikit-learn backend runs "
        "SGDRegressor with the translated parameters.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
