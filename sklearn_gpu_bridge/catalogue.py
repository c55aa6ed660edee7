"""The estimator catalogue: every class the bridge serves, read by both sides.

One row per cuML class: its short name (what a request names), the module
it lives in (the same in cuML and scikit-learn), the methods a fitted one
may be asked for, those that take ``sample_weight`` (where cuML's do), and
the sparse input it takes (cuML 26.10's ``accept_sparse``, in ``fit`` and in
the methods of a fitted model).
The worker builds and calls only what is listed here; the client builds a
``GPU<name>`` wrapper with exactly these methods. Parameter translation
between cuML and scikit-learn lives beside it, in :mod:`.translate`.

Shared by both sides: imports nothing of the package.
"""

import importlib
import sys
from typing import NamedTuple

#: methods that create the remote estimator (op "fit"); the others run on a fitted one (op "call")
FIT_METHODS = frozenset({"fit", "fit_transform", "fit_predict", "partial_fit"})
#: cuML parameters that tune speed or memory, not the result: a backend without them may ignore them
NEUTRAL = frozenset({
    "n_streams", "max_batch_size", "cache_size", "max_mbytes_per_batch", "max_samples_per_batch",
    "device_buffer_samples", "device_ids", "build_kwds", "verbose", "output_type", "handle",
})


class Estimator(NamedTuple):
    """One cuML class and its scikit-learn counterpart."""

    name: str  #: the class name in cuML ("SVC"); the wrapper is GPU<name>
    module: str  #: "svm": cuml.svm and sklearn.svm
    methods: frozenset  #: what a request may call besides fit
    weighted: frozenset  #: methods whose cuML version takes sample_weight
    sklearn: str  #: dotted path of the scikit-learn class (cuML's ``_cpu_class_path``)
    sparse_fit: object = False  #: scipy.sparse formats ``fit`` takes (``validate_data``'s accept_sparse)
    sparse_call: object = False  #: ... and the methods of a fitted model

    @property
    def cuml(self):
        """Dotted path of the cuML class."""
        return f"cuml.{self.module}.{self.name}"

    def allows(self, method):
        """Whether a request may run ``method`` on this class."""
        return method == "fit" or method in self.methods


def _accept(text):
    return {"-": False, "any": True}[text] if text in ("-", "any") else text.split(",")


def _row(module, name, methods="", weighted="", sklearn=None, sparse="-"):
    """``sparse``: "FIT|CALL" (or one for both), each "-" (none), "any", or formats ("csr,csc")."""
    fit, _, call = sparse.partition("|")
    return Estimator(name, module, frozenset(methods.split()), frozenset(weighted.split()),
                     sklearn or f"sklearn.{module}.{name}", _accept(fit), _accept(call or fit))


_PROBA = "predict predict_proba predict_log_proba"
_SCALER = "transform fit_transform inverse_transform partial_fit"
_NB = f"{_PROBA} partial_fit"
_LABELS = "fit_transform transform inverse_transform"

