"""cuml.neighbors: nearest neighbors and kernel density, declared (see spec.py)."""

from .spec import remote_estimator

_NEIGHBORS = (
    "*, n_neighbors=5, {radius}algorithm='auto', metric='euclidean', {weights}p=2, algo_params=None, "
    "metric_params=None, n_jobs=None"
)

GPUNearestNeighbors = remote_estimator(
    "NearestNeighbors", "estimator", _NEIGHBORS.format(radius="radius=1.0, ", weights=""),
    doc="unsupervised nearest-neighbors search; ``kneighbors`` returns (distances, indices), "
        "``kneighbors_graph`` is built locally from them.",
)

GPUKNeighborsClassifier = remote_estimator(
    "KNeighborsClassifier", "classifier", _NEIGHBORS.format(radius="", weights="weights='uniform', "),
    doc="classification by vote of the k nearest neighbors.",
)

GPUKNeighborsRegressor = remote_estimator(
    "KNeighborsRegressor", "regressor", _NEIGHBORS.format(radius="", weights="weights='uniform', "),
    doc="regression on the k nearest neighbors.",
)

GPUKernelDensity = remote_estimator(
    "KernelDensity", "estimator",
    "*, bandwidth=1.0, kernel='gaussian', metric='euclidean', metric_params=None",
    doc="kernel density estimation.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
