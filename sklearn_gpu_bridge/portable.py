"""cuML's own ways, in scikit-learn and numpy, where scikit-learn's classes differ from cuML's.

The wrappers follow cuML where cuML differs from scikit-learn; where no
scikit-learn class behaves as cuML's does, these stand for it:

- :class:`CumlLikeSVC`: an SVC of three or more classes is one binary SVC per
  pair of classes (``decision_function_shape="ovo"``, cuML's default) or per
  class (``"ovr"``), as scikit-learn's OneVsOneClassifier and
  OneVsRestClassifier build it, with one decision column per class; class
  weights are folded into the sample weights first, as cuML does.
- :class:`CumlLikeTargetEncoder`: cuML's TargetEncoder, whose default
  ``multi_feature_mode="combination"`` encodes each combination of
  categories (scikit-learn's encodes each feature on its own).
- :class:`CumlLikeSGDClassifier`: scikit-learn's SGDClassifier whose
  ``predict`` thresholds the score as cuML's MBSGDClassifier does (at 0 for
  the hinge loss, at 0.5 for the others).
- :class:`CumlLikeGaussianNB`, :class:`CumlLikeCategoricalNB`: they take
  sparse X, as cuML's do.

The scikit-learn backend runs these (so that it stands in for cuML), and a
cuML worker gives its fitted models of those kinds in these forms, built
from cuML's own fitted parts: a fitted model then predicts where only
scikit-learn and this package are installed, without a worker or cuML.

Shared by both sides: imports nothing of the package.
"""

import numpy as np
from scipy.sparse import issparse
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin
from sklearn.linear_model import SGDClassifier
from sklearn.naive_bayes import CategoricalNB, GaussianNB
from sklearn.svm import SVC
from sklearn.utils.multiclass import _ovr_decision_function, check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data


