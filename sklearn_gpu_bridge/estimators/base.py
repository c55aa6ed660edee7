"""RemoteEstimator: a real scikit-learn estimator whose work runs on the worker.

Like cuml.accel's proxies, a wrapper keeps its parameters itself (plain
``__init__``, nothing happens until ``fit``) and validates input locally with
scikit-learn's own helpers, so bad input gets scikit-learn's own error before
anything is sent. After ``fit`` it holds a handle to the live estimator on
the worker.

Fitted state (``coef_``, ``mean_`` ...) moves to the client as the
scikit-learn equivalent of the remote model (cuML's ``as_sklearn()``):

- lazily (``state_sync="lazy"``, the default): when a fitted attribute is
  first read, when the wrapper is pickled or copied, or when
  ``sklearn_model_`` is asked for. A ``GridSearchCV`` of many fits moves no
  state at all.
- eagerly (``state_sync="eager"``): right after every fit, so that a fitted
  wrapper survives the loss of the worker that fitted it.

A wrapper whose state is on the client and which meets a worker that does not
know it (a new process, a restarted worker) pushes the state back on first
use. Where no worker can be reached at all, ``cpu_fallback=True`` lets it
answer with the local scikit-learn model (with a warning); by default that is
an error naming the option. A fit never falls back: it needs a worker.

The methods themselves are small mixins (``Predict``, ``Transform`` ...) at
the end of this module; ``spec.py`` puts them together per class.
"""

import warnings
import weakref

import cloudpickle
import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import assert_all_finite
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    FLOAT_DTYPES,
    _check_sample_weight,
    check_array,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from .. import __version__
from ..client import get_connection
from ..config import get_setting
from ..errors import WorkerUnavailable
from ..parallel import PARALLEL_MIN, all_sums_finite
from ..protocol import to_plain

_STATE_KEYS = ("_remote", "_sklearn_model", "_backend_state")
# Set locally by validation; the remote model's copies are never consulted (and
# scikit-learn probes them with getattr on every call, which must stay free).
_LOCAL_ATTRIBUTES = frozenset({
    "n_features_in_", "feature_names_in_", "classes_", "sklearn_model_", "n_samples_fit_",
})
_NO_X = object()


class RemoteHandle:
    """A live estimator on one worker; released (lazily) when this object dies."""

    def __init__(self, connection, handle):
        self.handle = handle
        self.worker_id = connection.hello["worker_id"]
        weakref.finalize(self, connection.schedule_release, handle)

    def usable_on(self, connection):
        return connection.hello["worker_id"] == self.worker_id


class StateLost(WorkerUnavailable):
    """The worker that holds a fitted model is gone, and the client has no copy of its state."""


