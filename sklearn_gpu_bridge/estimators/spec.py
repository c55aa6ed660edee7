"""Wrappers from declarations: one ``remote_estimator(...)`` call per cuML class.

A declaration names the class (its key in the worker's table, ``backends.CLASSES``),
its kind, cuML's ``__init__`` parameters as they read in cuML's source, and
the methods it has::

    GPURidge = remote_estimator(
        "Ridge", "regressor",
        "alpha=1.0, *, fit_intercept=True, solver='auto', tol=1e-4, max_iter=None, copy_X=True",
        weighted="fit",
        doc="Ridge regression.",
    )

From that, the class is built with a REAL ``__init__`` (generated from the
parameter text, as dataclasses generates its ``__init__``), so that
scikit-learn's ``get_params`` (which reads ``inspect.signature``), ``clone`` and
``GridSearchCV`` see the parameters, names and defaults. The class gets the
module and qualified name of the module-level variable it is assigned to, so
it pickles by reference like a hand-written class.
"""

import inspect
import sys

import numpy as np
from sklearn.base import (
    ClassifierMixin,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    OneToOneFeatureMixin,
    OutlierMixin,
    RegressorMixin,
    TransformerMixin,
)
from sklearn.utils.validation import check_is_fitted

from . import base

#: every wrapper built, by class name (tests and docs walk it)
REGISTRY = {}

# kind -> (scikit-learn mixins, what fit does with y, fit without / with sample_weight)
KINDS = {
    "classifier": ((ClassifierMixin,), "labels", base.FitSupervised, base.FitSupervisedWeighted),
    "regressor": ((RegressorMixin,), "values", base.FitSupervised, base.FitSupervisedWeighted),
    "transformer": ((TransformerMixin,), None, base.FitUnsupervised, base.FitUnsupervisedWeighted),
    "supervised-transformer": ((TransformerMixin,), "values", base.FitSupervised, base.FitSupervisedWeighted),
    "clusterer": ((ClusterMixin,), None, base.FitUnsupervised, base.FitUnsupervisedWeighted),
    "outlier-detector": ((OutlierMixin,), None, base.FitUnsupervised, base.FitUnsupervisedWeighted),
    "estimator": ((), None, base.FitUnsupervised, base.FitUnsupervisedWeighted),
    "label-transformer": ((TransformerMixin,), None, None, None),
}

# method name -> (mixin, mixin when the method takes sample_weight)
METHODS = {
    "predict": (base.Predict, None),
    "predict_proba": (base.PredictProba, None),
    "predict_log_proba": (base.PredictLogProba, None),
    "decision_function": (base.DecisionFunction, None),
    "score_samples": (base.ScoreSamples, None),
    "score": (base.Score, base.ScoreWeighted),
    "score_test": (base.ScoreTest, None),
    "transform": (base.Transform, None),
    "inverse_transform": (base.InverseTransform, None),
    "fit_transform": (base.FitTransform, base.FitTransformWeighted),
    "fit_predict": (base.FitPredict, base.FitPredictWeighted),
    "partial_fit": (base.PartialFit, None),
    "partial_fit_classifier": (base.PartialFitClassifier, base.PartialFitClassifierWeighted),
    "kneighbors": (base.KNeighbors, None),
    "mahalanobis": (base.Mahalanobis, None),
    "covariance_extras": (base.CovarianceExtras, None),
    "sample": (base.Sample, None),
}


