"""scikit-learn's SVC answers from the backend's binary SVCs: libsvm's one-vs-one, computed on the worker.

scikit-learn's ``SVC`` (libsvm) fits one binary SVC per pair of classes
``i < j`` on the pair's samples and keeps them as one model: its decision
values are a column per pair, positive for class ``i``; ``predict`` counts
votes (a value > 0 votes for ``i``, any other for ``j``; a tie goes to the
lowest class); ``decision_function_shape="ovr"`` is
``_ovr_decision_function(dec < 0, -dec, n_classes)``. cuML's multiclass SVC
is scikit-learn's ``OneVsOneClassifier`` of binary SVCs instead (another
decision function, and ``gamma="scale"`` computed on each pair's samples).

:class:`SklearnSVC` fits the pairs itself with the backend's binary SVC
(cuML's on the GPU; scikit-learn's on the CPU backend, which stands in for
it), each on labels 0/1 (1: class ``j``, so its decision is libsvm's
negated), with what libsvm gives every pair: ``gamma`` of the whole
training set, and class weights as per-sample weights (libsvm scales C per
class, and per sample). Decision values are the binaries' own, on the
device where the backend has one; votes and the "ovr" columns are summed
here. Two classes: the backend's SVC itself, as it would be without this.

Its portable form (:meth:`SklearnSVC.to_sklearn`) is scikit-learn's own
``SVC``, assembled from the pairs in libsvm's layout, so a saved model
needs scikit-learn alone and predicts what the worker's model does.

Used for accel (scikit-learn's ``SVC`` served) and for ``GPUSVC(multiclass="sklearn")``.
"""

import numpy as np
from scipy import sparse as sp
from sklearn.base import clone
from sklearn.svm import SVC
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import _ovr_decision_function

from .forms import host

#: parameters of ``GPUSVC`` that are the bridge's own (cuML's SVC has neither): which SVC answers, and
#: scikit-learn's ``break_ties``
OWN_PARAMETERS = ("multiclass", "break_ties")
SHAPES = ("ovo", "ovr")


def serving(estimator, params, params_from):
    """What a fit of ``SVC`` runs: :class:`SklearnSVC` around the backend's ``estimator`` under accel
    (``params_from="sklearn"``) and for ``multiclass="sklearn"``; else ``estimator`` itself."""
    multiclass = "sklearn" if params_from == "sklearn" else params.get("multiclass", "cuml")
    if multiclass not in ("cuml", "sklearn"):
        raise ValueError(f"multiclass must be 'cuml' or 'sklearn', not {multiclass!r}")
    if multiclass == "cuml":
        if params.get("break_ties"):
            raise ValueError("break_ties=True is scikit-learn's: it needs multiclass='sklearn'")
        return estimator
    return SklearnSVC(estimator, params)


