import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils._available_if import available_if

from .base import RemoteClassifier, RemoteEstimator


def _has_probability(estimator):
    if estimator.probability is not True:
        raise AttributeError("predict_proba is not available when probability=False")
    return True


class GPUSVC(ClassifierMixin, RemoteClassifier, RemoteEstimator):
    """cuml.svm.SVC: C-support vector classification."""

    _remote_name = "SVC"

    def __init__(self, *, C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, tol=1e-3,
                 cache_size=1024.0, class_weight=None, max_iter=-1, nochange_steps=1000,
                 probability=False, random_state=None, multiclass_strategy="ovo"):
        self.C = C
        self.kernel = kernel
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0
        self.tol = tol
        self.cache_size = cache_size
        self.class_weight = class_weight
        self.max_iter = max_iter
        self.nochange_steps = nochange_steps
        self.probability = probability
        self.random_state = random_state
        self.multiclass_strategy = multiclass_strategy

    @available_if(_has_probability)
    def predict_proba(self, X):
        return self._call_remote("predict_proba", X)

    @available_if(_has_probability)
    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))
