"""cuML parameters to scikit-learn's: what the scikit-learn backend builds for a cuML parameter set.

Each function mirrors cuML 26.10's own ``_params_to_cpu`` (the conversion
behind ``as_sklearn()``), so the CPU backend runs what cuML would hand to
scikit-learn. A function takes the wrapper's parameters (a copy) and returns
scikit-learn's; what it leaves under a name scikit-learn's class does not
take is dropped by the backend. Where cuML's conversion would refuse a value
(UnsupportedOnCPU), so does this one, with a ValueError.

Shared by both sides: imports nothing of the package.
"""


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
    """cuML's solvers differ: its default tol and n_iter become scikit-learn's; always randomized.

    Sparse X runs scikit-learn's randomized solver on any backend (the worker's ``sparse_svd``), with these
    parameters: cuML's ``algorithm`` names a dense solver, so it has no say there.
    """
    if params.get("tol") == 1e-7:
        params["tol"] = 0.0
    if params.get("n_iter") == 15:
        params["n_iter"] = 5
    params["algorithm"] = "randomized"
    return params


def _kmeans_to_sklearn(params):
    if isinstance(params.get("init"), str) and params["init"] in ("scalable-k-means++", "k-means||"):
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


#: cuML parameter values that mean something else (or nothing) to scikit-learn, by class name
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
}


def to_sklearn(name, params):
    """scikit-learn's parameters for a ``name`` built with cuML's ``params`` (a new dict)."""
    translate = TO_SKLEARN.get(name)
    return translate(dict(params)) if translate else dict(params)
