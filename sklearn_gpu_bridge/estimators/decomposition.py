from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin

from .base import RemoteEstimator, RemoteInverseTransformer, float32_transformer_tags


class GPUPCA(RemoteInverseTransformer, ClassNamePrefixFeaturesOutMixin, TransformerMixin, RemoteEstimator):
    """cuml.decomposition.PCA: principal component analysis."""

    _remote_name = "PCA"

    def __init__(self, *, copy=True, iterated_power=15, n_components=None, svd_solver="auto",
                 tol=1e-7, whiten=False):
        self.copy = copy
        self.iterated_power = iterated_power
        self.n_components = n_components
        self.svd_solver = svd_solver
        self.tol = tol
        self.whiten = whiten

    def __sklearn_tags__(self):
        return float32_transformer_tags(super().__sklearn_tags__())

    @property
    def _n_features_out(self):
        return self.components_.shape[0]
