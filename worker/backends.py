"""Backends: the fixed tables of estimator classes a worker can build.

A request names a class by its short name ("SVC"); the worker looks it up in
its backend's table and nowhere else, so no request can reach any other
class, module or file. ``cuml`` runs on the GPU; ``sklearn`` runs the
scikit-learn class of the same name on the CPU (CI, and the oracle that the
bridge's results must equal).
"""

import contextlib
import importlib
import inspect
import logging
import platform

import cloudpickle
import numpy as np

log = logging.getLogger(__name__)

# short name -> (scikit-learn class, cuML class). The scikit-learn column is
# cuML's own ``_cpu_class_path`` (what ``as_sklearn()`` returns), except where
# cuML has none (MBSGD*: the SGD classes; the scalers cuML vendors from
# scikit-learn) and HDBSCAN (cuML names hdbscan.HDBSCAN; scikit-learn has had
# its own since 1.3, and the CPU backend uses that one).
CLASSES = {
    # linear_model
    "LinearRegression": ("sklearn.linear_model.LinearRegression", "cuml.linear_model.LinearRegression"),
    "LogisticRegression": ("sklearn.linear_model.LogisticRegression", "cuml.linear_model.LogisticRegression"),
    "Ridge": ("sklearn.linear_model.Ridge", "cuml.linear_model.Ridge"),
    "Lasso": ("sklearn.linear_model.Lasso", "cuml.linear_model.Lasso"),
    "ElasticNet": ("sklearn.linear_model.ElasticNet", "cuml.linear_model.ElasticNet"),
    "MBSGDClassifier": ("sklearn.linear_model.SGDClassifier", "cuml.linear_model.MBSGDClassifier"),
    "MBSGDRegressor": ("sklearn.linear_model.SGDRegressor", "cuml.linear_model.MBSGDRegressor"),
    # svm
    "SVC": ("sklearn.svm.SVC", "cuml.svm.SVC"),
    "SVR": ("sklearn.svm.SVR", "cuml.svm.SVR"),
    "LinearSVC": ("sklearn.svm.LinearSVC", "cuml.svm.LinearSVC"),
    "LinearSVR": ("sklearn.svm.LinearSVR", "cuml.svm.LinearSVR"),
    # cluster
    "KMeans": ("sklearn.cluster.KMeans", "cuml.cluster.KMeans"),
    "DBSCAN": ("sklearn.cluster.DBSCAN", "cuml.cluster.DBSCAN"),
    "HDBSCAN": ("sklearn.cluster.HDBSCAN", "cuml.cluster.HDBSCAN"),
    "SpectralClustering": ("sklearn.cluster.SpectralClustering", "cuml.cluster.SpectralClustering"),
    # decomposition
    "PCA": ("sklearn.decomposition.PCA", "cuml.decomposition.PCA"),
    "IncrementalPCA": ("sklearn.decomposition.IncrementalPCA", "cuml.decomposition.IncrementalPCA"),
    "TruncatedSVD": ("sklearn.decomposition.TruncatedSVD", "cuml.decomposition.TruncatedSVD"),
    # neighbors
    "NearestNeighbors": ("sklearn.neighbors.NearestNeighbors", "cuml.neighbors.NearestNeighbors"),
    "KNeighborsClassifier": ("sklearn.neighbors.KNeighborsClassifier", "cuml.neighbors.KNeighborsClassifier"),
    "KNeighborsRegressor": ("sklearn.neighbors.KNeighborsRegressor", "cuml.neighbors.KNeighborsRegressor"),
    "KernelDensity": ("sklearn.neighbors.KernelDensity", "cuml.neighbors.KernelDensity"),
    # ensemble
    "RandomForestClassifier": ("sklearn.ensemble.RandomForestClassifier", "cuml.ensemble.RandomForestClassifier"),
    "RandomForestRegressor": ("sklearn.ensemble.RandomForestRegressor", "cuml.ensemble.RandomForestRegressor"),
    "IsolationForest": ("sklearn.ensemble.IsolationForest", "cuml.ensemble.IsolationForest"),
    # manifold
    "TSNE": ("sklearn.manifold.TSNE", "cuml.manifold.TSNE"),
    "UMAP": ("umap.UMAP", "cuml.manifold.UMAP"),
    "SpectralEmbedding": ("sklearn.manifold.SpectralEmbedding", "cuml.manifold.SpectralEmbedding"),
    # kernel_ridge, covariance
    "KernelRidge": ("sklearn.kernel_ridge.KernelRidge", "cuml.kernel_ridge.KernelRidge"),
    "EmpiricalCovariance": ("sklearn.covariance.EmpiricalCovariance", "cuml.covariance.EmpiricalCovariance"),
    "LedoitWolf": ("sklearn.covariance.LedoitWolf", "cuml.covariance.LedoitWolf"),
    # preprocessing
    "StandardScaler": ("sklearn.preprocessing.StandardScaler", "cuml.preprocessing.StandardScaler"),
    "MinMaxScaler": ("sklearn.preprocessing.MinMaxScaler", "cuml.preprocessing.MinMaxScaler"),
    "MaxAbsScaler": ("sklearn.preprocessing.MaxAbsScaler", "cuml.preprocessing.MaxAbsScaler"),
    "PolynomialFeatures": ("sklearn.preprocessing.PolynomialFeatures", "cuml.preprocessing.PolynomialFeatures"),
    "LabelEncoder": ("sklearn.preprocessing.LabelEncoder", "cuml.preprocessing.LabelEncoder"),
    "LabelBinarizer": ("sklearn.preprocessing.LabelBinarizer", "cuml.preprocessing.LabelBinarizer"),
    "OneHotEncoder": ("sklearn.preprocessing.OneHotEncoder", "cuml.preprocessing.OneHotEncoder"),
    "TargetEncoder": ("sklearn.preprocessing.TargetEncoder", "cuml.preprocessing.TargetEncoder"),
    # naive_bayes
    "GaussianNB": ("sklearn.naive_bayes.GaussianNB", "cuml.naive_bayes.GaussianNB"),
    "MultinomialNB": ("sklearn.naive_bayes.MultinomialNB", "cuml.naive_bayes.MultinomialNB"),
    "BernoulliNB": ("sklearn.naive_bayes.BernoulliNB", "cuml.naive_bayes.BernoulliNB"),
    "ComplementNB": ("sklearn.naive_bayes.ComplementNB", "cuml.naive_bayes.ComplementNB"),
    "CategoricalNB": ("sklearn.naive_bayes.CategoricalNB", "cuml.naive_bayes.CategoricalNB"),
}
#: fitted by the cuML worker before it reports ready (first fits of these pay seconds)
WARM_UP = ("StandardScaler", "PCA", "LogisticRegression", "SVC", "KMeans")


