from sklearn.base import OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import FLOAT_DTYPES

from .base import RemoteEstimator, RemoteInverseTransformer


class GPUStandardScaler(OneToOneFeatureMixin, TransformerMixin, RemoteInverseTransformer, RemoteEstimator):
    """cuml.preprocessing.StandardScaler: remove the mean, scale to unit variance."""

    _remote_name = "StandardScaler"
    _validation = {"dtype": FLOAT_DTYPES, "ensure_all_finite": "allow-nan"}

    def __init__(self, *, copy=True, with_mean=True, with_std=True):
        self.copy = copy
        self.with_mean = with_mean
        self.with_std = with_std

    def fit(self, X, y=None, sample_weight=None):
        self._fit_remote("fit", X, sample_weight=sample_weight)
        return self

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags
