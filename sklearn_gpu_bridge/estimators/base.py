"""RemoteEstimator: a real scikit-learn estimator whose work runs on the worker.

Like cuml.accel's proxies, a wrapper keeps its parameters itself (plain
``__init__``, nothing happens until ``fit``) and validates input locally with
scikit-learn's own helpers, so bad input gets scikit-learn's own error before
anything is sent. After ``fit`` it holds a handle to the live estimator on
the worker. Fitted state (``coef_``, ``mean_`` ...) is pulled once, when it is
first read or when the wrapper is pickled, as the scikit-learn equivalent of
the remote model: a pickled wrapper therefore loads with plain scikit-learn,
and pushes that state back to whichever worker it meets next.
"""

import warnings
import weakref

import cloudpickle
import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    FLOAT_DTYPES,
    _check_sample_weight,
    check_array,
    check_is_fitted,
    validate_data,
)

from .. import __version__
from ..client import get_connection
from ..protocol import to_plain

_STATE_KEYS = ("_remote", "_sklearn_model", "_backend_state")
# Set locally by validation; the remote model's copies are never consulted (and
# scikit-learn probes them with getattr on every call, which must stay free).
_LOCAL_ATTRIBUTES = frozenset({"n_features_in_", "feature_names_in_", "classes_", "sklearn_model_"})


class RemoteHandle:
    """A live estimator on one worker; released (lazily) when this object dies."""

    def __init__(self, connection, handle):
        self.handle = handle
        self.worker_id = connection.hello["worker_id"]
        weakref.finalize(self, connection.schedule_release, handle)

    def usable_on(self, connection):
        return connection.hello["worker_id"] == self.worker_id


class RemoteEstimator(BaseEstimator):
    """Base of every ``GPU*`` estimator. Subclasses declare, they do not implement."""

    #: key of the backend's class table ("SVC", "StandardScaler", ...)
    _remote_name = None
    #: keyword arguments for ``validate_data`` on X, as the scikit-learn class uses
    _validation = {"dtype": FLOAT_DTYPES}
    #: fit takes y (supervised); classifiers also encode labels
    _needs_y = False
    _encodes_labels = False

    # ------------------------------------------------------------ fitting

    def _fit_remote(self, method, X, y=None, sample_weight=None, **fit_kwargs):
        """Validate as scikit-learn does, fit on the worker, keep the handle."""
        if self._needs_y:
            X, y = validate_data(self, X, y, reset=True, **self._validation)
            if self._encodes_labels:
                check_classification_targets(y)
                self.classes_, y = np.unique(y, return_inverse=True)
        else:
            X = validate_data(self, X, reset=True, **self._validation)
        if sample_weight is not None:
            fit_kwargs["sample_weight"] = _check_sample_weight(sample_weight, X, dtype=X.dtype)
        connection = get_connection()
        X = _for_backend(X, connection)
        params, blob = self._remote_params()
        args = [X] if y is None or not self._needs_y else [X, y]
        value = connection.fit(
            self._remote_name, params, method, args, fit_kwargs,
            params_blob=blob, out_nbytes=_out_room(X, self),
        )
        for key in _STATE_KEYS:
            self.__dict__.pop(key, None)
        self._remote = RemoteHandle(connection, value["handle"])
        self._warn_dropped(value.get("dropped", ()))
        return value["result"]

    def _remote_params(self):
        """(plain params, None), or (None, cloudpickle blob) when a value is not plain."""
        params = self.get_params(deep=False)
        if self._encodes_labels and isinstance(params.get("class_weight"), dict):
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
        changed = [p for p in dropped if getattr(self, p) != defaults.get(p)]
        if changed:
            warnings.warn(
                f"{type(self).__name__}: the worker's backend has no parameter(s) {changed}; "
                "they were ignored", UserWarning, stacklevel=4,
            )

    # ------------------------------------------------------------ calling

    def _call_remote(self, method, X, *, in_output_space=False, **kwargs):
        """Validate X against the fit, run ``method`` on the worker, return its result.

        ``in_output_space``: X is in the transformed space (inverse_transform),
        so it is checked as an array but not against ``n_features_in_``.
        """
        check_is_fitted(self)
        if in_output_space:
            X = check_array(X, **self._validation)
        else:
            X = validate_data(self, X, reset=False, **self._validation)
        connection = get_connection()
        handle = self._handle_on(connection)
        return connection.call(handle, method, [_for_backend(X, connection)], kwargs,
                               out_nbytes=_out_room(X, self))

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

    def _pull_state(self):
        """Fetch the remote model once: as its scikit-learn equivalent where possible."""
        remote = self.__dict__["_remote"]
        fmt, backend, blob = get_connection().get_state(remote.handle)
        if fmt == "sklearn":
            self._sklearn_model = cloudpickle.loads(blob)
        else:
            self._backend_state = (backend, fmt, blob)

    def _state_blob(self, connection):
        if "_sklearn_model" not in self.__dict__ and "_backend_state" not in self.__dict__:
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
        from the worker one by one.
        """
        check_is_fitted(self)
        if "_sklearn_model" not in self.__dict__ and "_backend_state" not in self.__dict__:
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
        if "_remote" in self.__dict__ and "_sklearn_model" not in self.__dict__ \
                and "_backend_state" not in self.__dict__:
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


def float32_transformer_tags(tags):
    """A GPU transformer computes in float32; only that dtype is promised to be preserved."""
    tags.transformer_tags.preserves_dtype = ["float32"]
    return tags


def _for_backend(X, connection):
    """Cast float64 to the backend's float dtype (cuML: float32) before it travels."""
    dtype = connection.hello.get("float_dtype")
    if dtype and X.dtype == np.float64:
        return X.astype(dtype)
    return X


def _out_room(X, estimator):
    """Pool room for the reply's arrays: generous, since the pool is sparse and trimmed after."""
    width = max(X.shape[1] if X.ndim > 1 else 1, len(getattr(estimator, "classes_", ())) ** 2, 2)
    return X.shape[0] * width * 8


def decode_labels(estimator, codes):
    """Label codes from the worker back to the user's labels."""
    return estimator.classes_.take(np.asarray(codes, dtype=np.intp))


# ---------------------------------------------------------------- method sets
# Each wrapper mixes in the methods its scikit-learn class has; each is one
# validated round trip. They come FIRST in a wrapper's bases, so that their
# one-trip fit_transform / fit_predict win over scikit-learn's mixins (which
# would fit, then make a second trip).


class RemoteTransformer:
    def fit(self, X, y=None):
        self._fit_remote("fit", X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and transform in one round trip."""
        return self._fit_remote("fit_transform", X)

    def transform(self, X):
        return self._call_remote("transform", X)


class RemoteInverseTransformer(RemoteTransformer):
    def inverse_transform(self, X):
        return self._call_remote("inverse_transform", X, in_output_space=True)


class RemoteClassifier:
    _needs_y = True
    _encodes_labels = True

    def fit(self, X, y, sample_weight=None):
        self._fit_remote("fit", X, y, sample_weight=sample_weight)
        return self

    def predict(self, X):
        return decode_labels(self, self._call_remote("predict", X))

    def decision_function(self, X):
        return self._call_remote("decision_function", X)


class RemoteProbabilisticClassifier(RemoteClassifier):
    def predict_proba(self, X):
        return self._call_remote("predict_proba", X)

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))


class RemoteClusterer:
    def fit(self, X, y=None, sample_weight=None):
        self._fit_remote("fit", X, sample_weight=sample_weight)
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return cluster labels in one round trip."""
        return self._fit_remote("fit_predict", X, sample_weight=sample_weight)

    def predict(self, X):
        return self._call_remote("predict", X)