def _converts_back(estimator):
    """Whether cuML's ``from_sklearn`` takes back what its ``as_sklearn`` gives.

    Where it does not, the state travels as cuML's pickle, so that it can be
    pushed back to a cuML worker: IsolationForest ("conversion of a fitted
    sklearn IsolationForest is not supported") and a TargetEncoder that
    encodes feature combinations (one encoding, where scikit-learn's form has
    one per feature: from_sklearn fails on it).
    """
    name = type(estimator).__name__
    if name == "IsolationForest":
        return False
    return not (name == "TargetEncoder" and getattr(estimator, "multi_feature_mode", None) == "combination")


# Methods a request may call on a fitted estimator (if the class has them).
METHODS = frozenset({
    "fit", "fit_transform", "fit_predict", "partial_fit",
    "predict", "predict_proba", "predict_log_proba", "decision_function",
    "transform", "inverse_transform", "score", "score_samples", "kneighbors",
    "mahalanobis", "sample",
})
FIT_METHODS = frozenset({"fit", "fit_transform", "fit_predict", "partial_fit"})
DEVICE_OUTPUT_METHODS = frozenset({"transform", "fit_transform", "inverse_transform"})


def _load(path):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class Backend:
    """Builds estimators from the table and moves their fitted state."""

    name = "?"
    #: inputs are copied to device memory by the estimator, so views of the
    #: shared pool may be passed without a copy
    device_resident = False
    #: float dtype the client should send (None: keep what the user gave)
    float_dtype = None
    column = 0  # which entry of CLASSES this backend uses

    def __init__(self):
        self._classes = {}
        self._accepted = {}

    def output_context(self, method):
        """The context an estimator method runs in (cuML: some results stay on the device)."""
        return contextlib.nullcontext()

    def estimator_class(self, name):
        if not isinstance(name, str) or name not in CLASSES:
            raise ValueError(f"unknown estimator {name!r}; this worker offers {sorted(CLASSES)}")
        cls = self._classes.get(name)
        if cls is None:
            cls = self._classes[name] = _load(CLASSES[name][self.column])
        return cls

    def create(self, name, params):
        """An unfitted estimator; parameters the class does not take are dropped and named."""
        cls = self.estimator_class(name)
        accepted = self._accepted.get(name)
        if accepted is None:
            accepted = self._accepted[name] = frozenset(inspect.signature(cls).parameters)
        kept = {k: v for k, v in params.items() if k in accepted}
        return cls(**kept), sorted(set(params) - set(kept))

    def export_state(self, estimator):
        """(format, bytes) of a fitted estimator, preferring plain scikit-learn."""
        return "sklearn", cloudpickle.dumps(estimator)

    def import_state(self, name, fmt, blob):
        if fmt != "sklearn":
            raise ValueError(f"the {self.name} backend cannot load state of format {fmt!r}")
        model = cloudpickle.loads(blob)
        expected = _load(CLASSES[name][0])
        if not isinstance(model, expected):
            raise TypeError(f"state is a {type(model).__name__}, expected {expected.__name__}")
        return model

    def versions(self):
        import sklearn

        return {"python": platform.python_version(), "numpy": np.__version__, "scikit-learn": sklearn.__version__}

    def warm_up(self):
        """Pay one-time set-up costs before the worker reports ready."""


