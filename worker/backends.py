"""Backends: how a worker builds the catalogue's classes and moves their fitted state.

A request names a class by its short name ("SVC"); the worker looks it up in
the catalogue (:mod:`sklearn_gpu_bridge.catalogue`) and nowhere else, so no
request can reach any other class, module or file. ``cuml`` runs on the GPU;
``sklearn`` runs the scikit-learn class of the same name on the CPU (CI, and
the oracle that the bridge's results must equal), with cuML's parameters
translated as cuML's own ``as_sklearn()`` would (:mod:`sklearn_gpu_bridge.translate`).
"""

import contextlib
import functools
import inspect
import logging
import os
import platform
import re
import threading

import cloudpickle
import numpy as np

from sklearn_gpu_bridge.catalogue import FIT_METHODS, NEUTRAL, is_cuml_alias, load, lookup
from sklearn_gpu_bridge.config import WORKER_ENV_PREFIX
from sklearn_gpu_bridge.errors import NotOnWorker, ProtocolError
from sklearn_gpu_bridge.translate import to_sklearn

from . import forms, labels, sparse_svd
from .device_memory import check_device_memory, use_device_memory, use_device_memory_on
from .pinning import HostPinning, to_device

log = logging.getLogger(__name__)

#: fitted by the cuML worker before it reports ready (first fits of these pay seconds)
WARM_UP = ("StandardScaler", "PCA", "LogisticRegression", "SVC", "KMeans")
DEVICE_OUTPUT_METHODS = frozenset({"transform", "fit_transform", "inverse_transform"})
#: where cuML does something scikit-learn has no class for, the scikit-learn backend runs cuML's way
STAND_INS = {
    "SVC": "sklearn_gpu_bridge.portable.CumlLikeSVC",
    "TargetEncoder": "sklearn_gpu_bridge.portable.CumlLikeTargetEncoder",
    "MBSGDClassifier": "sklearn_gpu_bridge.portable.CumlLikeSGDClassifier",
    "GaussianNB": "sklearn_gpu_bridge.portable.CumlLikeGaussianNB",
    "CategoricalNB": "sklearn_gpu_bridge.portable.CumlLikeCategoricalNB",
}


#: the attributes a client may read: public fitted ones (``coef_``), never ``__dict__`` or a method
FITTED_ATTRIBUTE = re.compile(r"^[a-z][a-z0-9_]*_$")


@functools.lru_cache(maxsize=None)
def parameter_names(cls):
    """The constructor parameters of ``cls`` as ``get_params`` knows them.

    Not ``inspect.signature``: cuML's vendored scikit-learn base class wraps
    ``__init__`` in ``(*args, **kwargs)`` (its scalers, PolynomialFeatures), and
    its ``_get_param_names`` is what lists their parameters.
    """
    names = getattr(cls, "_get_param_names", None)
    return frozenset(names() if names is not None else inspect.signature(cls).parameters)


#: the dtypes of an X that the cuML backend copies to the device itself (CumlBackend.inputs)
DEVICE_COPY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def checked_finite(finite):
    """scikit-learn's ``assume_finite``, which cuML's checks read too, where the client checked already.

    The wrappers run scikit-learn's own check (and word its error) before
    anything is sent; checking again here would read every array once more:
    cuML's check sums a numpy X on the CPU in one thread (26 ms a call on an
    H100 host). A client that says so of arrays it did not check gets what
    the estimator makes of a NaN (only a key holder can say it, and a key
    holder can run code here anyway). The setting is per thread, so other
    requests keep their checks.
    """
    if not finite:
        return contextlib.nullcontext()
    import sklearn

    return sklearn.config_context(assume_finite=True)