def remote_estimator(name, kind, params, *, methods="", weighted="", doc, features_out=None,
                     validation=None, tags=None, wire=None, bases=(), mixins=(), namespace=None):
    """Build the ``GPU<name>`` class; assign it to a module-level variable of that name.

    name:         key of the worker's class table (``"Ridge"``)
    kind:         a key of :data:`KINDS`
    params:       cuML's ``__init__`` parameters, as source text (``"alpha=1.0, *, tol=1e-4"``)
    methods:      names from :data:`METHODS`, space-separated (fit is implied by the kind)
    weighted:     the methods that take ``sample_weight`` (``"fit fit_predict"``): those where cuML's does
    features_out: ``"one-to-one"``; a function ``self -> n_features_out`` (names
                  ``<class><i>``, as scikit-learn's decompositions); or ``"model"``:
                  the names of the fitted scikit-learn model
    validation:   keyword arguments for ``validate_data`` on X (default: float dtypes)
    tags:         ``{"input_tags.allow_nan": True, ...}`` over the kind's tags
    wire:         parameter values sent to the worker in place of the user's
    bases:        class-specific method mixins, before the generated ones
    mixins:       scikit-learn mixins besides the kind's (``TransformerMixin`` for KMeans)
    namespace:    extra names the parameter defaults refer to (``np`` is always there)
    """
    module = sys._getframe(1).f_globals["__name__"]
    cls_name = "GPU" + name
    _, target, fit, fit_weighted = KINDS[kind]
    weighted = set(weighted.split())
    method_names = methods.split()
    unknown = (set(method_names) - set(METHODS)) | (weighted - set(method_names) - {"fit"})
    if unknown:
        raise ValueError(f"{cls_name}: unknown methods {sorted(unknown)}")

    chosen = list(bases)
    if fit is not None:
        chosen.append(fit_weighted if "fit" in weighted else fit)
    for method in method_names:
        plain, with_weight = METHODS[method]
        chosen.append(with_weight if method in weighted else plain)
    chosen += _features_out_bases(features_out)
    chosen += list(mixins) + list(KINDS[kind][0])
    chosen.append(base.RemoteEstimator)

    attrs = {
        "__module__": module,
        "__qualname__": cls_name,
        "__doc__": _docstring(name, doc, params, method_names, weighted),
        "__init__": _make_init(cls_name, module, params, namespace),
        "_remote_name": name,
        "_target": target,
    }
    if validation is not None:
        attrs["_validation"] = validation
    if wire:
        attrs["_wire_params"] = dict(wire)
    if callable(features_out):
        attrs["_n_features_out"] = property(features_out)
    bases_ = tuple(_dedupe(chosen))
    if any(issubclass(b, TransformerMixin) for b in bases_):
        # scikit-learn's set_output wraps only the transform/fit_transform a class defines
        # itself: give the class its own reference to the mixins' methods
        probe = type(cls_name, bases_, dict(attrs))
        for method in ("transform", "fit_transform"):
            owner = next((k for k in probe.__mro__ if method in k.__dict__), None)
            if owner is not None and not issubclass(owner, TransformerMixin):
                attrs[method] = owner.__dict__[method]
    cls = type(cls_name, bases_, attrs)
    if tags:
        _add_tags(cls, dict(tags))
    REGISTRY[cls_name] = cls
    return cls


def _features_out_bases(features_out):
    if features_out is None:
        return []
    if features_out == "one-to-one":
        return [OneToOneFeatureMixin]
    if features_out == "model":
        return [ModelFeatureNames]
    if callable(features_out):
        return [ClassNamePrefixFeaturesOutMixin]
    raise ValueError(f"features_out must be 'one-to-one', 'model' or a function, not {features_out!r}")


class ModelFeatureNames:
    """Output feature names as the fitted scikit-learn model gives them (they depend on the fit)."""

    def get_feature_names_out(self, input_features=None):
        check_is_fitted(self)
        model = self.sklearn_model_
        if model is None:
            raise AttributeError(
                f"{type(self).__name__}.get_feature_names_out needs the scikit-learn form of the "
                "model, which this backend could not give"
            )
        if input_features is None and hasattr(self, "feature_names_in_"):
            input_features = self.feature_names_in_
        return model.get_feature_names_out(input_features)


def _add_tags(cls, overrides):
    """``cls.__sklearn_tags__``: its bases' tags, then the declared overrides."""

    def __sklearn_tags__(self):
        tags = super(cls, self).__sklearn_tags__()
        for path, value in overrides.items():
            target = tags
            *parents, leaf = path.split(".")
            for part in parents:
                target = getattr(target, part)
            setattr(target, leaf, value)
        return tags

    __sklearn_tags__.__qualname__ = f"{cls.__qualname__}.__sklearn_tags__"
    cls.__sklearn_tags__ = __sklearn_tags__


def _dedupe(classes):
    seen, out = set(), []
    for cls in classes:
        if cls not in seen:
            seen.add(cls)
            out.append(cls)
    return out


def _make_init(cls_name, module, params, namespace):
    """``def __init__(self, <params>): self.<p> = <p> ...``, compiled like dataclasses does."""
    scope = {"np": np, **(namespace or {})}
    exec(f"def __init__(self, {params}):\n    pass\n", scope)  # noqa: S102 - our own literal text
    names = list(inspect.signature(scope["__init__"]).parameters)[1:]
    if len(set(names)) != len(names) or any(n in ("verbose", "output_type", "handle") for n in names):
        raise ValueError(f"{cls_name}: bad parameter list {names}")
    body = "".join(f"    self.{n} = {n}\n" for n in names) or "    pass\n"
    exec(f"def __init__(self, {params}):\n{body}", scope)  # noqa: S102
    init = scope["__init__"]
    init.__qualname__ = f"{cls_name}.__init__"
    init.__module__ = module
    return init


def _docstring(name, doc, params, methods, weighted):
    from ..worker.backends import CLASSES

    cpu, gpu = CLASSES[name]
    shown = ["fit"] + [m for m in methods if m not in ("score_test", "partial_fit_classifier",
                                                       "covariance_extras")]
    if "partial_fit_classifier" in methods:
        shown.append("partial_fit")
    weights = sorted(weighted) or ["none"]
    return (
        f"``{gpu}`` on the worker: {doc}\n\n"
        f"Parameters (cuML's, same names and defaults): ``{params}``.\n\n"
        f"Methods: {', '.join(shown)}. ``sample_weight`` in: {', '.join(weights)}.\n"
        f"On the scikit-learn backend it runs ``{cpu}``.\n"
    )