# ---------------------------------------------------------------- cuML -> scikit-learn parameters
# What the scikit-learn backend builds for a cuML parameter set: each function
# mirrors cuML 26.10's own ``_params_to_cpu`` (the conversion behind
# ``as_sklearn()``), so the CPU backend runs what cuML would hand to
# scikit-learn. A function takes the wrapper's parameters (a copy) and
# returns scikit-learn's; what it leaves under a name scikit-learn's class
# does not take is dropped, and the client warns about a dropped parameter the
# user changed from its default. Where cuML's conversion would refuse a value
# (UnsupportedOnCPU), so does this one, with a ValueError.


def _rename(params, **names):
    for cuml_name, sklearn_name in names.items():
        if cuml_name in params:
            params[sklearn_name] = params.pop(cuml_name)
    return params


def _unsupported(name, param, value):
    return ValueError(f"{name}: {param}={value!r} has no scikit-learn equivalent (cuML's as_sklearn() "
                      "refuses it too); the scikit-learn backend cannot run it")


def _logistic_to_sklearn(params):
    """cuML's penalty/solver to scikit-learn >= 1.8's l1_ratio (and C=inf for no penalty).

    (cuML 26.10's own conversion keys l1_ratio on ``self.l1_ratio`` instead of
    ``self.penalty``; this follows what the parameters mean.)
    """
    penalty = params.pop("penalty", "l2")
    params.pop("solver", None)
    l1_ratio = {"l1": 1.0, "elasticnet": params.get("l1_ratio")}.get(penalty, 0.0)
    if penalty in (None, "none"):
        params["C"] = float("inf")
    params["l1_ratio"] = l1_ratio
    params["solver"] = "lbfgs" if not l1_ratio else "saga"
    return params


def _pca_to_sklearn(params):
    """As cuML's own as_sklearn(): tol 1e-7 is scikit-learn's 0.0, 'jacobi' is 'auto'."""
    if params.get("tol") == 1e-7:
        params["tol"] = 0.0
    if params.get("svd_solver") == "jacobi":
        params["svd_solver"] = "auto"
    return params


def _tsvd_to_sklearn(params):
    """cuML's solvers differ: its default tol and n_iter become scikit-learn's; always randomized."""
    if params.get("tol") == 1e-7:
        params["tol"] = 0.0
    if params.get("n_iter") == 15:
        params["n_iter"] = 5
    params["algorithm"] = "randomized"
    return params


def _kmeans_to_sklearn(params):
    if params.get("init") in ("scalable-k-means++", "k-means||"):
        params["init"] = "k-means++"
    return params


def _elastic_net_to_sklearn(params):
    """Other algorithms: cuML scales tol by 0.1 (found equivalent empirically); no solver."""
    params["tol"] = 0.1 * params["tol"]
    return params


def _ridge_to_sklearn(params):
    solver = params.get("solver", "auto")
    params["solver"] = {"auto": "auto", "svd": "svd", "eig": "cholesky", "lsmr": "lsqr"}.get(solver, "auto")
    return params


def _liblinear_to_sklearn(params):
    """cuML's linear SVMs are deterministic (quasi-Newton); liblinear is seeded so that it is too."""
    params["random_state"] = 0
    return params


