"""cuml.ensemble: random forests and isolation forest, declared (see spec.py)."""

import numpy as np

from .spec import remote_estimator

_FOREST = (
    "*, n_estimators=100, split_criterion={criterion!r}, bootstrap=True, max_samples=1.0, "
    "max_depth=None, max_leaves=-1, max_features={features!r}, n_bins=128, min_samples_leaf=1, "
    "min_samples_split=2, min_impurity_decrease=0.0, max_batch_size=4096, random_state=None, "
    "n_streams=4, oob_score=False{extra}"
)

GPURandomForestClassifier = remote_estimator(
    "RandomForestClassifier", "classifier",
    _FOREST.format(criterion="gini", features="sqrt", extra=", class_weight=None"),
    doc="random forest classifier (histogram splits, ``n_bins`` per feature).",
)

GPURandomForestRegressor = remote_estimator(
    "RandomForestRegressor", "regressor",
    _FOREST.format(criterion="mse", features=1.0, extra=""),
    doc="random forest regressor (histogram splits, ``n_bins`` per feature).",
)

class _Float64Scores:
    """Outlier scores in float64, as scikit-learn's outlier detectors give them (cuML: float32)."""

    def decision_function(self, X):
        return self._call_remote("decision_function", X).astype(np.float64)

    def score_samples(self, X):
        return self._call_remote("score_samples", X).astype(np.float64)


GPUIsolationForest = remote_estimator(
    "IsolationForest", "outlier-detector",
    "*, n_estimators=100, max_samples='auto', max_depth=None, max_features=1.0, bootstrap=False, "
    "random_state=None, contamination='auto'",
    bases=(_Float64Scores,),
    doc="isolation forest outlier detection (``predict``: 1 inlier, -1 outlier).",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