class Backend:
    """Builds estimators from the catalogue and moves their fitted state.

    Fitted state travels in up to two forms: *portable* (a model that predicts
    with scikit-learn alone: :mod:`sklearn_gpu_bridge.portable`, ``forms.py``)
    and *native* (the backend's own pickle, for a worker of the same backend,
    where the portable form is not taken back exactly).
    """

    name = "?"
    #: inputs are copied to device memory by the estimator, so views of the
    #: shared pool may be passed without a copy
    device_resident = False
    #: float dtype the client should send (None: keep what the user gave)
    float_dtype = None
    column = "sklearn"  # which path of the catalogue's row this backend builds
    host_labels = None  # cuML's: its classifiers' labels, encoded on the host where they are their own codes

    def __init__(self):
        self._classes = {}

    def output_context(self, method):
        """The context an estimator method runs in (cuML: some results stay on the device)."""
        return contextlib.nullcontext()

    def host_pinning(self):
        """A :class:`HostPinning` for clients' pool segments, or None where copies do not gain from it."""
        return None

    def inputs(self, args):
        """The positional arguments as the estimator gets them (cuML: a large X already on the device)."""
        return args

    def settle(self):
        """Return once the device has finished reading host memory this thread gave it (pinning.py)."""

    def estimator_class(self, name):
        cls = self._classes.get(name)
        if cls is None:
            cls = self._classes[name] = load(getattr(lookup(name), self.column))
        return cls

    def create(self, name, params, changed=()):
        """An unfitted estimator, and the parameters its class does not take (left at their defaults).

        A parameter of ``changed`` (the user set it) that the class does not take
        would change the answer if it were ignored: it is refused instead, unless it
        only tunes speed or memory (``catalogue.NEUTRAL``).
        """
        cls = self.estimator_class(name)
        params = self._translate(name, params)
        accepted = parameter_names(cls)
        dropped = sorted(set(params) - accepted)
        refused = [p for p in dropped if p in changed and p not in NEUTRAL]
        if refused:
            raise ValueError(f"{name}: the {self.name} backend has no parameter(s) {refused}; refusing to ignore "
                             f"them (they would change the result): leave them at their defaults on this worker")
        return cls(**{k: v for k, v in params.items() if k in accepted}), dropped

    def _translate(self, name, params):
        return params

    # ------------------------------------------------------------ the operations, as the worker and InProcess run them

    # Callers check the method first (check_fit / check_call), before they decode the arguments; fit and
    # call then run it without checking again.

    @staticmethod
    def check_fit(name, method):
        """Refuse a method that is not one of ``name``'s fitting methods."""
        if method not in FIT_METHODS or not lookup(name).allows(method):
            raise ProtocolError(f"{method!r} is not a fitting method of {name}")

    @staticmethod
    def check_call(name, method):
        """Refuse a method the catalogue does not list for a fitted ``name``."""
        if method not in lookup(name).methods:
            raise AttributeError(f"{name} has no method {method!r} that the bridge may call")

    def fit(self, name, params, method, args, kwargs, changed=(), params_from=None, finite=False):
        """Build ``name`` from ``params`` and run its fitting ``method`` (checked: :meth:`check_fit`):
        (estimator, result, dropped parameters).

        ``params_from="sklearn"``: scikit-learn's class's parameters (accel), mapped as cuML maps them.
        ``finite``: the caller checked its float arrays for NaN and inf (:func:`checked_finite`).
        """
        if sparse_svd.serves(name, args):  # cuML's TruncatedSVD takes dense X only: sparse_svd.py computes it
            with self.output_context(method):
                return (*sparse_svd.fit(self, params, method, args, params_from), [])
        if name == "SVC":  # multiclass and break_ties are the bridge's own, not the backend's SVC's
            from . import multiclass_svc

            changed = [p for p in changed if p not in multiclass_svc.OWN_PARAMETERS]
        if params_from == "sklearn":
            estimator, dropped = self.create_from_sklearn(name, params), []
        elif params_from is None:
            estimator, dropped = self.create(name, params, changed)
        else:
            raise ProtocolError(f"unknown params_from {params_from!r}")
        if name == "SVC":  # scikit-learn's answers under accel and for multiclass="sklearn" (multiclass_svc.py)
            estimator = multiclass_svc.serving(estimator, params, params_from)
        with self.output_context(method), checked_finite(finite):
            return estimator, getattr(estimator, method)(*self.inputs(args), **kwargs), dropped

    def call(self, name, estimator, method, args, kwargs, finite=False):
        """``method`` of a fitted ``name`` (checked: :meth:`check_call`), if this backend's class has it."""
        if not callable(getattr(estimator, method, None)):
            raise AttributeError(f"{name} has no method {method!r} that the bridge may call")
        with self.output_context(method), checked_finite(finite):
            if method == "transform" and sparse_svd.serves(name, args):
                return sparse_svd.transform(self, estimator, args[0])
            return getattr(estimator, method)(*self.inputs(args), **kwargs)

    @staticmethod
    def attribute(estimator, name):
        """A public fitted attribute (``coef_`` ...); nothing else of the estimator is reachable."""
        if not isinstance(name, str) or not FITTED_ATTRIBUTE.match(name):
            raise AttributeError(f"{name!r} is not a public fitted attribute")
        return getattr(estimator, name)

    def create_from_sklearn(self, name, params):
        """An unfitted estimator that does what scikit-learn's class does with ``params`` (accel)."""
        return load(lookup(name).sklearn)(**params)

    def export_state(self, estimator):
        """(portable bytes or None, native bytes or None) of a fitted estimator."""
        if type(estimator).__name__ == "SklearnSVC":  # scikit-learn's SVC, assembled from the pairs
            estimator = estimator.to_sklearn()
        return cloudpickle.dumps(estimator), None

    def import_state(self, name, form, blob):
        """A fitted estimator from a form of its state (``portable`` or ``native``)."""
        if form != "portable":
            raise ValueError(f"the {self.name} backend takes portable state only, not {form!r}")
        model = cloudpickle.loads(blob)
        # scikit-learn's class, cuML's way of it (portable.py), or this backend's own
        expected = (load(lookup(name).sklearn), self.estimator_class(name)) + \
            ((load(STAND_INS[name]),) if name in STAND_INS else ())
        if not isinstance(model, expected):
            raise TypeError(f"state is a {type(model).__name__}, expected {expected[0].__name__}")
        return model

    def versions(self):
        import sklearn

        return {"python": platform.python_version(), "numpy": np.__version__, "scikit-learn": sklearn.__version__}

    #: estimators whose fitted models run only on the first GPU a worker drives (see CumlBackend)
    first_device_only = frozenset()

    def warm_up(self, first=True):
        """Pay one-time set-up costs before the worker reports ready (``first``: on the first GPU it drives)."""

    def memory_budget(self):
        """Bytes of device memory that requests running at once may use (None: no limit, host memory)."""
        return None

    # ------------------------------------------------------------ several GPUs (a worker's ``gpus``: devices.py)

    def device_count(self):
        """How many GPUs this process sees; None: none (the CPU backend simulates the GPUs it is given)."""
        return None

    def open_devices(self, indices):
        """Make the GPUs ``indices`` ready to serve requests; their memory budgets (:meth:`memory_budget`)."""
        return [self.memory_budget() for _ in indices]

    def serve_as(self, index):
        """The memory budget of this process's one GPU, which a front names ``index`` (CUDA_VISIBLE_DEVICES shows
        this process that GPU alone)."""
        return self.memory_budget()

    def on_device(self, index):
        """The context that makes GPU ``index`` current on this thread: a request on it runs inside."""
        return contextlib.nullcontext()

    def device_memory_used(self, index):
        """Bytes of GPU ``index``'s memory in use now, by any process (None: the current device; status)."""
        return None