def _neighbors_to_sklearn(params):
    params["algorithm"] = "auto" if params.get("algorithm", "auto") == "auto" else "brute"
    return params


def _dbscan_to_sklearn(params):
    params["algorithm"] = "brute"
    return params


def _hdbscan_to_sklearn(params):
    """cuML converts to hdbscan.HDBSCAN; scikit-learn's has the same core parameters."""
    if not params.get("max_cluster_size"):
        params["max_cluster_size"] = None
    p = params.pop("p", None)
    if p is not None:
        params["metric_params"] = {"p": p}
    params["copy"] = True  # scikit-learn >= 1.8 warns unless copy is given
    return params


def _spectral_clustering_to_sklearn(params):
    params["assign_labels"] = "kmeans"
    return params


def _forest_to_sklearn(params):
    criterion = params.pop("split_criterion", None)
    mapped = {"gini": "gini", 0: "gini", "entropy": "entropy", 1: "entropy",
              "mse": "squared_error", 2: "squared_error", "poisson": "poisson", 4: "poisson"}.get(criterion)
    if mapped is None:
        raise _unsupported("RandomForest", "split_criterion", criterion)
    params["criterion"] = mapped
    leaves = params.pop("max_leaves", -1)
    params["max_leaf_nodes"] = None if leaves == -1 else leaves
    return params


def _tsne_to_sklearn(params):
    params["method"] = "exact" if str(params.get("method")).lower() == "exact" else "barnes_hut"
    return params


def _umap_to_sklearn(params):
    if params.get("precomputed_knn") is None:
        params["precomputed_knn"] = (None, None, None)
    return params


def _label_encoder_to_sklearn(params):
    # Labels are encoded on the client, so unseen ones never reach the worker: the
    # client applies handle_unknown itself.
    params.pop("handle_unknown", None)
    return params


def _target_encoder_to_sklearn(params):
    """cuML's folds and seed; its target mean is scikit-learn's continuous target.

    scikit-learn always encodes features independently (cuML's
    ``multi_feature_mode="independent"``): with several features and cuML's
    default "combination", the two backends differ (cuML cannot convert such a
    model to scikit-learn either).
    """
    from sklearn.model_selection import KFold

    stat = params.pop("stat", "mean")
    if stat != "mean":
        raise _unsupported("TargetEncoder", "stat", stat)
    shuffle = params.pop("split_method", "interleaved") == "random"
    seed = params.pop("seed", 42)
    params["cv"] = KFold(params.pop("n_folds", 4), shuffle=shuffle, random_state=seed if shuffle else None)
    params["smooth"] = float(params.get("smooth", 0))
    params["target_type"] = "continuous"
    params.pop("multi_feature_mode", None)
    return params


_SGD_LOSSES = {"hinge": "hinge", "log": "log_loss", "squared_loss": "squared_error"}


def _mbsgd_to_sklearn(params):
    """cuML's mini-batch SGD has no scikit-learn form: the nearest is SGDClassifier/SGDRegressor.

    Same loss (by scikit-learn's name), penalty, alpha, l1_ratio, learning-rate
    schedule, eta0, power_t, tol and n_iter_no_change; ``epochs`` is
    ``max_iter``; ``batch_size`` has no equivalent (scikit-learn updates per
    sample). cuML's class has no random_state; the CPU backend seeds 0 so
    that its fits repeat.
    """
    loss = params.get("loss")
    if loss not in _SGD_LOSSES:
        raise ValueError(f"loss must be one of {sorted(_SGD_LOSSES)}, got {loss!r}")
    params["loss"] = _SGD_LOSSES[loss]
    _rename(params, epochs="max_iter")
    params["random_state"] = 0
    return params


