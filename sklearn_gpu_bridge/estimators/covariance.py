"""cuml.covariance: covariance estimators, declared (see spec.py)."""

from .methods import CovarianceExtras, ScoreTest
from .spec import remote_estimator

_BASES = (ScoreTest, CovarianceExtras)  # score(X_test) as scikit-learn names it; the rest computed locally

GPUEmpiricalCovariance = remote_estimator(
    "EmpiricalCovariance", "estimator", "*, store_precision=True, assume_centered=False", bases=_BASES,
    doc="maximum likelihood covariance estimator (``get_precision`` and ``error_norm`` are "
        "computed locally from ``covariance_``, as scikit-learn does).",
)

GPULedoitWolf = remote_estimator(
    "LedoitWolf", "estimator", "*, store_precision=True, assume_centered=False, block_size=1000", bases=_BASES,
    doc="Ledoit-Wolf shrunk covariance estimator.",
)

__all__ = ["GPUEmpiricalCovariance", "GPULedoitWolf"]