class RemoteEstimator(BaseEstimator):
    """Base of every ``GPU*`` estimator. Subclasses declare, they do not implement."""

    #: key of the backend's class table ("SVC", "StandardScaler", ...)
    _remote_name = None
    #: keyword arguments for ``validate_data`` on X, as the scikit-learn class uses
    _validation = {"dtype": FLOAT_DTYPES}
    #: what fit does with y: None (ignored), "labels" (classes_, sent as codes),
    #: "values" (numeric targets)
    _target = None
    #: parameter values sent to the worker in place of the user's (results the
    #: wrapper post-processes locally, e.g. sparse output built from a dense one)
    _wire_params = {}
    #: keep ``n_samples_fit_`` (neighbors: the width of kneighbors_graph)
    _records_n_samples = False

    # ------------------------------------------------------------ fitting

    def _validate(self, X, y=_NO_X, **kwargs):
        """``validate_data`` with this class's settings; large float arrays checked in parallel.

        scikit-learn's finite check of a float array sums it in one thread
        (24 ms for 200 MB on the H100 machine); on large arrays the sums run
        in chunks on all cores instead, and only an array that fails them
        goes to scikit-learn's own check, for its exact message.
        """
        settings = {**self._validation, **kwargs}
        finite = settings.get("ensure_all_finite", True)
        large = isinstance(X, np.ndarray) and X.dtype.kind == "f" and X.nbytes >= PARALLEL_MIN
        if large and finite:
            settings["ensure_all_finite"] = False
        out = validate_data(self, X, y, **settings) if y is not _NO_X else validate_data(self, X, **settings)
        if large and finite:
            checked = out[0] if y is not _NO_X else out
            if not all_sums_finite(checked):
                assert_all_finite(checked, allow_nan=finite == "allow-nan", estimator_name=type(self).__name__,
                                  input_name="X")
        return out

    def _validate_fit(self, X, y, reset=True):
        """X (and y) validated as scikit-learn does; y turned into what the worker gets."""
        if self._target is None:
            return self._validate(X, reset=reset), None
        if self._target == "labels":
            X, y = self._validate(X, y, reset=reset)
            if reset:
                self.classes_, y = _classes_and_codes(y)
            else:
                y = self._encode_labels(y)
            return X, y
        return self._validate(X, y, reset=reset, y_numeric=True)

    def _encode_labels(self, y):
        """Codes of labels seen in fit; unseen labels are an error, as in scikit-learn."""
        y = np.asarray(y)
        codes = np.searchsorted(self.classes_, y)
        known = (codes < len(self.classes_)) & (self.classes_.take(np.minimum(codes, len(self.classes_) - 1)) == y)
        if not known.all():
            raise ValueError(f"y contains previously unseen labels: {np.unique(y[~known]).tolist()}")
        return codes

    def _fit_remote(self, method, X, y=None, sample_weight=None, **fit_kwargs):
        """Validate as scikit-learn does, fit on the worker, keep the handle."""
        X, y = self._validate_fit(X, y)
        if self._records_n_samples:
            self.n_samples_fit_ = X.shape[0]
        if sample_weight is not None:
            fit_kwargs["sample_weight"] = _check_sample_weight(sample_weight, X, dtype=X.dtype)
        return self._fit_prepared(method, X, y, fit_kwargs)

    def _fit_prepared(self, method, X, y, fit_kwargs):
        connection = get_connection()  # no worker: WorkerUnavailable; a fit never falls back
        args = [_for_backend(X, connection)] + ([] if y is None else [y])
        params, blob = self._remote_params()
        value = connection.fit(
            self._remote_name, params, method, args, fit_kwargs,
            params_blob=blob, out_nbytes=0 if method in ("fit", "partial_fit") else _out_room(X, self),
        )
        for key in _STATE_KEYS:
            self.__dict__.pop(key, None)
        self._remote = RemoteHandle(connection, value["handle"])
        self._warn_dropped(value.get("dropped", ()))
        if _state_sync() == "eager":
            self._pull_state()
        return value["result"]

    def _partial_fit_remote(self, X, y=None, **kwargs):
        """partial_fit: the first call creates the remote model, later ones update it."""
        if not self.__sklearn_is_fitted__():
            return self._fit_remote("partial_fit", X, y, **kwargs)
        X, y = self._validate_fit(X, y, reset=False)
        args = [X] + ([] if y is None else [y])
        self._run("partial_fit", args, kwargs, fallback=False)
        for key in ("_sklearn_model", "_backend_state"):  # the copy on the client is stale now
            self.__dict__.pop(key, None)
        if _state_sync() == "eager":
            self._pull_state()

    def _remote_params(self):
        """(plain params, None), or (None, cloudpickle blob) when a value is not plain."""
        params = self.get_params(deep=False)
        params.update(self._wire_params)
        if self._target == "labels" and isinstance(params.get("class_weight"), dict):
            # the worker sees label codes, so class weights are keyed by code too
            codes = {label: code for code, label in enumerate(self.classes_.tolist())}
            params["class_weight"] = {
                codes[k]: w for k, w in params["class_weight"].items() if k in codes
            }
        try:
            return to_plain(params), None
        except TypeError:
            return None, cloudpickle.dumps(params)

    def _warn_dropped(self, dropped):
        if not dropped:
            return
        defaults = type(self)().get_params(deep=False)
        changed = [p for p in dropped if p in defaults and not _same(getattr(self, p), defaults[p])]
        if changed:
            warnings.warn(
                f"{type(self).__name__}: the worker's backend has no parameter(s) {changed}; "
                "they were ignored", UserWarning, stacklevel=4,
            )

    # ------------------------------------------------------------ calling

    def _call_remote(self, method, X=_NO_X, *, in_output_space=False, **kwargs):
        """Validate X against the fit, run ``method`` on the worker, return its result.

        ``in_output_space``: X is in the transformed space (inverse_transform),
        so it is checked as an array but not against ``n_features_in_``.
        ``X=None`` (kneighbors of the training set) and no X at all (``sample``)
        send no array.
        """
        check_is_fitted(self)
        if X is _NO_X or X is None:
            args = []
            if X is None:
                args = [None]
        elif in_output_space:
            args = [check_array(X, **self._validation)]
        else:
            args = [self._validate(X, reset=False)]
        return self._run(method, args, kwargs)

    def _run(self, method, args, kwargs, *, fallback=True):
        """``method(*args, **kwargs)`` on the worker; on the local scikit-learn model if allowed."""
        try:
            connection = get_connection()
        except WorkerUnavailable as exc:
            if not fallback:
                raise
            return self._run_on_cpu(method, args, kwargs, exc)
        handle = self._handle_on(connection)
        arrays = [_for_backend(a, connection) if isinstance(a, np.ndarray) else a for a in args]
        first = next((a for a in args if isinstance(a, np.ndarray)), None)
        return connection.call(handle, method, arrays, kwargs,
                               out_nbytes=_out_room(first, self) if first is not None else 0)

    def _run_on_cpu(self, method, args, kwargs, exc):
        name = type(self).__name__
        model = self.__dict__.get("_sklearn_model")
        if model is None:
            raise WorkerUnavailable(
                f"{exc}\n{name}.{method} needs a worker: this fitted model carries no "
                "scikit-learn form of its state to compute it on the CPU"
            ) from exc
        if not get_setting("cpu_fallback"):
            raise WorkerUnavailable(
                f"{exc}\n{name}.{method} could run on the CPU with the scikit-learn model it carries: "
                "set sklearn_gpu_bridge.set_config(cpu_fallback=True) "
                "(or SKLEARN_GPU_BRIDGE_CPU_FALLBACK=1) to allow that"
            ) from exc
        warnings.warn(
            f"{name}.{method}: no worker can be reached ({exc}); computing it on the CPU "
            "with the carried scikit-learn model (cpu_fallback=True)", RuntimeWarning, stacklevel=4,
        )
        return getattr(model, method)(*args, **kwargs)

    def _handle_on(self, connection):
        """The handle on this worker, pushing the fitted state back if the worker is new."""
        remote = self.__dict__.get("_remote")
        if remote is not None and remote.usable_on(connection):
            return remote.handle
        fmt, blob = self._state_blob(connection)
        self._remote = RemoteHandle(connection, connection.set_state(self._remote_name, fmt, blob))
        return self._remote.handle

    # ------------------------------------------------------------ fitted state

    def __sklearn_is_fitted__(self):
        return any(key in self.__dict__ for key in _STATE_KEYS)

    def _has_state(self):
        return "_sklearn_model" in self.__dict__ or "_backend_state" in self.__dict__

    def _pull_state(self):
        """Fetch the remote model once: as its scikit-learn equivalent where possible."""
        remote = self.__dict__["_remote"]
        connection = get_connection()
        if not remote.usable_on(connection):
            raise StateLost(
                f"the worker that fitted this {type(self).__name__} is gone, and its fitted state "
                "was never copied to this process; fit it again (set_config(state_sync='eager') "
                "copies the state right after each fit, so that models outlive their worker)"
            )
        fmt, backend, blob = connection.get_state(remote.handle)
        if fmt == "sklearn":
            self._sklearn_model = cloudpickle.loads(blob)
        else:
            self._backend_state = (backend, fmt, blob)

    def _state_blob(self, connection):
        if not self._has_state():
            self._pull_state()
        if "_sklearn_model" in self.__dict__:
            return "sklearn", cloudpickle.dumps(self._sklearn_model)
        backend, fmt, blob = self._backend_state
        if backend != connection.hello["backend"]:
            raise TypeError(
                f"this {type(self).__name__} was fitted on the {backend} backend and has no "
                f"scikit-learn form; it cannot be loaded on a {connection.hello['backend']} worker"
            )
        return fmt, blob

    @property
    def sklearn_model_(self):
        """The fitted model as the equivalent scikit-learn estimator (pulled once).

        None where the backend cannot convert it (cuML has no scikit-learn form
        of some models, e.g. a multiclass SVC); fitted attributes are then read
        from the worker one by one. A classifier's model was fitted on label
        codes ``0..n_classes-1``; the wrapper's ``classes_`` maps them back.
        """
        check_is_fitted(self)
        if not self._has_state():
            self._pull_state()
        return self.__dict__.get("_sklearn_model")

    def __getattr__(self, name):
        # Only reached when normal lookup fails: fitted attributes of the remote model.
        if (name.endswith("_") and not name.startswith("_") and name not in _LOCAL_ATTRIBUTES
                and self.__sklearn_is_fitted__()):
            model = self.sklearn_model_
            if model is not None:
                if hasattr(model, name):
                    return getattr(model, name)
            else:
                connection = get_connection()
                try:
                    return connection.attribute(self._handle_on(connection), name)
                except AttributeError:
                    pass
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self):
        if "_remote" in self.__dict__ and not self._has_state():
            self._pull_state()
        state = super().__getstate__()
        state.pop("_remote", None)  # handles never travel
        state["_bridge_version"] = __version__
        return state

    def __setstate__(self, state):
        version = state.pop("_bridge_version", None)
        if version not in (None, __version__):
            warnings.warn(
                f"{type(self).__name__} was pickled by sklearn-gpu-bridge {version}; "
                f"this is {__version__}", UserWarning, stacklevel=2,
            )
        super().__setstate__(state)