#: the CPU backend's stand-ins for GPUs (tests; read by it alone): each simulated GPU's memory budget in bytes
#: (unset: none), and the index of one whose estimator calls all fail as a GPU in a sticky CUDA error does
SIMULATED_GPU_MEMORY = WORKER_ENV_PREFIX + "_SIMULATED_GPU_MEMORY"
SIMULATED_GPU_FAILS = WORKER_ENV_PREFIX + "_SIMULATED_GPU_FAILS"


#: cuML 26.10's KMeans (cuVS) runs only on the first GPU it ran on in a process: on another it fails with an
#: illegal memory access, which loses that GPU's context. SpectralClustering runs the same k-means of cuVS
#: (cuvs::cluster::spectral). A worker of several GPUs runs these on its first.
FIRST_DEVICE_ONLY = frozenset({"KMeans", "SpectralClustering"})


class SklearnBackend(Backend):
    name = "sklearn"
    _failing = None  # the simulated GPU that fails (SIMULATED_GPU_FAILS)
    _label = None  # the simulated GPU of a process behind a front (serve_as)
    first_device_only = FIRST_DEVICE_ONLY  # simulated GPUs place work as cuML's would be placed

    def estimator_class(self, name):
        if name in STAND_INS:
            return self._classes.setdefault(name, load(STAND_INS[name]))
        return super().estimator_class(name)

    def _translate(self, name, params):
        return to_sklearn(name, params)

    def open_devices(self, indices):
        """Simulated GPUs, each with the budget :data:`SIMULATED_GPU_MEMORY` gives; the one
        :data:`SIMULATED_GPU_FAILS` names fails (:meth:`output_context`)."""
        budget, failing = os.environ.get(SIMULATED_GPU_MEMORY), os.environ.get(SIMULATED_GPU_FAILS)
        self._failing = int(failing) if failing else None
        self._current = threading.local()
        return [int(budget) if budget else self.memory_budget() for _ in indices]

    def serve_as(self, index):
        """Simulated GPU ``index`` alone, as :meth:`open_devices` simulates it, current on every thread."""
        budget = self.open_devices([index])[0]
        self._label = index
        return budget

    @contextlib.contextmanager
    def on_device(self, index):
        before = getattr(self._current, "index", None)
        self._current.index = index
        try:
            yield
        finally:
            self._current.index = before

    def output_context(self, method):
        if self._failing is not None and getattr(self._current, "index", self._label) == self._failing:
            raise RuntimeError(f"CUDA error encountered: cudaErrorIllegalAddress: an illegal memory access was "
                               f"encountered (simulated: {SIMULATED_GPU_FAILS}={self._failing})")
        return super().output_context(method)


