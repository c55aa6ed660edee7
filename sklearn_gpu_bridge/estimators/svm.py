"""cuml.svm: support vector machines, declared (see spec.py)."""

from .spec import remote_estimator

MULTICLASS = ("cuml", "sklearn")


class _MulticlassAnswers:
    """``multiclass`` and ``break_ties`` checked before anything is sent, in scikit-learn's words where it has them."""

    def fit(self, X, y, sample_weight=None):
        if self.multiclass not in MULTICLASS:
            raise ValueError(f"multiclass must be one of {MULTICLASS}, not {self.multiclass!r}")
        if self.break_ties and self.multiclass != "sklearn":
            raise ValueError("break_ties=True is scikit-learn's: it needs multiclass='sklearn'")
        return super().fit(X, y, sample_weight=sample_weight)

    def predict(self, X):
        if self.multiclass == "sklearn" and self.break_ties and self.decision_function_shape == "ovo":
            raise ValueError("break_ties must be False when decision_function_shape is 'ovo'")  # scikit-learn's
        return super().predict(X)


GPUSVC = remote_estimator(
    "SVC", "classifier",
    "*, C=1.0, kernel='rbf', degree=3, gamma='scale', coef0=0.0, tol=1e-3, cache_size=1024.0, "
    "max_iter=-1, nochange_steps=1000, random_state=None, class_weight=None, "
    "decision_function_shape='ovo', multiclass='cuml', break_ties=False",
    bases=(_MulticlassAnswers,),
    doc="C-support vector classification. Like cuML 26.10 (and scikit-learn >= 1.9, which "
        "deprecates ``probability``) it has no ``predict_proba``: wrap it in "
        "``CalibratedClassifierCV`` for probabilities.\n\n"
        "``multiclass`` (the bridge's own; two classes answer the same either way): "
        "``'cuml'``, cuML's multiclass SVC (one binary SVC per pair of classes for "
        "``decision_function_shape='ovo'``, per class for ``'ovr'``; a decision column per class). "
        "``'sklearn'``, scikit-learn's ``SVC``: one binary SVC per pair, fitted on the GPU with "
        "``gamma`` of the whole training set, its decision function a column per pair "
        "(``'ovo'``, positive for the pair's first class) or a column per class (``'ovr'``), "
        "``predict`` by the pairs' votes (ties to the lowest class, or by the ``'ovr'`` "
        "columns with ``break_ties=True``), class and sample weights as libsvm applies them; "
        "its fitted model (``sklearn_model_``) is scikit-learn's ``SVC``.",
)

GPUSVR = remote_estimator(
    "SVR", "regressor",
    "*, C=1.0, kernel='rbf', degree=3, gamma='scale', coef0=0.0, tol=1e-3, epsilon=0.1, "
    "cache_size=1024.0, max_iter=-1, nochange_steps=1000",
    doc="epsilon-support vector regression.",
)

GPULinearSVC = remote_estimator(
    "LinearSVC", "classifier",
    "*, penalty='l2', loss='squared_hinge', C=1.0, fit_intercept=True, penalized_intercept=False, "
    "class_weight=None, tol=1e-4, max_iter=1000, linesearch_max_iter=100, lbfgs_memory=5, "
    "n_streams=1, multi_class='ovr'",
    doc="linear support vector classification (quasi-Newton solver on the GPU).",
)

GPULinearSVR = remote_estimator(
    "LinearSVR", "regressor",
    "*, epsilon=0.0, penalty='l1', loss='epsilon_insensitive', C=1.0, fit_intercept=True, "
    "penalized_intercept=False, tol=1e-4, max_iter=1000, linesearch_max_iter=100, lbfgs_memory=5",
    doc="linear support vector regression.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