def _state_sync():
    mode = get_setting("state_sync")
    if mode not in ("lazy", "eager"):
        raise ValueError(f"state_sync must be 'lazy' or 'eager', not {mode!r}")
    return mode


def _same(a, b):
    try:
        return bool(a == b) if not isinstance(a, np.ndarray) else np.array_equal(a, b)
    except Exception:  # noqa: BLE001 - incomparable values are different
        return a is b


def _for_backend(X, connection):
    """Cast float64 to the backend's float dtype (cuML: float32) before it travels.

    Arrays of strings or objects (categories) cannot travel as arrays: they go
    as nested lists of plain values inside the signed header.
    """
    dtype = getattr(X, "dtype", None)
    if dtype is None:
        return X
    if dtype.kind in "OUS":
        try:
            return to_plain(X.tolist())
        except TypeError as exc:
            raise TypeError(f"values of type {exc} cannot be sent to the worker") from None
    float_dtype = connection.hello.get("float_dtype")
    if float_dtype and dtype == np.float64:
        try:  # the cast itself notices a value too large for float32: no second pass over the array
            with np.errstate(over="raise"):
                return X.astype(float_dtype)
        except FloatingPointError:  # finite in float64 (validated), infinite in float32: scikit-learn's words
            with np.errstate(over="ignore"):
                assert_all_finite(X.astype(float_dtype), allow_nan=True, input_name="X")
            raise
    return X