class SklearnSVC:
    """scikit-learn's ``SVC`` (libsvm's one-vs-one) from one binary SVC of the backend per pair of classes.

    ``binary``: the backend's unfitted SVC, built from the request's parameters; ``params``: those
    parameters (scikit-learn's under accel, cuML's for ``GPUSVC``), read for ``decision_function_shape``,
    ``break_ties``, ``class_weight`` and the portable form's own.
    """

    def __init__(self, binary, params):
        self.binary = binary
        self.params = dict(params)
        self.decision_function_shape = self.params.get("decision_function_shape", "ovr")
        self.break_ties = self.params.get("break_ties", False)
        self.kernel = self.params.get("kernel", "rbf")

    # ------------------------------------------------------------ fitting

    def fit(self, X, y, sample_weight=None):
        if self.decision_function_shape not in SHAPES:
            raise ValueError(f"decision_function_shape must be 'ovo' or 'ovr', not {self.decision_function_shape!r}")
        y = np.asarray(host(y)).ravel()
        self.classes_, codes = np.unique(y, return_inverse=True)
        self.n_features_in_, self.shape_fit_ = X.shape[1], tuple(X.shape)
        self.pairs_ = None
        if len(self.classes_) <= 2:  # one SVC, the backend's own (which words what is wrong with one class)
            self.binary_ = self.binary.fit(X, y, **_weights_kwargs(sample_weight))
            return self
        self._refuse_what_differs()
        self.binary_ = None
        self._codes = codes.astype(np.intp)
        self._sparse = sp.issparse(X)
        self._gamma = self._gamma_of(X)
        n_classes = len(self.classes_)
        class_weight = self.params.get("class_weight")
        self.class_weight_ = compute_class_weight(class_weight, classes=self.classes_, y=y)  # by label, in order
        weights = None if sample_weight is None else np.asarray(host(sample_weight), dtype=np.float64)
        if (self.class_weight_ != 1).any():  # libsvm's C of class k is C * class_weight_[k]: a weight per sample
            weights = self.class_weight_[codes] if weights is None else weights * self.class_weight_[codes]
        changes = self._pair_parameters()
        self.pairs_ = []
        for i in range(n_classes):
            for j in range(i + 1, n_classes):
                rows = np.flatnonzero((codes == i) | (codes == j))
                model = clone(self.binary).set_params(**changes)
                model.fit(self._fit_input(X, rows), (codes[rows] == j).astype(np.int32),
                          **_weights_kwargs(None if weights is None else weights[rows]))
                self.pairs_.append((i, j, rows, model))
        return self

    def _refuse_what_differs(self):
        """What the pairs cannot give as scikit-learn does: a NotImplementedError, whose words the caller shows."""
        if callable(self.kernel):
            raise NotImplementedError("multiclass SVC with a callable kernel: the worker fits the pairs with "
                                      "the kernels it knows, by name")
        if self.params.get("probability") is True:
            raise NotImplementedError("multiclass SVC with probability=True: scikit-learn couples the pairs' "
                                      "probabilities (libsvm's cross-validated Platt scaling), which the pairs "
                                      "do not give")

    def _gamma_of(self, X):
        """libsvm's gamma, as scikit-learn's SVC computes it from the whole training set (not a pair's)."""
        gamma = self.params.get("gamma", "scale")
        if self.kernel == "precomputed":
            return 0.0
        if gamma == "scale":
            if sp.issparse(X):
                variance = X.multiply(X).mean() - X.mean() ** 2
            else:
                variance = float(X.var(dtype=np.float64))
            return 1.0 / (X.shape[1] * variance) if variance != 0 else 1.0
        if gamma == "auto":
            return 1.0 / X.shape[1]
        return gamma

    def _pair_parameters(self):
        """The binary SVC's parameters that differ in a pair: gamma as a number, no class weights (they are in
        the sample weights), no ties to break."""
        takes = self.binary.get_params(deep=False)
        changes = {"gamma": self._gamma, "class_weight": None, "break_ties": False}
        if self.kernel == "precomputed":
            del changes["gamma"]
        return {k: v for k, v in changes.items() if k in takes}

    def _fit_input(self, X, rows):
        rows = _like(X, rows)
        return X[rows][:, rows] if self.kernel == "precomputed" else X[rows]

    def _call_input(self, X, rows):
        return X[:, _like(X, rows)] if self.kernel == "precomputed" else X

    # ------------------------------------------------------------ answering

    def pairwise(self, X):
        """libsvm's decision values: a column per pair ``i < j`` (in that order), positive for class ``i``."""
        first = self.pairs_[0][3]
        if sp.issparse(X) and isinstance(first, SVC) and not first._sparse:
            X = X.toarray()  # once for all pairs: scikit-learn's SVC fitted dense takes dense X only; cuML's either
        columns = [host(model.decision_function(self._call_input(X, rows))) for _, _, rows, model in self.pairs_]
        return -np.column_stack(columns).astype(np.float64)

    def decision_function(self, X):
        if self.pairs_ is None:
            return self.binary_.decision_function(X)
        dec = self.pairwise(X)
        if self.decision_function_shape == "ovr":
            return _ovr_decision_function(dec < 0, -dec, len(self.classes_))
        return dec

    def predict(self, X):
        if self.break_ties and self.decision_function_shape == "ovo":
            raise ValueError("break_ties must be False when decision_function_shape is 'ovo'")
        if self.pairs_ is None:
            return self.binary_.predict(X)
        dec = self.pairwise(X)
        if self.break_ties:
            return self.classes_[np.argmax(_ovr_decision_function(dec < 0, -dec, len(self.classes_)), axis=1)]
        return self.classes_[np.argmax(votes(dec, len(self.classes_)), axis=1)]

    # ------------------------------------------------------------ the portable form

    def to_sklearn(self):
        """scikit-learn's ``SVC``, fitted: the pairs in libsvm's layout (or the binary SVC's own portable form)."""
        if self.pairs_ is None:
            return self.binary_.as_sklearn() if hasattr(self.binary_, "as_sklearn") else self.binary_
        forms = [(i, j, rows, _sklearn_binary(model)) for i, j, rows, model in self.pairs_]
        model = _built_svc(self.params)
        (model.support_, model.support_vectors_, model._n_support, dual_coef,
         model._intercept_) = _libsvm_layout(forms, self._codes, len(self.classes_), self.kernel == "precomputed")
        model.intercept_ = model._intercept_.copy()
        model.dual_coef_ = model._dual_coef_ = _sparse_coef(dual_coef) if self._sparse else dual_coef
        model.classes_, model.class_weight_ = self.classes_, self.class_weight_
        model._gamma, model._sparse = np.float64(self._gamma), self._sparse
        model.shape_fit_, model.n_features_in_ = self.shape_fit_, self.n_features_in_
        model._probA = model._probB = np.empty(0, dtype=np.float64)
        model._effective_probability = False  # read by scikit-learn >= 1.9's predict
        model.fit_status_ = max(int(getattr(f, "fit_status_", 0)) for _, _, _, f in forms)
        model._num_iter = model.n_iter_ = np.concatenate(
            [np.atleast_1d(np.asarray(f.n_iter_)) for _, _, _, f in forms]).astype(np.int32)
        return model


