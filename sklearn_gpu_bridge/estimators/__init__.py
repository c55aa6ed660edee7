"""The GPU* estimators: scikit-learn estimators whose work runs on the worker."""

from .cluster import GPUKMeans
from .decomposition import GPUPCA
from .linear_model import GPULogisticRegression
from .preprocessing import GPUStandardScaler
from .svm import GPUSVC

__all__ = ["GPUKMeans", "GPULogisticRegression", "GPUPCA", "GPUSVC", "GPUStandardScaler"]