def _out_room(X, estimator):
    """Pool room for the reply's arrays: generous, since the pool is sparse and trimmed after."""
    if X is None or not hasattr(X, "shape"):
        return 0
    width = max(X.shape[1] if X.ndim > 1 else 1, len(getattr(estimator, "classes_", ())) ** 2, 2)
    return X.shape[0] * width * 8


def _classes_and_codes(y):
    """``np.unique(y, return_inverse=True)`` after scikit-learn's target check.

    Integer labels in a narrow range (the usual case: 0/1, 0..k) take a
    counting path that is O(n), not a sort: on 1M samples it saves tens of
    milliseconds per fit. Integer 1-D targets always pass the check, so it is
    skipped for them.
    """
    if y.size and (y.dtype.kind in "ib" or (y.dtype.kind == "u" and y.dtype.itemsize < 8)):
        low, high = int(y.min()), int(y.max())
        if high - low <= max(1024, y.size):
            offsets = y.astype(np.intp) - low
            present = np.bincount(offsets, minlength=high - low + 1) > 0
            classes = (np.flatnonzero(present) + low).astype(y.dtype)
            if low == 0 and present.all():  # labels 0..k-1 already: they are their own codes
                return classes, offsets
            return classes, (np.cumsum(present) - 1)[offsets]
    check_classification_targets(y)
    return np.unique(y, return_inverse=True)


