"""cuml.cluster: clustering, declared (see spec.py)."""

from sklearn.base import TransformerMixin

from .spec import remote_estimator

GPUKMeans = remote_estimator(
    "KMeans", "clusterer",
    "*, n_clusters=8, max_iter=300, tol=1e-4, random_state=None, init='scalable-k-means++', "
    "n_init='auto', oversampling_factor=2.0, max_samples_per_batch=1<<15, device_buffer_samples=0, "
    "init_size=0",
    features_out=lambda self: self.cluster_centers_.shape[0], mixins=(TransformerMixin,),
    tags={"transformer_tags.preserves_dtype": ["float32"]},
    doc="k-means clustering (scalable k-means++ initialisation).",
)

GPUDBSCAN = remote_estimator(
    "DBSCAN", "clusterer",
    "*, eps=0.5, min_samples=5, metric='euclidean', algorithm='brute', max_mbytes_per_batch=None, "
    "calc_core_sample_indices=True",
    doc="density-based clustering (DBSCAN).",
)

GPUHDBSCAN = remote_estimator(
    "HDBSCAN", "clusterer",
    "*, min_cluster_size=5, min_samples=None, cluster_selection_epsilon=0.0, max_cluster_size=0, "
    "metric='euclidean', alpha=1.0, p=None, cluster_selection_method='eom', "
    "allow_single_cluster=False, gen_min_span_tree=False, prediction_data=False, "
    "build_algo='brute_force', build_kwds=None, device_ids=None",
    doc="hierarchical density-based clustering. cuML converts it to hdbscan.HDBSCAN; the "
        "scikit-learn backend runs sklearn.cluster.HDBSCAN.",
)

GPUSpectralClustering = remote_estimator(
    "SpectralClustering", "clusterer",
    "n_clusters=8, *, n_components=None, random_state=None, n_neighbors=10, n_init=10, "
    "eigen_tol='auto', affinity='nearest_neighbors'",
    doc="clustering on a projection of the normalized Laplacian.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
