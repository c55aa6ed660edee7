from sklearn.base import ClassifierMixin

from .base import RemoteClassifier, RemoteEstimator


class GPUSVC(RemoteClassifier, ClassifierMixin, RemoteEstimator):
    """cuml.svm.SVC: C-support vector classification.

    Like cuML 26.10 (and scikit-learn >= 1.9, which deprecates ``probability``),
    it has no ``predict_proba``: wrap it in ``CalibratedClassifierCV`` for
    probabilities.
    """

    _remote_name = "SVC"

    def __init__(self, *, C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, tol=1e-3,
                 cache_size=1024.0, max_iter=-1, nochange_steps=1000, random_state=None,
                 class_weight=None, decision_function_shape="ovo"):
        self.C = C
        self.kernel = kernel
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0
        self.tol = tol
        self.cache_size = cache_size
        self.max_iter = max_iter
        self.nochange_steps = nochange_steps
        self.random_state = random_state
        self.class_weight = class_weight
        self.decision_function_shape = decision_function_shape