def decode_labels(estimator, codes):
    """Label codes from the worker back to the user's labels."""
    return estimator.classes_.take(np.asarray(codes, dtype=np.intp))


# ---------------------------------------------------------------- methods
# One small mixin per method (and per signature, where scikit-learn's differs:
# estimator checks read ``fit``'s signature for ``sample_weight``). spec.py
# puts the ones a class has FIRST in its bases, so that the one-trip
# fit_transform / fit_predict win over scikit-learn's mixins (which would fit,
# then make a second trip).


class FitSupervised:
    def fit(self, X, y):
        self._fit_remote("fit", X, y)
        return self


class FitSupervisedWeighted:
    def fit(self, X, y, sample_weight=None):
        self._fit_remote("fit", X, y, sample_weight=sample_weight)
        return self


class FitUnsupervised:
    def fit(self, X, y=None):
        self._fit_remote("fit", X)
        return self


class FitUnsupervisedWeighted:
    def fit(self, X, y=None, sample_weight=None):
        self._fit_remote("fit", X, sample_weight=sample_weight)
        return self


class Predict:
    def predict(self, X):
        result = self._call_remote("predict", X)
        return decode_labels(self, result) if self._target == "labels" else result


class PredictProba:
    def predict_proba(self, X):
        return self._call_remote("predict_proba", X)


class PredictLogProba:
    def predict_log_proba(self, X):
        return self._call_remote("predict_log_proba", X)


class DecisionFunction:
    def decision_function(self, X):
        return self._call_remote("decision_function", X)


class ScoreSamples:
    def score_samples(self, X):
        return self._call_remote("score_samples", X)


class Score:
    """A score computed by the model itself (KernelDensity)."""

    def score(self, X, y=None):
        return self._call_remote("score", X)


class ScoreTest:
    """The log-likelihood of X_test under a fitted covariance model."""

    def score(self, X_test, y=None):
        return self._call_remote("score", X_test)


class ScoreWeighted:
    def score(self, X, y=None, sample_weight=None):
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return self._call_remote("score", X, **kwargs)


class Transform:
    def transform(self, X):
        return self._call_remote("transform", X)


class InverseTransform:
    def inverse_transform(self, X):
        return self._call_remote("inverse_transform", X, in_output_space=True)


class FitTransform:
    def fit_transform(self, X, y=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X, y)


class FitTransformWeighted:
    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X, sample_weight=sample_weight)


class FitPredict:
    def fit_predict(self, X, y=None):
        """Fit and return the labels of the training set in one round trip."""
        return self._fit_remote("fit_predict", X)