# cuML parameter values that mean something else (or nothing) to scikit-learn
TO_SKLEARN = {
    "LogisticRegression": _logistic_to_sklearn,
    "Lasso": _elastic_net_to_sklearn,
    "ElasticNet": _elastic_net_to_sklearn,
    "Ridge": _ridge_to_sklearn,
    "MBSGDClassifier": _mbsgd_to_sklearn,
    "MBSGDRegressor": _mbsgd_to_sklearn,
    "LinearSVC": _liblinear_to_sklearn,
    "LinearSVR": _liblinear_to_sklearn,
    "PCA": _pca_to_sklearn,
    "TruncatedSVD": _tsvd_to_sklearn,
    "KMeans": _kmeans_to_sklearn,
    "DBSCAN": _dbscan_to_sklearn,
    "HDBSCAN": _hdbscan_to_sklearn,
    "SpectralClustering": _spectral_clustering_to_sklearn,
    "NearestNeighbors": _neighbors_to_sklearn,
    "KNeighborsClassifier": _neighbors_to_sklearn,
    "KNeighborsRegressor": _neighbors_to_sklearn,
    "RandomForestClassifier": _forest_to_sklearn,
    "RandomForestRegressor": _forest_to_sklearn,
    "TSNE": _tsne_to_sklearn,
    "UMAP": _umap_to_sklearn,
    "LabelEncoder": _label_encoder_to_sklearn,
    "TargetEncoder": _target_encoder_to_sklearn,
}


class SklearnBackend(Backend):
    name = "sklearn"
    column = 0

    def create(self, name, params):
        translate = TO_SKLEARN.get(name)
        return super().create(name, translate(dict(params)) if translate else params)


class CumlBackend(Backend):
    name = "cuml"
    column = 1
    device_resident = True
    float_dtype = "float32"

    def __init__(self):
        super().__init__()
        import cuml

        cuml.set_global_output_type("numpy")
        self._cuml = cuml

    def output_context(self, method):
        # The bulky results of transforms stay CuPy arrays until the reply is encoded, which
        # copies them from the device straight into the client's pool room: no numpy copy in
        # between. Only there: cuML's multiclass SVC, for one, fails to predict under "cupy".
        if method in DEVICE_OUTPUT_METHODS:
            return self._cuml.using_output_type("cupy")
        return contextlib.nullcontext()

    def export_state(self, estimator):
        as_sklearn = getattr(estimator, "as_sklearn", None)
        # Only a scikit-learn form is a promise the client can keep: cuML's UMAP and HDBSCAN
        # convert to umap-learn / hdbscan objects, which a client without those packages
        # could not unpickle. Those travel as cuML's pickle (opaque to the client).
        cpu_class = getattr(estimator, "_cpu_class_path", "sklearn.")
        if as_sklearn is not None and cpu_class.startswith("sklearn.") and _converts_back(estimator):
            try:
                return "sklearn", cloudpickle.dumps(as_sklearn())
            except Exception as exc:  # noqa: BLE001 - conversion is optional; use cuML's pickle
                log.info("%s has no scikit-learn form (%s); sending cuML's own pickle",
                         type(estimator).__name__, exc)
        return "cuml", cloudpickle.dumps(estimator)

    def import_state(self, name, fmt, blob):
        cls = self.estimator_class(name)
        if fmt == "sklearn":
            return cls.from_sklearn(super().import_state(name, fmt, blob))
        if fmt == "cuml":
            model = cloudpickle.loads(blob)
            if not isinstance(model, cls):
                raise TypeError(f"state is a {type(model).__name__}, expected {cls.__name__}")
            return model
        raise ValueError(f"unknown state format {fmt!r}")

    def versions(self):
        versions = super().versions()
        versions["cuml"] = self._cuml.__version__
        try:
            import cupy

            device = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(device.id)
            free, total = device.mem_info
            versions["cupy"] = cupy.__version__
            versions["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            versions["gpu_memory_total"] = int(total)
        except Exception:  # noqa: BLE001 - informative only
            log.debug("could not query the GPU", exc_info=True)
        return versions

    def warm_up(self):
        rng = np.random.default_rng(0)
        X = rng.standard_normal((256, 8)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int32)
        for name in WARM_UP:
            est, _ = self.create(name, {})
            try:
                if name in ("LogisticRegression", "SVC"):
                    est.fit(X, y)
                else:
                    est.fit(X)
            except Exception:  # noqa: BLE001 - warm-up is best effort; real calls report errors
                log.warning("warm-up of %s failed", name, exc_info=True)


def make_backend(choice):
    """The backend for ``auto|cuml|sklearn``; returns (backend, reason for fallback or None)."""
    if choice == "sklearn":
        return SklearnBackend(), None
    if choice == "cuml":
        return CumlBackend(), None
    if choice != "auto":
        raise ValueError(f"backend must be auto, cuml or sklearn, not {choice!r}")
    try:
        return CumlBackend(), None
    except Exception as exc:  # noqa: BLE001 - any import failure means "no cuML here"
        return SklearnBackend(), f"cuML is not usable here ({type(exc).__name__}: {exc})"
