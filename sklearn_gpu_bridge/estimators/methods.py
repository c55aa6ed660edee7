"""The public methods of the wrappers: one small mixin per method.

One per method (and per signature, where scikit-learn's differs: estimator
checks read ``fit``'s signature for ``sample_weight``). ``spec.py`` puts the
ones a class has (the catalogue's list) FIRST in its bases, so that the
one-trip fit_transform / fit_predict win over scikit-learn's mixins (which
would fit, then make a second trip). Each is a line or two around
:meth:`RemoteEstimator._fit_remote` or :meth:`RemoteEstimator._call_remote`.
"""

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, column_or_1d

from .base import decode_labels


class FitSupervised:
    def fit(self, X, y):
        self._fit_remote("fit", X, y)
        return self


class FitSupervisedWeighted:
    def fit(self, X, y, sample_weight=None):
        self._fit_remote("fit", X, y, sample_weight=sample_weight)
        return self


class FitUnsupervised:
    def fit(self, X, y=None):
        self._fit_remote("fit", X)
        return self


class FitUnsupervisedWeighted:
    def fit(self, X, y=None, sample_weight=None):
        self._fit_remote("fit", X, sample_weight=sample_weight)
        return self


class Predict:
    def predict(self, X):
        result = self._call_remote("predict", X)
        return decode_labels(self, result) if self._target == "labels" else result


class PredictProba:
    def predict_proba(self, X):
        return self._call_remote("predict_proba", X)


class PredictLogProba:
    def predict_log_proba(self, X):
        return self._call_remote("predict_log_proba", X)


class DecisionFunction:
    def decision_function(self, X):
        return self._call_remote("decision_function", X)


class ScoreSamples:
    def score_samples(self, X):
        return self._call_remote("score_samples", X)


class Score:
    """A score computed by the model itself (KernelDensity)."""

    def score(self, X, y=None):
        return self._call_remote("score", X)


class ScoreTest:
    """The log-likelihood of X_test under a fitted covariance model."""

    def score(self, X_test, y=None):
        return self._call_remote("score", X_test)


class ScoreWeighted:
    def score(self, X, y=None, sample_weight=None):
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return self._call_remote("score", X, **kwargs)


class Transform:
    def transform(self, X):
        return self._call_remote("transform", X)


class InverseTransform:
    def inverse_transform(self, X):
        return self._call_remote("inverse_transform", X, in_output_space=True)


class FitTransform:
    def fit_transform(self, X, y=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X, y)


class FitTransformWeighted:
    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X, sample_weight=sample_weight)


class FitPredict:
    def fit_predict(self, X, y=None):
        """Fit and return the labels of the training set in one round trip."""
        return self._fit_remote("fit_predict", X)


class FitPredictWeighted:
    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return the labels of the training set in one round trip."""
        return self._fit_remote("fit_predict", X, sample_weight=sample_weight)


class PartialFit:
    def partial_fit(self, X, y=None):
        self._partial_fit_remote(X)
        return self


class PartialFitClassifier:
    def partial_fit(self, X, y, classes=None):
        if not self.__sklearn_is_fitted__() and classes is not None:
            return self._partial_fit_first(X, y, classes)
        self._partial_fit_remote(X, y)
        return self

    def _partial_fit_first(self, X, y, classes, **kwargs):
        X, y = self._validate(X, y, reset=True)
        check_classification_targets(y)
        self.classes_ = np.unique(classes)
        codes = self._encode_labels(y)
        kwargs["classes"] = np.arange(len(self.classes_))
        self._fit_prepared("partial_fit", X, codes, kwargs)
        return self


class PartialFitClassifierWeighted(PartialFitClassifier):
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        kwargs = {}
        if sample_weight is not None:
            kwargs["sample_weight"] = _check_sample_weight(sample_weight, X)
        if not self.__sklearn_is_fitted__() and classes is not None:
            return self._partial_fit_first(X, y, classes, **kwargs)
        self._partial_fit_remote(X, y, **kwargs)
        return self


class KNeighbors:
    _records_n_samples = True

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """(distances, indices) of the nearest training samples; X=None: of the training set itself."""
        kwargs = {"return_distance": return_distance}
        if n_neighbors is not None:
            kwargs["n_neighbors"] = n_neighbors
        result = self._call_remote("kneighbors", X, **kwargs)
        return tuple(result) if isinstance(result, list) else result

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """The k-neighbors graph as a CSR matrix, built locally from :meth:`kneighbors`."""
        from scipy.sparse import csr_matrix

        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        if mode == "connectivity":
            indices = self.kneighbors(X, n_neighbors, return_distance=False)
            data = np.ones(indices.size)
        elif mode == "distance":
            distances, indices = self.kneighbors(X, n_neighbors, return_distance=True)
            data = np.ravel(distances)
        else:
            raise ValueError(f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" instead')
        n_queries = indices.shape[0]
        indptr = np.arange(0, n_queries * n_neighbors + 1, n_neighbors)
        return csr_matrix((data, indices.ravel(), indptr), shape=(n_queries, self.n_samples_fit_))


class Mahalanobis:
    def mahalanobis(self, X):
        return self._call_remote("mahalanobis", X)


class CovarianceExtras:
    """Computed locally from the fitted ``covariance_``, as scikit-learn does."""

    def get_precision(self):
        check_is_fitted(self)
        if self.store_precision:
            return self.precision_
        from scipy import linalg

        return linalg.pinvh(self.covariance_, check_finite=False)

    def error_norm(self, comp_cov, norm="frobenius", scaling=True, squared=True):
        from sklearn.covariance import EmpiricalCovariance

        model = EmpiricalCovariance(store_precision=False)
        model.covariance_ = np.asarray(self.covariance_)
        return model.error_norm(comp_cov, norm=norm, scaling=scaling, squared=squared)


class Sample:
    def sample(self, n_samples=1, random_state=None):
        """Random samples from the fitted density (drawn on the worker)."""
        if isinstance(random_state, np.random.RandomState):
            random_state = int(random_state.randint(np.iinfo(np.int32).max))
        return self._call_remote("sample", n_samples=n_samples, random_state=random_state)


class LabelTransformer:
    """fit(y) / transform(y) on a 1-d label array (LabelEncoder, LabelBinarizer).

    Labels may be strings, which cannot travel: they are encoded locally to
    codes (``np.unique``, as scikit-learn does), and the worker's model is
    fitted on the codes.
    """

    _target = None
    _validation = {}

    def fit(self, y):
        self._fit_labels("fit", y)
        return self

    def fit_transform(self, y):
        return self._finish(self._fit_labels("fit_transform", y))

    def transform(self, y):
        check_is_fitted(self)
        y = column_or_1d(y, warn=True)
        if not len(y):
            return self._finish(self._empty())
        return self._finish(self._run("transform", [self._encode_labels(y)], {}))

    def inverse_transform(self, y):
        check_is_fitted(self)
        codes = self._run("inverse_transform", [np.asarray(y)], {})
        return self.classes_.take(np.asarray(codes, dtype=np.intp))

    def _fit_labels(self, method, y):
        y = column_or_1d(y, warn=True)
        self.classes_, codes = np.unique(y, return_inverse=True)
        return self._fit_prepared(method, codes, None, {})

    def _finish(self, result):
        return result

    def _empty(self):
        return np.array([], dtype=np.int64)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.target_tags.one_d_labels = True
        return tags
