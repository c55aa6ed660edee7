"""cuml.manifold: embeddings (t-SNE, UMAP, spectral), declared (see spec.py)."""

from .spec import remote_estimator


def _n_embedded(self):
    return self.embedding_.shape[1]


GPUTSNE = remote_estimator(
    "TSNE", "transformer",
    "*, n_components=2, perplexity=30.0, early_exaggeration=12.0, late_exaggeration=1.0, "
    "learning_rate=200.0, max_iter=1000, n_iter_without_progress=300, min_grad_norm=1e-07, "
    "metric='euclidean', metric_params=None, init='random', random_state=None, method='fft', "
    "angle=0.5, n_neighbors=90, perplexity_max_iter=100, exaggeration_iter=250, pre_momentum=0.5, "
    "post_momentum=0.8, learning_rate_method='adaptive', square_distances=True, precomputed_knn=None",
    features_out=_n_embedded,
    doc="t-distributed stochastic neighbor embedding (FFT or Barnes-Hut on the GPU); like "
        "scikit-learn's it has no ``transform``.",
)

GPUUMAP = remote_estimator(
    "UMAP", "transformer",
    "*, n_neighbors=15, n_components=2, metric='euclidean', metric_kwds=None, n_epochs=None, "
    "learning_rate=1.0, min_dist=0.1, spread=1.0, set_op_mix_ratio=1.0, local_connectivity=1.0, "
    "repulsion_strength=1.0, negative_sample_rate=5, transform_queue_size=4.0, init='spectral', "
    "a=None, b=None, target_n_neighbors=-1, target_weight=0.5, target_metric='categorical', "
    "hash_input=False, random_state=None, force_serial_epochs=None, precomputed_knn=None, "
    "callback=None, build_algo='auto', build_kwds=None, device_ids=None",
    features_out=_n_embedded,
    tags={"transformer_tags.preserves_dtype": ["float32"]},  # cuML and umap-learn embed in float32
    doc="uniform manifold approximation and projection. Its CPU counterpart is umap-learn's "
        "``umap.UMAP`` (the scikit-learn backend needs umap-learn installed on the worker).",
)

GPUSpectralEmbedding = remote_estimator(
    "SpectralEmbedding", "estimator",
    "n_components=2, affinity='nearest_neighbors', random_state=None, n_neighbors=None",
    doc="spectral embedding of the affinity graph (Laplacian eigenmaps).",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
