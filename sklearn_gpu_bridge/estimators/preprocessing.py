from sklearn.base import OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import FLOAT_DTYPES

from .base import RemoteEstimator, RemoteInverseTransformer, float32_transformer_tags


class GPUStandardScaler(RemoteInverseTransformer, OneToOneFeatureMixin, TransformerMixin, RemoteEstimator):
    """cuml.preprocessing.StandardScaler: remove the mean, scale to unit variance.

    cuML's ``fit`` takes no ``sample_weight``, so neither does this one.
    """

    _remote_name = "StandardScaler"
    _validation = {"dtype": FLOAT_DTYPES, "ensure_all_finite": "allow-nan"}

    def __init__(self, *, copy=True, with_mean=True, with_std=True):
        self.copy = copy
        self.with_mean = with_mean
        self.with_std = with_std

    def __sklearn_tags__(self):
        tags = float32_transformer_tags(super().__sklearn_tags__())
        tags.input_tags.allow_nan = True
        return tags