class FitPredictWeighted:
    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return the labels of the training set in one round trip."""
        return self._fit_remote("fit_predict", X, sample_weight=sample_weight)


class PartialFit:
    def partial_fit(self, X, y=None):
        self._partial_fit_remote(X)
        return self


class PartialFitClassifier:
    def partial_fit(self, X, y, classes=None):
        if not self.__sklearn_is_fitted__() and classes is not None:
            return self._partial_fit_first(X, y, classes)
        self._partial_fit_remote(X, y)
        return self

    def _partial_fit_first(self, X, y, classes, **kwargs):
        X, y = self._validate(X, y, reset=True)
        check_classification_targets(y)
        self.classes_ = np.unique(classes)
        codes = self._encode_labels(y)
        kwargs["classes"] = np.arange(len(self.classes_))
        self._fit_prepared("partial_fit", X, codes, kwargs)
        return self


class PartialFitClassifierWeighted(PartialFitClassifier):
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        kwargs = {}
        if sample_weight is not None:
            kwargs["sample_weight"] = _check_sample_weight(sample_weight, X)
        if not self.__sklearn_is_fitted__() and classes is not None:
            return self._partial_fit_first(X, y, classes, **kwargs)
        self._partial_fit_remote(X, y, **kwargs)
        return self


class KNeighbors:
    _records_n_samples = True

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """(distances, indices) of the nearest training samples; X=None: of the training set itself."""
        kwargs = {"return_distance": return_distance}
        if n_neighbors is not None:
            kwargs["n_neighbors"] = n_neighbors
        result = self._call_remote("kneighbors", X, **kwargs)
        return tuple(result) if isinstance(result, list) else result

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """The k-neighbors graph as a CSR matrix, built locally from :meth:`kneighbors`."""
        from scipy.sparse import csr_matrix

        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        if mode == "connectivity":
            indices = self.kneighbors(X, n_neighbors, return_distance=False)
            data = np.ones(indices.size)
        elif mode == "distance":
            distances, indices = self.kneighbors(X, n_neighbors, return_distance=True)
            data = np.ravel(distances)
        else:
            raise ValueError(f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" instead')
        n_queries = indices.shape[0]
        indptr = np.arange(0, n_queries * n_neighbors + 1, n_neighbors)
        return csr_matrix((data, indices.ravel(), indptr), shape=(n_queries, self.n_samples_fit_))


class Mahalanobis:
    def mahalanobis(self, X):
        return self._call_remote("mahalanobis", X)


class CovarianceExtras:
    """Computed locally from the fitted ``covariance_``, as scikit-learn does."""

    def get_precision(self):
        check_is_fitted(self)
        if self.store_precision:
            return self.precision_
        from scipy import linalg

        return linalg.pinvh(self.covariance_, check_finite=False)

    def error_norm(self, comp_cov, norm="frobenius", scaling=True, squared=True):
        from sklearn.covariance import EmpiricalCovariance

        model = EmpiricalCovariance(store_precision=False)
        model.covariance_ = np.asarray(self.covariance_)
        return model.error_norm(comp_cov, norm=norm, scaling=scaling, squared=squared)


class Sample:
    def sample(self, n_samples=1, random_state=None):
        """Random samples from the fitted density (drawn on the worker)."""
        if isinstance(random_state, np.random.RandomState):
            random_state = int(random_state.randint(np.iinfo(np.int32).max))
        return self._call_remote("sample", n_samples=n_samples, random_state=random_state)


class LabelTransformer:
    """fit(y) / transform(y) on a 1-d label array (LabelEncoder, LabelBinarizer).

    Labels may be strings, which cannot travel: they are encoded locally to
    codes (``np.unique``, as scikit-learn does), and the worker's model is
    fitted on the codes.
    """

    _target = None
    _validation = {}

    def fit(self, y):
        self._fit_labels("fit", y)
        return self

    def fit_transform(self, y):
        return self._finish(self._fit_labels("fit_transform", y))

    def transform(self, y):
        check_is_fitted(self)
        y = column_or_1d(y, warn=True)
        if not len(y):
            return self._finish(self._empty())
        return self._finish(self._run("transform", [self._encode_labels(y)], {}))

    def inverse_transform(self, y):
        check_is_fitted(self)
        codes = self._run("inverse_transform", [np.asarray(y)], {})
        return self.classes_.take(np.asarray(codes, dtype=np.intp))

    def _fit_labels(self, method, y):
        y = column_or_1d(y, warn=True)
        self.classes_, codes = np.unique(y, return_inverse=True)
        return self._fit_prepared(method, codes, None, {})

    def _finish(self, result):
        return result

    def _empty(self):
        return np.array([], dtype=np.int64)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.target_tags.one_d_labels = True
        return tags
