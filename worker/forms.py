"""A fitted cuML model in a form that predicts without cuML (its *portable* form).

cuML converts most of its models itself (``as_sklearn()``). For the rest,
this module builds the scikit-learn model from cuML's fitted parts, or, where
scikit-learn has no class for what cuML does, the package's own
(:mod:`sklearn_gpu_bridge.portable`):

| cuML class | portable form |
| --- | --- |
| SVC of 3+ classes (cuML cannot convert it) | ``portable.CumlLikeSVC`` of its binary SVCs, each ``as_sklearn()`` |
| SVC as scikit-learn's (``multiclass_svc.SklearnSVC``) | scikit-learn's ``SVC``, the pairs in libsvm's layout |
| TargetEncoder (cuML's conversion loses "combination" encodings) | ``portable.CumlLikeTargetEncoder`` |
| MinMaxScaler, MaxAbsScaler (no conversion in cuML 26.10) | scikit-learn's, with cuML's fitted attributes |
| PolynomialFeatures (no conversion) | scikit-learn's, fitted on one row of zeros (its state is the input width) |
| the five naive Bayes classes (no conversion) | scikit-learn's, with cuML's counts and log-probabilities |
| MBSGDClassifier, MBSGDRegressor (no conversion) | ``portable.CumlLikeSGDClassifier`` (cuML's threshold) / SGDRegressor, with cuML's coefficients |
| HDBSCAN (cuML converts to the hdbscan package) | scikit-learn's HDBSCAN with cuML's labels and probabilities |
| UMAP (cuML converts to umap-learn) | umap-learn's UMAP, where umap-learn is installed (else none) |

Every function takes the fitted cuML estimator and returns the portable
model (or None where there is none).
"""

import numpy as np


def host(value):
    """A CuPy (or cuDF, or NumPy) array as a NumPy array."""
    if hasattr(value, "to_numpy"):
        return value.to_numpy()
    if hasattr(value, "get"):
        return value.get()
    return np.asarray(value)


def _copy_fitted(source, target, names):
    for name in names:
        if hasattr(source, name):
            value = getattr(source, name)
            setattr(target, name, host(value) if hasattr(value, "shape") and not np.isscalar(value) else value)
    for name in ("n_features_in_", "feature_names_in_"):
        if hasattr(source, name):
            setattr(target, name, getattr(source, name))
    return target


def _built(cls, params):
    """``cls`` made with those of ``params`` it takes (cuML's classes take more, or other, parameters)."""
    takes = cls().get_params()
    return cls(**{k: v for k, v in params.items() if k in takes})


def svc(model):
    from sklearn_gpu_bridge.portable import CumlLikeSVC

    if not hasattr(model, "_multiclass"):
        return model.as_sklearn()
    wrapper = model._multiclass.multiclass_estimator
    portable = _built(CumlLikeSVC, model.get_params())
    portable.estimators_ = [binary.as_sklearn() for binary in wrapper.estimators_]
    portable.classes_ = host(model.classes_)
    portable.n_features_in_ = model.n_features_in_
    return portable


def sklearn_svc(model):
    return model.to_sklearn()


def target_encoder(model):
    from sklearn_gpu_bridge.portable import CumlLikeTargetEncoder

    portable = _built(CumlLikeTargetEncoder, model.get_params())
    portable.n_features_in_ = model.n_features_in_
    portable.categories_ = [host(c) for c in model.categories_]
    portable.target_type_, portable.classes_ = model.target_type_, getattr(model, "classes_", None)
    portable.mean_, portable.y_stat_val_ = float(model.mean), float(model.y_stat_val)
    portable.mean2_ = float(getattr(model, "mean2", np.nan))
    tables = model.encode_all if isinstance(model.encode_all, list) else [model.encode_all]
    portable.encodings_ = []
    for table in tables:
        keys = [c for c in table.columns if str(c).startswith("X_")]
        rows = zip(*(host(table[c]) for c in keys), host(table["out"]))
        portable.encodings_.append({tuple(row[:-1]): float(row[-1]) for row in rows})
    train = model.train.sort_values("id")
    portable.train_X_ = np.column_stack([host(train[f"X_{i}"]) for i in range(model.n_features_in_)])
    portable.train_encoding_ = host(model.train_encode).reshape(len(portable.train_X_), -1)
    return portable


def scaler(model):
    from sklearn import preprocessing

    target = _built(getattr(preprocessing, type(model).__name__), model.get_params())
    return _copy_fitted(model, target, ("min_", "scale_", "data_min_", "data_max_", "data_range_", "max_abs_",
                                         "n_samples_seen_"))


