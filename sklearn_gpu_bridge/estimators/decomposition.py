"""cuml.decomposition: matrix decompositions, declared (see spec.py)."""

from .spec import remote_estimator

_F32 = {"transformer_tags.preserves_dtype": ["float32"]}


def _n_components(self):
    return self.components_.shape[0]


GPUPCA = remote_estimator(
    "PCA", "transformer",
    "*, copy=True, iterated_power=15, n_components=None, svd_solver='auto', tol=1e-7, whiten=False",
    features_out=_n_components, tags=_F32,
    doc="principal component analysis.",
)

GPUIncrementalPCA = remote_estimator(
    "IncrementalPCA", "transformer",
    "*, n_components=None, whiten=False, copy=True, batch_size=None",
    features_out=_n_components,
    tags={"transformer_tags.preserves_dtype": []},  # scikit-learn's computes in float64
    doc="incremental principal component analysis (fits in batches; ``partial_fit`` adds one).",
)

GPUTruncatedSVD = remote_estimator(
    "TruncatedSVD", "transformer",
    "*, algorithm='full', n_components=1, n_iter=15, random_state=None, tol=1e-7",
    features_out=_n_components, tags=_F32,
    doc="dimensionality reduction by truncated SVD (no centering).",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