class CumlLikeSVC(ClassifierMixin, BaseEstimator):
    """scikit-learn's SVC, multiclass the way cuML's is (see the module's docstring).

    ``estimators_`` are scikit-learn SVCs on labels 0/1 (1: the pair's second
    class, or the class itself for "ovr"); with two classes there is one.
    """

    def __init__(self, *, C=1.0, kernel="rbf", degree=3, gamma="scale", coef0=0.0, tol=1e-3, cache_size=200.0,
                 max_iter=-1, random_state=None, class_weight=None, decision_function_shape="ovo"):
        self.C, self.kernel, self.degree, self.gamma, self.coef0 = C, kernel, degree, gamma, coef0
        self.tol, self.cache_size, self.max_iter, self.random_state = tol, cache_size, max_iter, random_state
        self.class_weight, self.decision_function_shape = class_weight, decision_function_shape

    def _binary(self):
        params = {k: v for k, v in self.get_params().items() if k not in ("class_weight", "decision_function_shape")}
        return SVC(**params)

    def _class_weights(self, codes, n_classes):
        """Per-sample factors from ``class_weight`` (cuML: "balanced" counts samples, not their weights)."""
        if self.class_weight is None:
            return None
        if isinstance(self.class_weight, str):
            if self.class_weight != "balanced":
                raise ValueError(f"class_weight must be a dict, 'balanced' or None, not {self.class_weight!r}")
            weights = len(codes) / (n_classes * np.bincount(codes, minlength=n_classes))
        else:
            weights = np.array([float(self.class_weight.get(c, 1.0)) for c in range(n_classes)])
        return weights[codes]

    def fit(self, X, y, sample_weight=None):
        if self.decision_function_shape not in ("ovo", "ovr"):
            raise ValueError(f"decision_function_shape must be 'ovo' or 'ovr', not {self.decision_function_shape!r}")
        # scikit-learn's SVC checks its input this way: the same errors, in the same words
        X, y = validate_data(self, X, y, dtype=np.float64, order="C", accept_sparse="csr", accept_large_sparse=False)
        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        n_classes = len(self.classes_)
        weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        factors = self._class_weights(codes, n_classes)
        if factors is not None:
            weights = factors if weights is None else weights * factors
        if n_classes <= 2:  # one SVC (which says, in its words, what is wrong with a single class)
            self.estimators_ = [self._binary().fit(X, codes, sample_weight=weights)]
        elif self.decision_function_shape == "ovr":
            self.estimators_ = [self._binary().fit(X, (codes == k).astype(int), sample_weight=weights)
                                for k in range(n_classes)]
        else:
            self.estimators_ = self._fit_pairs(X, codes, weights, n_classes)
        return self

    def _fit_pairs(self, X, codes, weights, n_classes):
        estimators = []
        for i in range(n_classes):
            for j in range(i + 1, n_classes):
                rows = np.flatnonzero((codes == i) | (codes == j))
                estimator = self._binary().fit(X[rows], (codes[rows] == j).astype(int),
                                               sample_weight=None if weights is None else weights[rows])
                if self.kernel != "precomputed":  # as cuML: support_ names rows of the whole training set
                    estimator.support_ = rows[estimator.support_].astype(np.int32)
                estimators.append(estimator)
        return estimators

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", accept_sparse="csr", accept_large_sparse=False,
                          reset=False)
        if issparse(X) and not self.estimators_[0]._sparse:  # cuML takes sparse input whatever it was fitted on
            X = X.toarray()
        if len(self.estimators_) == 1:
            return self.estimators_[0].decision_function(X)
        if self.decision_function_shape == "ovr":
            return np.column_stack([e.decision_function(X) for e in self.estimators_])
        confidences = np.column_stack([e.decision_function(X) for e in self.estimators_])
        # votes plus a confidence term in (-1/3, 1/3): scikit-learn's own one-vs-one scores, which cuML uses
        return _ovr_decision_function((confidences >= 0).astype(int), confidences, len(self.classes_))

    def predict(self, X):
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores >= 0).astype(int)]  # as cuML: a score of exactly 0 is the second class
        if self.decision_function_shape == "ovr":  # as OneVsRestClassifier: a tie goes to the last class
            return self.classes_[scores.shape[1] - 1 - np.argmax(scores[:, ::-1], axis=1)]
        return self.classes_[np.argmax(scores, axis=1)]

    @property
    def support_(self):
        return np.concatenate([e.support_ for e in self.estimators_])

    @property
    def intercept_(self):
        return np.concatenate([e.intercept_ for e in self.estimators_])

    @property
    def n_iter_(self):
        return np.concatenate([np.atleast_1d(e.n_iter_) for e in self.estimators_])

    def __getattr__(self, name):
        # a two-class model is one SVC: its other fitted attributes are that SVC's
        estimators = self.__dict__.get("estimators_")
        if name.endswith("_") and not name.startswith("_") and estimators is not None and len(estimators) == 1:
            return getattr(estimators[0], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        """The state, each support vector once: a sample is a support vector of every pair (or class) model
        it helps define, up to ``n_classes - 1`` of them, so saved one copy per SVC the file would weigh
        several times scikit-learn's SVC, which keeps each once (libsvm's one-vs-one)."""
        state = dict(super().__getstate__())  # a copy: on Python 3.11+ object's is the instance's own dict
        packed = _pack_support_vectors(state.get("estimators_"))
        if packed is not None:
            state["estimators_"] = packed
        return state

    def __setstate__(self, state):
        estimators = state.get("estimators_")
        if isinstance(estimators, _PackedSVCs):
            state = {**state, "estimators_": estimators.unpack()}
        super().__setstate__(state)


class _PackedSVCs:
    """Binary SVCs as they are saved: their support vectors, each distinct row once, taken out of them.

    ``vectors`` holds the distinct rows, ``rows`` the row of each SVC's support vectors in turn (``counts``
    of them each), ``states`` each SVC's class and its other attributes. Rows are told apart by their
    bytes, so each SVC gets back exactly its array (dtype, values, order of rows).
    """

    def __init__(self, vectors, rows, counts, states):
        self.vectors, self.rows, self.counts, self.states = vectors, rows, counts, states

    def unpack(self):
        estimators = []
        for (cls, state), rows in zip(self.states, np.split(self.rows, np.cumsum(self.counts)[:-1])):
            estimator = cls.__new__(cls)
            estimator.__setstate__(state)
            estimator.support_vectors_ = self.vectors[rows]  # C-contiguous, as libsvm's predict wants them
            estimators.append(estimator)
        return estimators


def _pack_support_vectors(estimators):
    """:class:`_PackedSVCs` of ``estimators``, or None where nothing is shared: one SVC, or sparse or
    mixed support vectors (the estimators are then saved as they are)."""
    if not isinstance(estimators, list) or len(estimators) < 2:
        return None
    vectors = [getattr(e, "support_vectors_", None) for e in estimators]
    if not all(isinstance(v, np.ndarray) and v.ndim == 2 for v in vectors) or \
            len({(v.dtype, v.shape[1]) for v in vectors}) != 1:
        return None
    stacked = np.ascontiguousarray(np.concatenate(vectors))
    as_bytes = stacked.view(np.dtype((np.void, stacked.dtype.itemsize * stacked.shape[1])))
    _, first, rows = np.unique(as_bytes.ravel(), return_index=True, return_inverse=True)
    states = []
    for estimator in estimators:
        state = dict(estimator.__getstate__())
        del state["support_vectors_"]
        states.append((type(estimator), state))
    return _PackedSVCs(stacked[first], rows.astype(np.int32 if len(first) < 2**31 else np.int64),
                       [len(v) for v in vectors], states)


class CumlLikeSGDClassifier(SGDClassifier):
    """SGDClassifier whose ``predict`` is cuML MBSGDClassifier's: ``score > 0`` (hinge) or ``score > 0.5``."""

    def predict(self, X):
        scores = self.decision_function(X)
        return self.classes_[(scores > (0 if self.loss == "hinge" else 0.5)).astype(int)]


def _dense(X):
    return X.toarray() if issparse(X) else X


class CumlLikeGaussianNB(GaussianNB):
    """GaussianNB that takes sparse X, as cuML's does (which makes it dense class by class)."""

    def fit(self, X, y, sample_weight=None):
        return super().fit(_dense(X), y, sample_weight)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        return super().partial_fit(_dense(X), y, classes, sample_weight)

    def _check_X(self, X):
        return super()._check_X(_dense(X))


class CumlLikeCategoricalNB(CategoricalNB):
    """CategoricalNB that takes sparse X, as cuML's does; here the rows are made dense."""

    def _check_X(self, X):
        return super()._check_X(_dense(X))

    def _check_X_y(self, X, y, reset=True):
        return super()._check_X_y(_dense(X), y, reset=reset)


# ---------------------------------------------------------------- TargetEncoder


class CumlLikeTargetEncoder(TransformerMixin, BaseEstimator):
    """cuML 26.10's TargetEncoder, in numpy (see the module's docstring).

    What cuML does, including where it differs from scikit-learn's:
    ``fit_transform`` encodes each training row from the other folds'
    statistics in "combination" mode, and from all rows in "independent"
    mode; ``transform`` of the very data fitted on gives what fit_transform
    gave; a binary target is encoded as 0/1 by its sorted classes; an unseen
    category gets ``y_stat_val`` (the target's mean, variance or median).
    ``split_method="random"`` draws its folds with NumPy, not CuPy: its folds
    differ from cuML's.
    """

    def __init__(self, *, n_folds=4, smooth=0, seed=42, split_method="interleaved", stat="mean",
                 multi_feature_mode="combination"):
        self.n_folds, self.smooth, self.seed, self.split_method = n_folds, smooth, seed, split_method
        self.stat, self.multi_feature_mode = stat, multi_feature_mode

    # ------------------------------------------------------------ fitting

    def _target(self, y):
        y = np.asarray(y)
        kind = type_of_target(y)
        if y.dtype.kind == "f" and kind not in ("binary",):
            kind = "continuous"
        if kind == "binary":
            self.classes_, codes = np.unique(y, return_inverse=True)
            self.target_type_ = "binary"
            return codes.astype(np.float64)
        if kind.startswith("continuous"):
            self.classes_, self.target_type_ = None, "continuous"
            return y.astype(np.float64)
        raise ValueError("TargetEncoder currently only supports 'continuous' and 'binary' target types, "
                         "but got 'multiclass'.")

    def _folds(self, n):
        n_folds = min(self.n_folds, n)
        if self.n_folds < 1:
            raise ValueError("n_folds >= 1 is required")
        if self.split_method == "random":
            return np.random.default_rng(self.seed).integers(0, n_folds, n).astype(np.float64)
        if self.split_method == "continuous":
            return (np.arange(n) / (n / n_folds)) % n_folds  # cuML's own formula (no floor: folds of one row)
        if self.split_method == "interleaved":
            return (np.arange(n) % n_folds).astype(np.float64)
        raise ValueError(f"Expected `split_method` in ['random', 'continuous', 'interleaved'], "
                         f"got {self.split_method!r}")

    def _stat(self, values):
        if self.stat == "mean":
            return values.mean()
        if self.stat == "var":
            return values.var(ddof=1) if len(values) > 1 else np.nan
        return np.median(values)

    def _encode(self, y):
        """The encoding of a group from its targets (``y``: all of that group's), smoothed as cuML does."""
        count, smooth = len(y), self.smooth
        if self.stat == "median":
            return np.median(y) if count else np.nan
        mean = (y.sum() + smooth * self.mean_) / (count + smooth) if count + smooth else np.nan
        if self.stat == "mean":
            return mean
        if count + smooth == 0 or count < 2:
            return np.nan
        second = ((y * y).sum() + smooth * self.mean2_) / (count + smooth)
        return (second - mean**2) * count / (count - 1)

    def fit(self, X, y):
        self.fit_transform(X, y)
        return self

    def fit_transform(self, X, y):
        if self.smooth < 0:
            raise ValueError(f"smooth {self.smooth} is not zero or positive")
        if self.stat not in ("mean", "var", "median"):
            raise ValueError(f"Expected `stat` in ['mean', 'var', 'median'], got {self.stat!r}")
        if self.multi_feature_mode not in ("combination", "independent"):
            raise ValueError(f"multi_feature_mode should be 'combination' or 'independent', "
                             f"got '{self.multi_feature_mode}'.")
        X = _columns(X)
        y = self._target(y)
        self.n_features_in_ = X.shape[1]
        self.categories_ = [np.unique(col[_known(col)]) for col in X.T]
        self.mean_, self.mean2_ = y.mean(), (y * y).mean()
        self.y_stat_val_ = self._stat(y)
        if self.multi_feature_mode == "independent":
            self.encodings_ = [self._table(X[:, [i]], y) for i in range(X.shape[1])]
            out = np.column_stack([self._lookup(table, X[:, [i]]) for i, table in enumerate(self.encodings_)])
        else:
            self.encodings_ = [self._table(X, y)]
            folds = self._folds(len(y))
            out = np.empty((len(y), 1))
            for fold in np.unique(folds):
                inside = folds == fold
                table = self._table(X[~inside], y[~inside])
                out[inside, 0] = self._lookup(table, X[inside])
        self.train_X_, self.train_encoding_ = X, out
        return out

    def _table(self, X, y):
        """{category or tuple of categories: encoding} over the rows of X (rows with a missing key left out)."""
        groups = {}
        for key, value in zip(map(tuple, X), y):
            if all(k == k for k in key):  # NaN keys are dropped, as cudf's groupby drops them
                groups.setdefault(key, []).append(value)
        return {key: self._encode(np.asarray(values)) for key, values in groups.items()}

    def _lookup(self, table, X):
        out = np.array([table.get(key, np.nan) for key in map(tuple, X)], dtype=np.float64)
        out[np.isnan(out)] = self.y_stat_val_
        return out

    # ------------------------------------------------------------ transforming

    def transform(self, X):
        check_is_fitted(self)
        X = _columns(X)
        if X.shape == self.train_X_.shape and _same(X, self.train_X_):
            return self.train_encoding_.copy()  # as cuML: the training data gets what fit_transform gave
        if self.multi_feature_mode == "independent":
            return np.column_stack([self._lookup(t, X[:, [i]]) for i, t in enumerate(self.encodings_)])
        return self._lookup(self.encodings_[0], X).reshape(-1, 1)

    def get_feature_names_out(self, input_features=None):
        check_is_fitted(self)
        if self.multi_feature_mode == "combination" and self.n_features_in_ > 1:
            return np.asarray(["targetencoder0"], dtype=object)
        if input_features is None:
            input_features = getattr(self, "feature_names_in_", [f"x{i}" for i in range(self.n_features_in_)])
        return np.asarray(input_features, dtype=object)


def _columns(X):
    X = np.asarray(X, dtype=object) if not isinstance(X, np.ndarray) else X
    return X.reshape(-1, 1) if X.ndim == 1 else X


def _known(column):
    return np.array([v == v for v in column], dtype=bool)  # NaN is the one value unequal to itself


def _same(a, b):
    return all((x == y) or (x != x and y != y) for x, y in zip(a.ravel(), b.ravel()))