# The scikit-learn column is cuML 26.10's ``_cpu_class_path`` (what ``as_sklearn()`` returns),
# except where cuML has none (MBSGD*: the SGD classes) and HDBSCAN (cuML names hdbscan.HDBSCAN;
# scikit-learn has had its own since 1.3, which the CPU backend uses).
ESTIMATORS = {row.name: row for row in (
    _row("linear_model", "LinearRegression", "predict", "fit", sparse="any"),
    _row("linear_model", "LogisticRegression", f"{_PROBA} decision_function", "fit", sparse="csr|any"),
    _row("linear_model", "Ridge", "predict", "fit", sparse="any"),
    _row("linear_model", "Lasso", "predict", "fit", sparse="csr|any"),
    _row("linear_model", "ElasticNet", "predict", "fit", sparse="csr|any"),
    _row("linear_model", "MBSGDClassifier", "predict decision_function",
         sklearn="sklearn.linear_model.SGDClassifier", sparse="-|any"),
    _row("linear_model", "MBSGDRegressor", "predict", sklearn="sklearn.linear_model.SGDRegressor", sparse="-|any"),
    _row("svm", "SVC", "predict decision_function", "fit", sparse="csr"),
    _row("svm", "SVR", "predict", "fit", sparse="csr"),
    _row("svm", "LinearSVC", "predict decision_function", "fit", sparse="-|any"),
    _row("svm", "LinearSVR", "predict", "fit", sparse="-|any"),
    _row("cluster", "KMeans", "predict fit_predict transform fit_transform score",
         "fit fit_predict fit_transform score"),
    _row("cluster", "DBSCAN", "fit_predict", "fit fit_predict"),
    _row("cluster", "HDBSCAN", "fit_predict"),
    _row("cluster", "SpectralClustering", "fit_predict"),
    _row("decomposition", "PCA", "transform fit_transform inverse_transform", sparse="csr|any"),
    _row("decomposition", "IncrementalPCA", "transform fit_transform inverse_transform partial_fit", sparse="csr,csc"),
    # sparse X: cuML's class takes none; the worker computes it (worker/sparse_svd.py)
    _row("decomposition", "TruncatedSVD", "transform fit_transform inverse_transform", sparse="csr"),
    _row("neighbors", "NearestNeighbors", "kneighbors", sparse="csr"),
    _row("neighbors", "KNeighborsClassifier", "predict predict_proba kneighbors", sparse="csr"),
    _row("neighbors", "KNeighborsRegressor", "predict kneighbors", sparse="csr"),
    _row("neighbors", "KernelDensity", "score_samples score sample", "fit"),
    _row("ensemble", "RandomForestClassifier", _PROBA, "fit"),
    _row("ensemble", "RandomForestRegressor", "predict", "fit"),
    _row("ensemble", "IsolationForest", "predict decision_function score_samples fit_predict"),
    _row("manifold", "TSNE", "fit_transform", sparse="csr"),
    _row("manifold", "UMAP", "transform fit_transform inverse_transform", sklearn="umap.UMAP",
         sparse="any|csr"),
    _row("manifold", "SpectralEmbedding", "fit_transform"),
    _row("kernel_ridge", "KernelRidge", "predict", "fit"),
    _row("covariance", "EmpiricalCovariance", "score mahalanobis"),
    _row("covariance", "LedoitWolf", "score mahalanobis"),
    _row("preprocessing", "StandardScaler", _SCALER, sparse="csr,csc"),
    _row("preprocessing", "MinMaxScaler", _SCALER),
    _row("preprocessing", "MaxAbsScaler", _SCALER, sparse="csr,csc"),
    _row("preprocessing", "PolynomialFeatures", "transform fit_transform", sparse="any|csr,csc"),
    _row("preprocessing", "LabelEncoder", _LABELS),
    _row("preprocessing", "LabelBinarizer", _LABELS),
    _row("preprocessing", "OneHotEncoder", "transform fit_transform inverse_transform"),
    _row("preprocessing", "TargetEncoder", "transform fit_transform"),
    _row("naive_bayes", "GaussianNB", _NB, "fit partial_fit", sparse="csr,coo"),
    _row("naive_bayes", "MultinomialNB", _NB, sparse="csr,coo"),
    _row("naive_bayes", "BernoulliNB", _NB, sparse="csr,coo"),
    _row("naive_bayes", "ComplementNB", _NB, sparse="csr,coo"),
    _row("naive_bayes", "CategoricalNB", _NB, sparse="csr,coo"),
)}

#: every method some class may be asked for
ALL_METHODS = frozenset({"fit"}.union(*(row.methods for row in ESTIMATORS.values())))


def lookup(name):
    """The catalogue row of ``name``; ValueError naming the offer for anything else."""
    row = ESTIMATORS.get(name) if isinstance(name, str) else None
    if row is None:
        raise ValueError(f"unknown estimator {name!r}; the bridge offers {sorted(ESTIMATORS)}")
    return row


def load(path):
    """The class a dotted path names (a row's ``sklearn`` or ``cuml`` column, a stand-in's path)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


#: set on the ``cuml`` module that sklearn-gpu-bridge's alias provides (:mod:`.accel.cuml_alias`)
ALIAS_MARKER = "__sklearn_gpu_bridge__"


def is_cuml_alias(module):
    """Whether a ``cuml`` module (or the finder that serves it) is this package's alias, not cuML itself."""
    return bool(getattr(module, ALIAS_MARKER, False))


def real_cuml_importable():
    """Whether a real cuML is importable here (this package's alias finder set aside)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if not is_cuml_alias(finder) and find is not None and find("cuml", None) is not None:
            return True
    return False