class CumlBackend(Backend):
    name = "cuml"
    column = "cuml"
    device_resident = True
    float_dtype = "float32"

    def __init__(self, device_memory=None):
        """``device_memory``: :func:`use_device_memory`'s kind, in a worker's own process; None: a user's process
        (``InProcess``, a Dask worker), whose allocator and cuML are left as they are."""
        super().__init__()
        import cuml

        if is_cuml_alias(cuml):  # `alias install` in this environment
            raise ImportError("no cuML here: `import cuml` gives sklearn-gpu-bridge's alias")
        self._device_memory = device_memory  # for the other GPUs a worker drives (open_devices)
        if device_memory is not None:
            use_device_memory(device_memory)
            from cuml.internals import validation

            self.host_labels = labels.encode_on_host(validation)  # labels.HostLabels, or None
        cuml.set_global_output_type("numpy")
        self._cuml = cuml

    def host_pinning(self):
        """Pool segments registered with the CUDA driver: copies to and from the GPU by DMA (pinning.py)."""
        import cupy

        runtime = cupy.cuda.runtime
        return HostPinning(lambda address, nbytes: runtime.hostRegister(address, nbytes, self._register_flags),
                           runtime.hostUnregister)

    def inputs(self, args):
        """A float X copied to the device here, in one copy (a DMA where it lies in a page-locked pool segment).

        Given a numpy array, cuML's input check copies it with ``cupy.array``, which stages every host array
        through a pinned buffer of CuPy's own by a copy on one CPU core, into the order the estimator asks
        for, and again in each step that checks X (cuML's PCA ``fit_transform`` is ``fit(X).transform(X)``);
        given a device array, cuML changes its order on the device. Either way the same bytes reach the
        estimator, and the copy here is faster for small and large X alike: on an H200, PCA(10) on 1M x 100
        takes 0.065 s instead of 0.88 s, PCA(5) on 5000 x 20 about 1.8 ms instead of 2.1 ms.
        """
        X = args[0] if args else None
        if (type(X) is not np.ndarray or X.ndim != 2 or X.dtype not in DEVICE_COPY_DTYPES
                or not (X.flags.c_contiguous or X.flags.f_contiguous)):
            return args
        return [to_device(X), *args[1:]]

    def settle(self):
        # The whole device, not this thread's stream: cuML may copy on a stream of its own.
        import cupy

        cupy.cuda.runtime.deviceSynchronize()

    def output_context(self, method):
        # The bulky results of transforms stay CuPy arrays until the reply is encoded, which
        # copies them from the device straight into the client's pool block: no numpy copy in
        # between. Only there: cuML's multiclass SVC, for one, fails to predict under "cupy".
        if method in DEVICE_OUTPUT_METHODS:
            return self._cuml.using_output_type("cupy")
        return contextlib.nullcontext()

    def portable(self, estimator):
        """The model in a form that predicts without cuML (forms.py), or None where there is none."""
        name = type(estimator).__name__
        try:
            if name in forms.BUILDERS:
                return _as_fitted_on_float64(forms.BUILDERS[name](estimator))
            if getattr(estimator, "_cpu_class_path", "").startswith("sklearn.") and hasattr(estimator, "as_sklearn"):
                return _as_fitted_on_float64(estimator.as_sklearn())
        except Exception as exc:  # noqa: BLE001 - said, and the native form still travels
            log.warning("%s: no portable form (%s: %s)", name, type(exc).__name__, exc)
        return None

    def export_state(self, estimator):
        portable = self.portable(estimator)
        name = type(estimator).__name__
        if name == "SklearnSVC":  # scikit-learn's SVC, assembled from the pairs: it is its own portable form
            return (None if portable is None else cloudpickle.dumps(portable)), cloudpickle.dumps(estimator)
        sklearn_class = lookup(name).sklearn.rpartition(".")[2]
        # as_sklearn() and from_sklearn() go both ways: the portable form is all there is to carry
        exact = (portable is not None and type(portable).__name__ == sklearn_class
                 and name not in forms.NOT_ROUND_TRIP)
        return (None if portable is None else cloudpickle.dumps(portable),
                None if exact else cloudpickle.dumps(estimator))

    def create_from_sklearn(self, name, params):
        """cuML's class, with scikit-learn's parameters mapped by cuML's own ``_params_from_cpu`` (as
        cuml.accel does); what cuML cannot run is NotOnWorker, and the client runs it on its CPU."""
        from cuml.internals.interop import UnsupportedOnGPU

        model, cls = super().create_from_sklearn(name, params), self.estimator_class(name)
        try:
            if hasattr(cls, "_params_from_cpu"):
                return cls(**cls._params_from_cpu(model))
            accepted = parameter_names(cls)
            unknown = sorted(k for k in params if k not in accepted)
            if unknown:
                raise UnsupportedOnGPU(f"parameters {unknown} have no cuML counterpart")
            return cls(**params)
        except UnsupportedOnGPU as exc:
            raise NotOnWorker(f"{name}: {exc}") from None

    def import_state(self, name, form, blob):
        cls = self.estimator_class(name)
        if form == "native":
            model = cloudpickle.loads(blob)
            if not isinstance(model, cls) and not (name == "SVC" and type(model).__name__ == "SklearnSVC"):
                raise TypeError(f"state is a {type(model).__name__}, expected {cls.__name__}")
            return model
        model = super().import_state(name, form, blob)
        if hasattr(cls, "from_sklearn"):
            try:
                return cls.from_sklearn(model)
            except Exception as exc:  # noqa: BLE001 - the portable model still answers, on this worker's CPU
                log.info("%s: cuML does not take this fitted model back (%s); it runs on the CPU here", name, exc)
        return model

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
            import rmm

            versions["device_memory"] = type(rmm.mr.get_current_device_resource()).__name__
            allocator = cupy.cuda.get_allocator()
            versions["cupy_allocator"] = getattr(allocator, "__qualname__", type(allocator).__name__)
        except Exception:  # noqa: BLE001 - informative only
            log.debug("could not query the GPU", exc_info=True)
        return versions

    def memory_budget(self):
        """Nine tenths of the device memory free now (before any request): what requests share."""
        try:
            import cupy

            free, _ = cupy.cuda.Device().mem_info
            return int(free * 0.9)
        except Exception:  # noqa: BLE001 - no reading: no admission control
            log.warning("could not read the GPU's free memory; requests are not admitted by memory", exc_info=True)
            return None

    # ------------------------------------------------------------ several GPUs

    _register_flags = 0  # cudaHostRegister's flags for pool segments (open_devices)

    def device_count(self):
        import cupy

        return cupy.cuda.runtime.getDeviceCount()

    def open_devices(self, indices):
        """Each GPU of ``indices`` with device memory set up as the first one's (:func:`use_device_memory_on`),
        and pool segments registered for all of them (``cudaHostRegisterPortable``: pinned for every device's
        context, not only for the one current where a segment is registered); their budgets."""
        import cupy

        if self._device_memory is not None:
            use_device_memory_on(indices, self._device_memory)
        if len(indices) > 1:
            self._register_flags = 1  # cudaHostRegisterPortable
        budgets = []
        for index in indices:
            with cupy.cuda.Device(index):
                budgets.append(self.memory_budget())
        return budgets

    def on_device(self, index):
        import cupy

        return cupy.cuda.Device(index)

    def device_memory_used(self, index):
        import cupy

        free, total = cupy.cuda.Device(index).mem_info
        return int(total - free)

    first_device_only = FIRST_DEVICE_ONLY

    def warm_up(self, first=True):
        rng = np.random.default_rng(0)
        X = rng.standard_normal((256, 8)).astype(np.float32)
        y = (X[:, 0] > 0).astype(np.int32)
        for name in WARM_UP:
            if not first and name in self.first_device_only:
                continue
            est, _ = self.create(name, {})
            try:
                if name in ("LogisticRegression", "SVC"):
                    est.fit(X, y)
                else:
                    est.fit(X)
            except Exception:  # noqa: BLE001 - warm-up is best effort; real calls report errors
                log.warning("warm-up of %s failed", name, exc_info=True)


