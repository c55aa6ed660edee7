"""cuml.svm: support vector machines, declared (see spec.py)."""

from .spec import remote_estimator

GPUSVC = remote_estimator(
    "SVC", "classifier",
    "*, C=1.0, kernel='rbf', degree=3, gamma='scale', coef0=0.0, tol=1e-3, cache_size=1024.0, "
    "max_iter=-1, nochange_steps=1000, random_state=None, class_weight=None, "
    "decision_function_shape='ovo'",
    doc="C-support vector classification. Like cuML 26.10 (and scikit-learn >= 1.9, which "
        "deprecates ``probability``) it has no ``predict_proba``: wrap it in "
        "``CalibratedClassifierCV`` for probabilities.",
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