def polynomial_features(model):
    from sklearn.preprocessing import PolynomialFeatures

    target = PolynomialFeatures(degree=model.degree, interaction_only=model.interaction_only,
                                include_bias=model.include_bias, order=model.order)
    return target.fit(np.zeros((1, model.n_features_in_)))


def naive_bayes(model):
    from sklearn import naive_bayes

    name = type(model).__name__
    target = _built(getattr(naive_bayes, name), model.get_params())
    target.classes_ = host(model.classes_)
    if name == "GaussianNB":
        target.theta_, target.var_ = host(model.theta_), host(model.sigma_)
        return _copy_fitted(model, target, ("class_count_", "class_prior_", "epsilon_"))
    if name == "CategoricalNB":
        return _categorical(model, target)
    return _copy_fitted(model, target, ("class_count_", "feature_count_", "feature_log_prob_", "class_log_prior_",
                                         "feature_all_"))


def _categorical(model, target):
    """cuML keeps counts as one (features x classes x categories) array, padded to the largest category."""
    counts = model.category_count_
    n_features, n_classes = model.n_features_, model.n_classes_
    if hasattr(counts, "tocoo"):  # fit on sparse input: rows are feature + n_features * class
        counts = host(counts.toarray()).reshape(n_classes, n_features, -1).transpose(1, 0, 2)
    counts = host(counts)
    target.category_count_, target.feature_log_prob_, n_categories = [], [], []
    for feature in range(n_features):
        seen = np.flatnonzero(counts[feature].sum(axis=0))
        width = int(seen.max()) + 1 if len(seen) else 1
        count = counts[feature][:, :width].astype(np.float64)
        target.category_count_.append(count)
        target.feature_log_prob_.append(np.log(count + model.alpha)
                                        - np.log(count.sum(axis=1, keepdims=True) + width * model.alpha))
        n_categories.append(width)
    target.n_categories_ = np.array(n_categories)
    return _copy_fitted(model, target, ("class_count_", "class_log_prior_"))


def mbsgd(model):
    from sklearn.linear_model import SGDRegressor

    from sklearn_gpu_bridge.portable import CumlLikeSGDClassifier
    from sklearn_gpu_bridge.translate import to_sklearn

    classifier = type(model).__name__ == "MBSGDClassifier"
    cls = CumlLikeSGDClassifier if classifier else SGDRegressor
    target = _built(cls, to_sklearn(type(model).__name__, model.get_params()))
    coef = host(model.coef_).reshape(1, -1) if classifier else host(model.coef_).ravel()
    target.coef_, target.intercept_ = coef, np.atleast_1d(host(model.intercept_)).astype(coef.dtype)
    if classifier:
        target.classes_ = np.array([0, 1])
    target.t_, target.n_iter_ = 1.0, getattr(model, "n_iter_", None)
    return _copy_fitted(model, target, ())


def hdbscan(model):
    from sklearn.cluster import HDBSCAN

    target = _built(HDBSCAN, model.get_params())
    return _copy_fitted(model, target, ("labels_", "probabilities_"))


def umap(model):
    try:
        import umap  # noqa: F401
    except ImportError:
        return None
    return model.as_sklearn()


#: classes whose portable form does not go back into cuML as it was, so their cuML (native) state travels
#: too: those built here (cuML has no conversion back, or a lossy one), but a binary SVC (cuML's own
#: as_sklearn/from_sklearn; a multiclass one is a CumlLikeSVC, not scikit-learn's class), and
#: IsolationForest (cuML 26.10 converts a fitted one to scikit-learn but not back)
NOT_ROUND_TRIP = frozenset({"TargetEncoder", "MinMaxScaler", "MaxAbsScaler", "PolynomialFeatures", "GaussianNB",
                            "MultinomialNB", "BernoulliNB", "ComplementNB", "CategoricalNB", "MBSGDClassifier",
                            "MBSGDRegressor", "HDBSCAN", "UMAP", "IsolationForest"})

BUILDERS = {
    "SVC": svc, "SklearnSVC": sklearn_svc, "TargetEncoder": target_encoder, "MinMaxScaler": scaler,
    "MaxAbsScaler": scaler,
    "PolynomialFeatures": polynomial_features, "GaussianNB": naive_bayes, "MultinomialNB": naive_bayes,
    "BernoulliNB": naive_bayes, "ComplementNB": naive_bayes, "CategoricalNB": naive_bayes,
    "MBSGDClassifier": mbsgd, "MBSGDRegressor": mbsgd, "HDBSCAN": hdbscan, "UMAP": umap,
}
