"""Backends: how a worker builds the catalogue's classes and moves their fitted state.

A request names a class by its short name ("SVC"); the worker looks it up in
the catalogue (:mod:`sklearn_gpu_bridge.catalogue`) and nowhere else, so no
request can reach any other class, module or file. ``cuml`` runs on the GPU;
``sklearn`` runs the scikit-learn class of the same name on the CPU (CI, and
the oracle that the bridge's results must equal), with cuML's parameters
translated as cuML's own ``as_sklearn()`` would (:mod:`sklearn_gpu_bridge.translate`).
"""

import contextlib
import importlib
import inspect
import logging
import platform

import cloudpickle
import numpy as np

from sklearn_gpu_bridge.catalogue import lookup
from sklearn_gpu_bridge.translate import to_sklearn

log = logging.getLogger(__name__)

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
    column = "sklearn"  # which path of the catalogue's row this backend builds

    def __init__(self):
        self._classes = {}
        self._accepted = {}

    def output_context(self, method):
        """The context an estimator method runs in (cuML: some results stay on the device)."""
        return contextlib.nullcontext()

    def estimator_class(self, name):
        cls = self._classes.get(name)
        if cls is None:
            cls = self._classes[name] = _load(getattr(lookup(name), self.column))
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
        expected = _load(lookup(name).sklearn)
        if not isinstance(model, expected):
            raise TypeError(f"state is a {type(model).__name__}, expected {expected.__name__}")
        return model

    def versions(self):
        import sklearn

        return {"python": platform.python_version(), "numpy": np.__version__, "scikit-learn": sklearn.__version__}

    def warm_up(self):
        """Pay one-time set-up costs before the worker reports ready."""


class SklearnBackend(Backend):
    name = "sklearn"

    def create(self, name, params):
        return super().create(name, to_sklearn(name, params))


class CumlBackend(Backend):
    name = "cuml"
    column = "cuml"
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
