"""Wrappers from declarations: one ``remote_estimator(...)`` call per cuML class.

A declaration names the class (its row in the catalogue, which lists its
methods and which of them take ``sample_weight``), its kind, and cuML's
``__init__`` parameters as they read in cuML's source::

    GPURidge = remote_estimator(
        "Ridge", "regressor",
        "alpha=1.0, *, fit_intercept=True, solver='auto', tol=1e-4, max_iter=None, copy_X=True",
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

from ..catalogue import lookup
from . import methods as m
from . import search_threads
from .base import RemoteEstimator

search_threads.install()

#: every wrapper built, by class name (tests and docs walk it)
WRAPPERS = {}

# kind -> (scikit-learn mixins, what fit does with y, fit without / with sample_weight)
KINDS = {
    "classifier": ((ClassifierMixin,), "labels", m.FitSupervised, m.FitSupervisedWeighted),
    "regressor": ((RegressorMixin,), "values", m.FitSupervised, m.FitSupervisedWeighted),
    "transformer": ((TransformerMixin,), None, m.FitUnsupervised, m.FitUnsupervisedWeighted),
    "supervised-transformer": ((TransformerMixin,), "values", m.FitSupervised, m.FitSupervisedWeighted),
    "clusterer": ((ClusterMixin,), None, m.FitUnsupervised, m.FitUnsupervisedWeighted),
    "outlier-detector": ((OutlierMixin,), None, m.FitUnsupervised, m.FitUnsupervisedWeighted),
    "estimator": ((), None, m.FitUnsupervised, m.FitUnsupervisedWeighted),
    "label-transformer": ((TransformerMixin,), None, None, None),  # the class implements its methods
}

# catalogue method -> (mixin, mixin when the method takes sample_weight)
METHODS = {
    "predict": (m.Predict, None),
    "predict_proba": (m.PredictProba, None),
    "predict_log_proba": (m.PredictLogProba, None),
    "decision_function": (m.DecisionFunction, None),
    "score_samples": (m.ScoreSamples, None),
    "score": (m.Score, m.ScoreWeighted),
    "transform": (m.Transform, None),
    "inverse_transform": (m.InverseTransform, None),
    "fit_transform": (m.FitTransform, m.FitTransformWeighted),
    "fit_predict": (m.FitPredict, m.FitPredictWeighted),
    "partial_fit": (m.PartialFit, None),
    "kneighbors": (m.KNeighbors, None),
    "mahalanobis": (m.Mahalanobis, None),
    "sample": (m.Sample, None),
}
# classifiers learn classes on their first partial_fit
CLASSIFIER_METHODS = {"partial_fit": (m.PartialFitClassifier, m.PartialFitClassifierWeighted)}


def remote_estimator(name, kind, params, *, doc, features_out=None, validation=None, tags=None, wire=None,
                     bases=(), mixins=(), namespace=None):
    """Build the ``GPU<name>`` class; assign it to a module-level variable of that name.

    name:         the class's row in the catalogue (``"Ridge"``): its methods, and which take sample_weight
    kind:         a key of :data:`KINDS`
    params:       cuML's ``__init__`` parameters, as source text (``"alpha=1.0, *, tol=1e-4"``)
    features_out: ``"one-to-one"``; a function ``self -> n_features_out`` (names
                  ``<class><i>``, as scikit-learn's decompositions); or ``"model"``:
                  the names of the fitted scikit-learn model
    validation:   keyword arguments for ``validate_data`` on X (default: float dtypes)
    tags:         ``{"input_tags.allow_nan": True, ...}`` over the kind's tags
    wire:         parameter values sent to the worker in place of the user's
    bases:        class-specific mixins, before the generated ones (they may wrap or replace a method)
    mixins:       scikit-learn mixins besides the kind's (``TransformerMixin`` for KMeans)
    namespace:    extra names the parameter defaults refer to (``np`` is always there)
    """
    module = sys._getframe(1).f_globals["__name__"]
    cls_name = "GPU" + name
    row = lookup(name)
    _, target, fit, fit_weighted = KINDS[kind]

    chosen = list(bases)
    if fit is not None:
        chosen.append(fit_weighted if "fit" in row.weighted else fit)
        table = {**METHODS, **CLASSIFIER_METHODS} if kind == "classifier" else METHODS
        for method in sorted(row.methods):
            plain, with_weight = table[method]
            chosen.append(with_weight if method in row.weighted else plain)
    chosen += _features_out_bases(features_out)
    chosen += list(mixins) + list(KINDS[kind][0])
    chosen.append(RemoteEstimator)

    attrs = {
        "__module__": module,
        "__qualname__": cls_name,
        "__doc__": _docstring(row, doc, params),
        "__init__": _make_init(cls_name, module, params, namespace),
        "_remote_name": name,
        "_target": target,
        "_sparse_fit": row.sparse_fit,
        "_sparse_call": row.sparse_call,
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
    WRAPPERS[cls_name] = cls
    return cls


def _features_out_bases(features_out):
    if features_out is None:
        return []
    if features_out == "one-to-one":
        return [OneToOneFeatureMixin]
    if features_out == "model":
        return [ModelFeatureNames]
    if callable(features_out):
        return [CumlNamePrefixFeaturesOut]
    raise ValueError(f"features_out must be 'one-to-one', 'model' or a function, not {features_out!r}")


class CumlNamePrefixFeaturesOut(ClassNamePrefixFeaturesOutMixin):
    """Output names as cuML's (and scikit-learn's) class gives them: ``pca0``, ``kmeans3``, not ``gpupca0``."""

    def get_feature_names_out(self, input_features=None):
        check_is_fitted(self, "_n_features_out")
        return np.asarray([f"{self._remote_name.lower()}{i}" for i in range(self._n_features_out)], dtype=object)


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


def _docstring(row, doc, params):
    shown = ["fit", *sorted(row.methods)]
    weights = sorted(row.weighted) or ["none"]
    return (
        f"``{row.cuml}`` on the worker: {doc}\n\n"
        f"Parameters (cuML's, same names and defaults): ``{params}``.\n\n"
        f"Methods: {', '.join(shown)}. ``sample_weight`` in: {', '.join(weights)}.\n"
        f"On the scikit-learn backend it runs ``{row.sklearn}``.\n"
    )
