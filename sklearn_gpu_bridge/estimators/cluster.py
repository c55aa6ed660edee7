from sklearn.base import ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin

from .base import RemoteClusterer, RemoteEstimator, RemoteTransformer, float32_transformer_tags


class GPUKMeans(RemoteClusterer, RemoteTransformer, ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                ClusterMixin, RemoteEstimator):
    """cuml.cluster.KMeans: k-means clustering (scalable k-means++ initialisation)."""

    _remote_name = "KMeans"

    def __init__(self, *, n_clusters=8, max_iter=300, tol=1e-4, random_state=None,
                 init="scalable-k-means++", n_init="auto", oversampling_factor=2.0,
                 max_samples_per_batch=1 << 15, device_buffer_samples=0, init_size=0):
        self.n_clusters = n_clusters
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.init = init
        self.n_init = n_init
        self.oversampling_factor = oversampling_factor
        self.max_samples_per_batch = max_samples_per_batch
        self.device_buffer_samples = device_buffer_samples
        self.init_size = init_size

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit and return distances to the centers in one round trip."""
        return self._fit_remote("fit_transform", X, sample_weight=sample_weight)

    def score(self, X, y=None, sample_weight=None):
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return self._call_remote("score", X, **kwargs)

    def __sklearn_tags__(self):
        return float32_transformer_tags(super().__sklearn_tags__())

    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[0]
