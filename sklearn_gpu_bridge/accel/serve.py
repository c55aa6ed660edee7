"""scikit-learn's own classes, served through the bridge: their methods patched in place.

A served class stays scikit-learn's: its instances are what they were
(``isinstance``, ``clone``, ``get_params``, ``repr``), and after a fit they
hold scikit-learn's fitted state, copied from the worker's portable form, so
that a pickle of one loads and predicts where neither the bridge nor cuML is
installed. The model on the worker is kept beside the instance (a weak
mapping, never pickled) and answers its predict, transform ... calls.

Per call, as ``cuml.accel`` does: what the worker cannot do (cuML's own
conversion says ``UnsupportedOnGPU``, input a class cannot take, a keyword
its method lacks, no worker at all) runs on this CPU with scikit-learn, and
:mod:`.report` counts where each call ran and why.
"""

import functools
import threading
import weakref

from sklearn.base import ClassifierMixin
from sklearn.utils._set_output import _wrap_method_output

from ..catalogue import ESTIMATORS, load
from . import report

#: classes not served: scikit-learn's class answers something else than cuML's (the MBSGD rows are SGD's
#: stand-ins; TargetEncoder, HDBSCAN differ by design), or takes no X (the label encoders), or is not
#: scikit-learn's (UMAP)
NOT_SERVED = frozenset({"MBSGDClassifier", "MBSGDRegressor", "TargetEncoder", "HDBSCAN", "LabelEncoder",
                        "LabelBinarizer", "OneHotEncoder", "UMAP"})
FITTING = ("fit", "fit_transform", "fit_predict")
#: methods that run on the CPU under accel (they update a model in place, one batch at a time)
PLAIN = ("partial_fit",)

_served = weakref.WeakKeyDictionary()  # scikit-learn estimator -> the fitted wrapper serving it
_patched = {}  # (class, method name) -> the original function
_cpu = threading.local()  # inside a CPU fallback: the class's own nested calls run plainly too


def served_classes():
    """{catalogue name: scikit-learn class} of the classes accel serves."""
    out = {}
    for name, row in ESTIMATORS.items():
        if name not in NOT_SERVED and row.sklearn.startswith("sklearn."):
            out[name] = load(row.sklearn)
    return out


def install():
    """Patch every served class (idempotent)."""
    if _patched:
        return
    for name, cls in served_classes().items():
        row = ESTIMATORS[name]
        for method in ("fit", *sorted(row.methods)):
            if method in PLAIN or not callable(getattr(cls, method, None)):
                continue
            original = getattr(cls, method)
            _patched[cls, method] = cls.__dict__.get(method, _INHERITED)
            serve = _fitting(name, cls, method, original) if method in FITTING else _calling(cls, method, original)
            if method in ("transform", "fit_transform") and getattr(cls, "_sklearn_auto_wrap_output_keys", None):
                serve = _wrap_method_output(serve, "transform")  # set_output(transform="pandas") still applies
            setattr(cls, method, serve)


def uninstall():
    """Put every patched method back (tests)."""
    for (cls, method), original in _patched.items():
        if original is _INHERITED:
            delattr(cls, method)
        else:
            setattr(cls, method, original)
    _patched.clear()


def is_installed():
    """Whether the served classes are patched now."""
    return bool(_patched)


_INHERITED = object()


def _run_on_cpu(original, self, args, kwargs):
    _cpu.depth = getattr(_cpu, "depth", 0) + 1
    try:
        return original(self, *args, **kwargs)
    finally:
        _cpu.depth -= 1


def _reason(exc):
    text = str(exc).split("\n")[0].strip()
    return f"{type(exc).__name__}: {text}"[:160] if text else type(exc).__name__


def _fitting(name, cls, method, original):
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if getattr(_cpu, "depth", 0):
            return original(self, *args, **kwargs)
        try:
            wrapper = _wrapper(name, self)
            _refuse_what_cuml_does_otherwise(name, args, kwargs)
            result = getattr(wrapper, method)(*args, **kwargs)
            _adopt(self, wrapper)
        except Exception as exc:  # noqa: BLE001 - whatever the worker could not do, scikit-learn does here
            _served.pop(self, None)
            report.record(cls, method, "cpu", _reason(exc))
            return _run_on_cpu(original, self, args, kwargs)
        _served[self] = wrapper
        report.record(cls, method, "worker")
        return self if result is wrapper else result

    fit._sklearn_gpu_bridge = True
    return fit


def _calling(cls, method, original):
    @functools.wraps(original)
    def call(self, *args, **kwargs):
        wrapper = _served.get(self)
        if wrapper is None or getattr(_cpu, "depth", 0):
            if not getattr(_cpu, "depth", 0):
                report.record(cls, method, "cpu", "fitted on the CPU, or loaded: no model on the worker")
            return original(self, *args, **kwargs)
        try:
            result = getattr(wrapper, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the fitted scikit-learn state answers here instead
            report.record(cls, method, "cpu", _reason(exc))
            return _run_on_cpu(original, self, args, kwargs)
        report.record(cls, method, "worker")
        return result

    call._sklearn_gpu_bridge = True
    return call


def _wrapper(name, estimator):
    """An unfitted ``GPU<name>`` that builds, on the worker, what ``estimator``'s parameters say."""
    from .. import estimators

    wrapper = getattr(estimators, "GPU" + name)()
    wrapper._accel_params = estimator.get_params(deep=False)
    return wrapper


def _refuse_what_cuml_does_otherwise(name, args, kwargs):
    """What cuml.accel also leaves to the CPU before a fit: a multiclass SVC (cuML's answers per class)."""
    y = args[1] if len(args) > 1 else kwargs.get("y")
    if name == "SVC" and y is not None:
        import numpy as np

        if len(np.unique(np.asarray(y))) > 2:
            raise NotImplementedError("multiclass SVC: cuML's is one-vs-one with a column per class, "
                                      "scikit-learn's decision function is another")


def _adopt(estimator, wrapper):
    """Give ``estimator`` the fitted scikit-learn state of the worker's model (its portable form)."""
    model = wrapper.sklearn_model_
    if type(model) is not type(estimator):
        raise TypeError(f"the worker's model is a {type(model).__name__}, not a {type(estimator).__name__}")
    params = set(estimator.get_params(deep=False))
    for key, value in vars(model).items():
        if key not in params:
            estimator.__dict__[key] = value
    for key in ("n_features_in_", "feature_names_in_"):  # the wrapper saw the user's DataFrame
        if key in wrapper.__dict__:
            estimator.__dict__[key] = wrapper.__dict__[key]
        elif key == "feature_names_in_":
            estimator.__dict__.pop(key, None)
    if isinstance(estimator, ClassifierMixin) and "classes_" in wrapper.__dict__:
        estimator.classes_ = wrapper.classes_  # the model was fitted on label codes; these are the labels
