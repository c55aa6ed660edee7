"""cuml.preprocessing: scalers, encoders and polynomial features, declared (see spec.py)."""

import numpy as np
from scipy import sparse
from sklearn.utils.validation import FLOAT_DTYPES, check_is_fitted, column_or_1d

from .methods import LabelTransformer
from .spec import remote_estimator

_SCALER = {
    "validation": {"dtype": FLOAT_DTYPES, "ensure_all_finite": "allow-nan"},
    "tags": {"input_tags.allow_nan": True, "transformer_tags.preserves_dtype": ["float32"]},
    "features_out": "one-to-one",
}

class _NoSparseCentering:
    """Centring a sparse matrix makes it dense: scikit-learn and cuML refuse it, and so does the client, first."""

    def _validate_fit(self, X, y, reset=True):
        X, y = super()._validate_fit(X, y, reset)
        if self.with_mean and sparse.issparse(X):
            raise ValueError("Cannot center sparse matrices: pass `with_mean=False` instead. "
                             "See docstring for motivation and alternatives.")
        return X, y

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = not self.with_mean  # as scikit-learn's StandardScaler says
        return tags


GPUStandardScaler = remote_estimator(
    "StandardScaler", "transformer", "*, copy=True, with_mean=True, with_std=True", **_SCALER,
    bases=(_NoSparseCentering,),
    doc="remove the mean and scale to unit variance. cuML's ``fit`` takes no "
        "``sample_weight``, so neither does this one.",
)

GPUMinMaxScaler = remote_estimator(
    "MinMaxScaler", "transformer", "feature_range=(0, 1), *, copy=True", **_SCALER,
    doc="scale each feature to ``feature_range``.",
)

GPUMaxAbsScaler = remote_estimator(
    "MaxAbsScaler", "transformer", "*, copy=True", **_SCALER,
    doc="scale each feature by its maximum absolute value.",
)


class _PolynomialNames:
    def get_feature_names_out(self, input_features=None):
        """Names of the output features (``x0 x1``, ``x0^2`` ...), as scikit-learn gives them.

        They depend only on the parameters and the input width, so a
        scikit-learn PolynomialFeatures fitted locally on one row of zeros names them.
        """
        from sklearn.preprocessing import PolynomialFeatures

        check_is_fitted(self)
        local = PolynomialFeatures(degree=self.degree, interaction_only=self.interaction_only,
                                   include_bias=self.include_bias, order=self.order)
        local.fit(np.zeros((1, self.n_features_in_)))
        if hasattr(self, "feature_names_in_"):
            local.feature_names_in_ = self.feature_names_in_
        return local.get_feature_names_out(input_features)


GPUPolynomialFeatures = remote_estimator(
    "PolynomialFeatures", "transformer",
    "degree=2, *, interaction_only=False, include_bias=True, order='C'", bases=(_PolynomialNames,),
    tags={"transformer_tags.preserves_dtype": ["float32"]},
    doc="polynomial and interaction features.",
)


class _LabelEncoder(LabelTransformer):
    def transform(self, y):
        """Codes of the labels; unseen labels: ValueError, or -1 with ``handle_unknown='ignore'``."""
        check_is_fitted(self)
        y = column_or_1d(y, warn=True)
        if self.handle_unknown == "error" or not len(y):
            return super().transform(y)
        known = np.isin(y, self.classes_)
        codes = np.full(len(y), -1, dtype=np.int64)
        if known.any():
            codes[known] = super().transform(y[known])
        return codes


GPULabelEncoder = remote_estimator(
    "LabelEncoder", "label-transformer", "*, handle_unknown='error'", bases=(_LabelEncoder,),
    doc="encode labels as integers ``0..n_classes-1``. Labels are encoded on the client "
        "(they may be strings, which cannot travel); the worker's model is fitted on the codes.",
)


class _LabelBinarizer(LabelTransformer):
    def _finish(self, result):
        return sparse.csr_matrix(result) if self.sparse_output else result

    def _empty(self):
        return np.zeros((0, 1 if len(self.classes_) <= 2 else len(self.classes_)), dtype=np.int64)

    def inverse_transform(self, Y, threshold=None):
        """Labels from a binary indicator matrix (or decision scores, with ``threshold``)."""
        check_is_fitted(self)
        if sparse.issparse(Y):
            Y = Y.toarray()
        codes = self._run("inverse_transform", [np.asarray(Y)], {"threshold": threshold})
        return self.classes_.take(np.asarray(codes, dtype=np.intp))


GPULabelBinarizer = remote_estimator(
    "LabelBinarizer", "label-transformer", "*, neg_label=0, pos_label=1, sparse_output=False",
    bases=(_LabelBinarizer,), wire={"sparse_output": False},
    doc="labels to a one-vs-all indicator matrix. Labels are encoded on the client; sparse output "
        "travels dense and is made sparse on the client.",
)


class _SparseOutput:
    """Sparse matrices do not travel: the worker answers dense, the client makes it sparse."""

    def transform(self, X):
        return self._sparse_if_asked(super().transform(X))

    def fit_transform(self, X, y=None):
        return self._sparse_if_asked(super().fit_transform(X, y))

    def _sparse_if_asked(self, out):
        return sparse.csr_matrix(out) if self.sparse_output else out

    def inverse_transform(self, X):
        check_is_fitted(self)
        if sparse.issparse(X):
            X = X.toarray()
        model = self.sklearn_model_
        if model is not None and any(c.dtype.kind not in "biuf" for c in model.categories_):
            # string categories cannot travel back: the carried scikit-learn model answers
            return model.inverse_transform(X)
        return super().inverse_transform(X)


GPUOneHotEncoder = remote_estimator(
    "OneHotEncoder", "transformer",
    "*, categories='auto', drop=None, sparse_output=True, dtype=np.float32, handle_unknown='error'",
    bases=(_SparseOutput,),
    features_out="model", validation={"dtype": None, "ensure_all_finite": "allow-nan"},
    wire={"sparse_output": False},
    tags={"input_tags.categorical": True, "input_tags.allow_nan": True,
          "transformer_tags.preserves_dtype": []},
    doc="one-hot encoding of categorical features. String categories travel as lists; sparse "
        "output travels dense and is made sparse on the client.",
)


class _TargetEncoderNames:
    def get_feature_names_out(self, input_features=None):
        """The fitted model's names; cuML's own rule where it has no scikit-learn form."""
        check_is_fitted(self)
        model = self.sklearn_model_
        if model is not None:
            if input_features is None and hasattr(self, "feature_names_in_"):
                input_features = self.feature_names_in_
            return model.get_feature_names_out(input_features)
        if self.multi_feature_mode == "independent" or self.n_features_in_ == 1:
            if input_features is not None:
                return np.asarray(input_features, dtype=object)
            names = getattr(self, "feature_names_in_", None)
            return names if names is not None else np.asarray(
                [f"x{i}" for i in range(self.n_features_in_)], dtype=object)
        return np.asarray(["targetencoder0"], dtype=object)


GPUTargetEncoder = remote_estimator(
    "TargetEncoder", "supervised-transformer",
    "*, n_folds=4, smooth=0, seed=42, split_method='interleaved', stat='mean', "
    "multi_feature_mode='combination'", bases=(_TargetEncoderNames,), validation={"dtype": None},
    tags={"input_tags.categorical": True, "target_tags.required": True,
          "transformer_tags.preserves_dtype": []},
    doc="encode categories by the mean of the target (cross-fitted in ``fit_transform``).",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