def votes(dec, n_classes):
    """libsvm's votes from its pairwise decision values: a value > 0 votes for ``i``, any other for ``j``."""
    count = np.zeros((len(dec), n_classes), dtype=np.int64)
    pair = 0
    for i in range(n_classes):
        for j in range(i + 1, n_classes):
            wins = dec[:, pair] > 0
            count[:, i] += wins
            count[:, j] += ~wins
            pair += 1
    return count


def _libsvm_layout(forms, codes, n_classes, precomputed):
    """(support_, support_vectors_, _n_support, dual_coef_, _intercept_) of libsvm's one-vs-one model from the
    pairs' binary SVCs in scikit-learn's form (``forms``: (i, j, rows, SVC fitted on labels 0/1 of ``rows``)).

    libsvm keeps each support vector once, grouped by class (by index within one); the coefficients of a
    vector of class ``c`` in the pair (i, j) are in row ``j - 1`` if ``c == i``, in row ``i`` if ``c == j``
    (zero in the pairs where it is not a support vector); libsvm's coefficients and intercept are the
    binary SVC's negated (its positive side is class j, libsvm's is class i).
    """
    indices = [rows[np.asarray(f.support_, dtype=np.intp)] for _, _, rows, f in forms]
    every = np.concatenate(indices)
    distinct, first = np.unique(every, return_index=True)
    order = np.lexsort((distinct, codes[distinct]))  # by class, then by index
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    dual_coef = np.zeros((n_classes - 1, len(distinct)))
    intercept = np.empty(len(forms))
    for pair, ((i, j, _, f), index) in enumerate(zip(forms, indices)):
        position = rank[np.searchsorted(distinct, index)]
        coef = -np.asarray(f.dual_coef_.toarray() if sp.issparse(f.dual_coef_) else f.dual_coef_,
                           dtype=np.float64).ravel()
        of_i = codes[index] == i
        dual_coef[j - 1, position[of_i]] = coef[of_i]
        dual_coef[i, position[~of_i]] = coef[~of_i]
        intercept[pair] = -float(np.ravel(f.intercept_)[0])
    n_support = np.bincount(codes[distinct], minlength=n_classes).astype(np.int32)
    if precomputed:
        vectors = np.empty((0, 0), dtype=np.float64)
    else:
        stacked = [f.support_vectors_ for _, _, _, f in forms]
        rows = first[order]
        if any(sp.issparse(v) for v in stacked):
            vectors = sp.vstack([sp.csr_matrix(v) for v in stacked], format="csr", dtype=np.float64)[rows]
            vectors.sort_indices()
        else:
            vectors = np.ascontiguousarray(np.concatenate(stacked)[rows], dtype=np.float64)
    return distinct[order].astype(np.int32), vectors, n_support, dual_coef, intercept


def _sparse_coef(dual_coef):
    """``dual_coef_`` as scikit-learn keeps it after a sparse fit: CSR with every entry stored, zeros too."""
    n_rows, n_sv = dual_coef.shape
    indices = np.tile(np.arange(n_sv, dtype=np.int32), n_rows)
    indptr = np.arange(0, n_rows * n_sv + 1, n_sv, dtype=np.int32)
    return sp.csr_matrix((dual_coef.ravel(), indices, indptr), shape=dual_coef.shape)


def _sklearn_binary(model):
    """A fitted binary SVC of either backend as scikit-learn's SVC (cuML's own conversion on a cuML worker)."""
    if isinstance(model, SVC):
        return model
    if hasattr(model, "as_sklearn"):
        return model.as_sklearn()
    return model.estimators_[0]  # the CPU backend's stand-in for cuML's SVC, of two classes: one SVC


def _built_svc(params):
    """scikit-learn's SVC with those of ``params`` it takes (cuML's parameters include others)."""
    takes = SVC().get_params()
    return SVC(**{k: v for k, v in params.items() if k in takes})


def _like(X, rows):
    """``rows`` as an index of X: on the device where X is."""
    if hasattr(X, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(rows)
    return rows


def _weights_kwargs(weights):
    return {} if weights is None else {"sample_weight": weights}
