from sklearn.base import ClassifierMixin

from .base import RemoteEstimator, RemoteProbabilisticClassifier


class GPULogisticRegression(RemoteProbabilisticClassifier, ClassifierMixin, RemoteEstimator):
    """cuml.linear_model.LogisticRegression (quasi-Newton solver on the GPU)."""

    _remote_name = "LogisticRegression"

    def __init__(self, *, penalty="l2", tol=1e-4, C=1.0, fit_intercept=True, class_weight=None,
                 max_iter=1000, linesearch_max_iter=50, l1_ratio=None, solver="qn", lbfgs_memory=5,
                 penalty_normalized=True):
        self.penalty = penalty
        self.tol = tol
        self.C = C
        self.fit_intercept = fit_intercept
        self.class_weight = class_weight
        self.max_iter = max_iter
        self.linesearch_max_iter = linesearch_max_iter
        self.l1_ratio = l1_ratio
        self.solver = solver
        self.lbfgs_memory = lbfgs_memory
        self.penalty_normalized = penalty_normalized
