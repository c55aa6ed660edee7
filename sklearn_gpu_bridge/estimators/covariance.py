"""cuml.covariance: covariance estimators, declared (see spec.py)."""

from .spec import remote_estimator

_METHODS = "score_test mahalanobis covariance_extras"

GPUEmpiricalCovariance = remote_estimator(
    "EmpiricalCovariance", "estimator", "*, store_precision=True, assume_centered=False",
    methods=_METHODS,
    doc="maximum likelihood covariance estimator (``get_precision`` and ``error_norm`` are "
        "computed locally from ``covariance_``, as scikit-learn does).",
)

GPULedoitWolf = remote_estimator(
    "LedoitWolf", "estimator", "*, store_precision=True, assume_centered=False, block_size=1000",
    methods=_METHODS,
    doc="Ledoit-Wolf shrunk covariance estimator.",
)

__all__ = ["GPUEmpiricalCovariance", "GPULedoitWolf"]