def _as_fitted_on_float64(model):
    """A scikit-learn model from cuML's float32 state, as scikit-learn would have fitted it on float64.

    Users' arrays are float64; cuML computed in float32 (the ``precision``
    setting). scikit-learn's compiled predict paths want the model's arrays in
    the input's dtype (KMeans' centres, SVC's support vectors), so the float32
    arrays of the state are widened (exactly) to float64.
    """
    if type(model).__module__.startswith("sklearn."):
        for key, value in vars(model).items():
            if key.endswith("_") and isinstance(value, np.ndarray) and value.dtype == np.float32:
                setattr(model, key, value.astype(np.float64))
    return model


def make_backend(choice, device_memory=None):
    """The backend for ``auto|cuml|sklearn``; returns (backend, reason for fallback or None).

    ``device_memory``: how a cuML backend's process allocates device memory (:func:`use_device_memory`;
    a worker's setting); None leaves it as the process has it.
    """
    check_device_memory(device_memory)  # before the fallback below: a wrong value is not "no cuML here"
    if choice == "sklearn":
        return SklearnBackend(), None
    if choice == "cuml":
        return CumlBackend(device_memory), None
    if choice != "auto":
        raise ValueError(f"backend must be auto, cuml or sklearn, not {choice!r}")
    try:
        return CumlBackend(device_memory), None
    except Exception as exc:  # noqa: BLE001 - any import failure means "no cuML here"
        return SklearnBackend(), f"cuML is not usable here ({type(exc).__name__}: {exc})"
