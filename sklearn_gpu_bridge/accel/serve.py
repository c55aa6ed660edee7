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
:mod:`.report` counts where each call ran and why. The fits of every other
scikit-learn estimator are counted too, with why it is not served, so that
the report names every class the code used.
"""

import functools
import sys
import threading
import weakref

from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._set_output import _wrap_method_output

from .. import callbacks
from ..catalogue import ESTIMATORS, load
from ..errors import RemoteTraceback
from ..estimators import search_threads
from . import report

#: catalogue rows not served, and why: scikit-learn's class answers something else than cuML's, or takes no
#: X, or is not scikit-learn's (UMAP)
NOT_SERVED = {
    "MBSGDClassifier": "cuML's MBSGD is another algorithm than SGD",
    "MBSGDRegressor": "cuML's MBSGD is another algorithm than SGD",
    "TargetEncoder": "cuML's differs by design",
    "HDBSCAN": "cuML's differs by design",
    "LabelEncoder": "no array work to move",
    "LabelBinarizer": "no array work to move",
    "OneHotEncoder": "no array work to move",
    "UMAP": "not scikit-learn's",
}
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
    """Patch every served class, and count the fits of the other scikit-learn estimators (idempotent)."""
    if _patched:
        return
    search_threads.install()  # a search of served classes runs its fits in threads
    _patched[BaseEstimator, "_validate_params"] = BaseEstimator.__dict__["_validate_params"]
    BaseEstimator._validate_params = _counting(BaseEstimator._validate_params)
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
    """Why a call left the worker: the worker's refusal, or what made the client run it on its CPU."""
    text = str(exc).split("\n")[0].strip()
    text = f"{type(exc).__name__}: {text}"[:160] if text else type(exc).__name__
    return ("refused by the worker: " if isinstance(exc.__cause__, RemoteTraceback) else "fell back: ") + text


def _counting(validate):
    """``BaseEstimator._validate_params``, which scikit-learn's fit methods call first, recording the fits of
    the classes and methods accel does not serve (the served ones record their own calls)."""

    @functools.wraps(validate)
    def _validate_params(self):
        cls = type(self)
        if cls.__module__.startswith("sklearn.") and not getattr(_cpu, "depth", 0):
            method = _fit_method(sys._getframe(1))
            if not _is_served(cls, method):
                report.record(cls, method, "cpu", _not_served(self, method))
        return validate(self)

    return _validate_params


def _fit_method(frame):
    """The method that scikit-learn's ``_fit_context`` (the caller) wraps: "fit", "partial_fit" ..."""
    method = frame.f_locals.get("fit_method") if frame.f_code.co_name == "wrapper" else None
    return getattr(method, "__name__", "fit")


def _is_served(cls, method):
    return getattr(getattr(cls, method, None), "_sklearn_gpu_bridge", False)


def _not_served(estimator, method):
    cls = type(estimator)
    if _is_served(cls, "fit"):
        return (f"not served: {method} updates a model batch by batch, on the CPU" if method in PLAIN
                else f"not served: {method} runs on the CPU")
    for name, why in NOT_SERVED.items():
        if ESTIMATORS[name].sklearn.rsplit(".", 1)[-1] == cls.__name__:
            return f"not served: {why}"
    if any(_holds_estimators(value) for value in estimator.get_params(deep=False).values()):
        return "not served: it holds estimators, which have rows of their own"
    return "not served: cuML has no counterpart"


def _holds_estimators(value):
    """An estimator, or a list of them or of (name, estimator) pairs (Pipeline's steps, VotingClassifier's ...)."""
    if isinstance(value, BaseEstimator):
        return True
    return isinstance(value, list) and any(isinstance(item, BaseEstimator) or (
        isinstance(item, tuple) and any(isinstance(v, BaseEstimator) for v in item)) for item in value)


def _fitting(name, cls, method, original):
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if getattr(_cpu, "depth", 0):
            return original(self, *args, **kwargs)
        served = []

        def run():
            try:
                wrapper = _wrapper(name, self)
                fitted = getattr(wrapper, method)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - whatever the worker could not do, scikit-learn does here
                _served.pop(self, None)
                report.record(cls, method, "cpu", _reason(exc))
                with callbacks.hidden(self):  # within this task: scikit-learn's own fit starts no second one
                    return _run_on_cpu(original, self, args, kwargs)
            _adopt(self, wrapper)
            served.append(wrapper)
            return self if fitted is wrapper else fitted

        # the estimator's own callbacks: one task around the fit, on the worker or, failing that, on the CPU
        result = callbacks.fit_task(self, run, X=args[0] if args else kwargs.get("X"),
                                    y=args[1] if len(args) > 1 else kwargs.get("y"),
                                    metadata={"sample_weight": kwargs.get("sample_weight")})
        if served:
            _served[self] = served[0]
            report.record(cls, method, "worker")
        return result

    fit._sklearn_gpu_bridge = True
    return fit


def _calling(cls, method, original):
    @functools.wraps(original)
    def call(self, *args, **kwargs):
        wrapper = _served.get(self)
        if getattr(_cpu, "depth", 0):
            return original(self, *args, **kwargs)
        if wrapper is None:  # its own nested calls (predict's predict_proba ...) are not counted again
            report.record(cls, method, "cpu", "fitted on the CPU, or loaded: no model on the worker")
            return _run_on_cpu(original, self, args, kwargs)
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
