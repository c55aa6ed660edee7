"""cuml.kernel_ridge, declared (see spec.py)."""

from .spec import remote_estimator

GPUKernelRidge = remote_estimator(
    "KernelRidge", "regressor",
    "*, alpha=1, kernel='linear', gamma=None, degree=3, coef0=1, kernel_params=None",
    doc="kernel ridge regression.",
)

__all__ = ["GPUKernelRidge"]
