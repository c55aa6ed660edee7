"""``import cuml`` where cuML is not installed: cuML 26.10's import paths, served by the bridge.

Code written for cuML (``import cuml``, ``from cuml.svm import SVC``,
``cuml.PCA``, ``cuml.set_global_output_type("numpy")`` ...) runs unchanged on
a machine without cuML: each cuML class is its ``GPU*`` wrapper under cuML's
name and module, taking cuML's infrastructure arguments too (``handle``,
``verbose``, ``output_type``). ``cuml.__version__`` is a version string as
cuML's is: the worker's cuML, or on a worker without cuML the cuML release
whose API the alias serves (:data:`CUML_API_VERSION`); ``cuml.__bridge__``
says which.

It is switched on by a finder (cheap: importing this module loads no numpy)
at the END of ``sys.meta_path``, so that a real cuML, wherever importable, is
always found first and never shadowed:

- for one run: ``python -m sklearn_gpu_bridge.accel script.py`` calls :func:`enable`;
- for an environment: ``sklearn-gpu-bridge alias install`` writes a ``.pth``
  file that calls :func:`enable` at start-up (``alias uninstall`` removes it).
"""

import contextlib
import importlib
import importlib.machinery
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

from ..catalogue import ALIAS_MARKER, ESTIMATORS, real_cuml_importable

#: cuML's top-level names among the wrapped classes (cuml/__init__.py of 26.10): all but these
NOT_AT_TOP_LEVEL = {
    "SpectralClustering", "SpectralEmbedding", "StandardScaler", "MinMaxScaler", "MaxAbsScaler",
    "PolynomialFeatures", "LabelBinarizer", "OneHotEncoder", "TargetEncoder", "GaussianNB", "BernoulliNB",
    "ComplementNB", "CategoricalNB",
}
#: cuML's modules of functions that run as scikit-learn's on the client (cuML's give device arrays)
FUNCTIONS = {
    "metrics": ("sklearn.metrics", ("accuracy_score", "r2_score", "adjusted_rand_score", "mean_squared_error",
                                    "mean_absolute_error", "roc_auc_score", "confusion_matrix", "log_loss",
                                    "precision_recall_curve", "silhouette_score", "pairwise_distances")),
    "model_selection": ("sklearn.model_selection", ("train_test_split", "GridSearchCV", "KFold", "StratifiedKFold")),
    "datasets": ("sklearn.datasets", ("make_blobs", "make_classification", "make_regression")),
    "pipeline": ("sklearn.pipeline", ("Pipeline", "make_pipeline")),
}
#: cuML's own output types the client can give; the others come back as numpy, said once
OUTPUT_TYPES = ("input", "numpy", "pandas")
DEVICE_OUTPUT_TYPES = ("cupy", "cudf", "numba", "array", "series", "dataframe", "cuml")
#: the methods whose array results follow ``output_type``
ARRAY_METHODS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform",
                 "fit_transform", "inverse_transform", "score_samples", "fit_predict", "kneighbors")
PTH_NAME = "sklearn_gpu_bridge_cuml_alias.pth"
#: the .pth's one line (site runs lines that start with ``import``): it enables the alias only while the
#: package is installed, so that the file left behind by ``pip uninstall`` does nothing at all
PTH_LINE = ('import importlib.util as _u; _s = _u.find_spec("sklearn_gpu_bridge"); _s and _s.origin and '
            '__import__("sklearn_gpu_bridge.accel.cuml_alias", fromlist=["enable"]).enable()\n')
#: the cuML release whose import paths and parameters the alias serves
CUML_API_VERSION = "26.10.00"

_settings = threading.local()
_global_output_type = ["input"]
_warned = set()


# ---------------------------------------------------------------- output types


def set_global_output_type(output_type: str | None) -> None:
    """cuML's: the type of arrays estimators return ("input", "numpy", "pandas"; device types: numpy)."""
    _global_output_type[0] = _checked(output_type)


@contextlib.contextmanager
def using_output_type(output_type: str | None) -> Iterator[None]:
    """cuML's: ``set_global_output_type`` inside a ``with`` block (this thread)."""
    saved = getattr(_settings, "output_type", None)
    _settings.output_type = _checked(output_type)
    try:
        yield
    finally:
        _settings.output_type = saved


def _checked(output_type):
    output_type = "input" if output_type is None else str(output_type).lower()
    if output_type not in OUTPUT_TYPES + DEVICE_OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {OUTPUT_TYPES + DEVICE_OUTPUT_TYPES}, not {output_type!r}")
    return output_type


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


def _as_output(value, output_type, X):
    import numpy as np

    if isinstance(value, tuple):
        return tuple(_as_output(v, output_type, X) for v in value)
    if not isinstance(value, np.ndarray):
        return value
    if output_type in DEVICE_OUTPUT_TYPES:
        _warn_once(("output", output_type), f"output_type={output_type!r} needs the GPU in this process; "
                   "sklearn-gpu-bridge returns numpy arrays instead")
        return value
    pandas = sys.modules.get("pandas")
    wants_pandas = output_type == "pandas" or (output_type == "input" and pandas is not None
                                               and isinstance(X, (pandas.DataFrame, pandas.Series)))
    if not wants_pandas:
        return value
    import pandas

    index = X.index if isinstance(X, (pandas.DataFrame, pandas.Series)) and len(X) == len(value) else None
    return pandas.Series(value, index=index) if value.ndim == 1 else pandas.DataFrame(value, index=index)


# ---------------------------------------------------------------- classes under cuML's names


class _CumlArguments:
    """cuML's infrastructure arguments, taken as cuML takes them; what cannot be honoured is said once."""

    def _remote_params(self, own):
        params = super()._remote_params(own)
        for name in ("handle", "verbose", "output_type"):
            params.pop(name, None)
        return params

    def _check_infrastructure(self):
        if self.handle is not None:
            _warn_once("handle", "handle= is ignored: the worker owns the GPU and its streams")
        if self.verbose not in (False, 0, None, 4):  # 4: cuML's default level (info)
            _warn_once("verbose", "verbose= is ignored here: cuML's messages go to the worker's log")
        _checked(self.output_type)


def _output_type(estimator):
    return getattr(_settings, "output_type", None) or estimator.output_type or _global_output_type[0]


def _with_infrastructure(wrapper):
    """``wrapper.__init__``'s signature plus cuML's ``handle``, ``verbose`` and ``output_type``."""
    import inspect

    signature = inspect.signature(wrapper.__init__)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
             for name, default in (("handle", None), ("verbose", False), ("output_type", None))]
    full = signature.replace(parameters=[*signature.parameters.values(), *extra])

    def __init__(self, *args, **kwargs):
        bound = full.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for name, value in list(bound.arguments.items())[1:]:
            setattr(self, name, value)

    __init__.__signature__ = full
    return __init__


def alias_class(name: str) -> type:
    """The ``GPU<name>`` wrapper as cuML's class: cuML's name and module, cuML's arguments."""
    from .. import estimators

    wrapper = getattr(estimators, "GPU" + name)
    module = f"cuml.{ESTIMATORS[name].module}"
    namespace = {"__module__": module, "__qualname__": name, "__doc__": wrapper.__doc__,
                 "__init__": _with_infrastructure(wrapper)}
    cls = type(name, (_CumlArguments, wrapper), namespace)
    for method in ARRAY_METHODS:
        if callable(getattr(wrapper, method, None)):
            def make(method=method):
                def call(self, *args, **kwargs):
                    self._check_infrastructure()
                    out = getattr(wrapper, method)(self, *args, **kwargs)
                    return _as_output(out, _output_type(self), args[0] if args else kwargs.get("X"))
                call.__name__ = call.__qualname__ = method
                call.__doc__ = getattr(wrapper, method).__doc__
                return call
            setattr(cls, method, make())
    return cls


# ---------------------------------------------------------------- the module tree


def _versions() -> tuple[str, str, bool]:
    """(``cuml.__version__``, ``cuml.__bridge__``, whether to keep them): asked of the worker on first use.

    ``__version__`` stays a version string (code parses it); what serves ``cuml`` is said in ``__bridge__``.
    """
    from ..client import get_connection
    from ..errors import BridgeError
    from ..version import __version__ as ours

    try:
        versions = get_connection().capabilities.versions
    except BridgeError as exc:  # asked again on the next access: a worker may have started meanwhile
        return CUML_API_VERSION, (f"sklearn-gpu-bridge {ours}: cuML {CUML_API_VERSION}'s API; no worker answered "
                                  f"({type(exc).__name__}: {exc})"), False
    if versions.get("cuml"):
        return versions["cuml"], (f"sklearn-gpu-bridge {ours}: cuML {CUML_API_VERSION}'s API, served by a worker "
                                  f"running cuML {versions['cuml']}"), True
    return CUML_API_VERSION, (f"sklearn-gpu-bridge {ours}: cuML {CUML_API_VERSION}'s API, served by a worker "
                              "running scikit-learn on the CPU (no cuML there)"), True


def _submodules():
    modules = {}
    for row in ESTIMATORS.values():
        modules.setdefault(row.module, []).append(row.name)
    return modules


class _AliasModule(types.ModuleType):
    """A module of the alias: classes built on first access (importing the wrappers costs time)."""

    def __getattr__(self, attr):
        names = self.__dict__.get("_classes", ())
        if attr in names:
            value = alias_class(attr)
        elif attr in ("__version__", "__bridge__") and self.__name__ == "cuml":
            version, bridge, keep = _versions()
            if keep:
                self.__dict__.update(__version__=version, __bridge__=bridge)
            return version if attr == "__version__" else bridge
        elif attr in self.__dict__.get("_submodules", ()):
            value = importlib.import_module(f"{self.__name__}.{attr}")
        else:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} (sklearn-gpu-bridge's "
                                 "cuml serves the classes it wraps)")
        self.__dict__[attr] = value
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.__dict__.get("_classes", ()))
                      | set(self.__dict__.get("_submodules", ())))


def _populate(module):
    name = module.__name__
    submodules = _submodules()
    module.__dict__[ALIAS_MARKER] = True
    if name == "cuml":
        module._classes = sorted(n for n in ESTIMATORS if n not in NOT_AT_TOP_LEVEL)
        module._submodules = sorted(set(submodules) | set(FUNCTIONS) | {"common"})
        module.set_global_output_type, module.using_output_type = set_global_output_type, using_output_type
        module.__all__ = module._classes + ["set_global_output_type", "using_output_type"]
        return
    leaf = name.split(".", 1)[1]
    if leaf == "common":
        module.set_global_output_type, module.using_output_type = set_global_output_type, using_output_type
        module._classes = []
    elif leaf in FUNCTIONS:
        source, names = FUNCTIONS[leaf]
        real = importlib.import_module(source)
        for attr in names:
            setattr(module, attr, getattr(real, attr))
        module._classes = []
    else:
        module._classes = sorted(submodules[leaf])
    module.__all__ = sorted(set(module._classes) | {k for k in vars(module) if not k.startswith("_")})


class _Loader:  # importlib's loader protocol (importlib.abc would cost 10 ms at every start-up)
    def create_module(self, spec):
        return _AliasModule(spec.name)

    def exec_module(self, module):
        _populate(module)


class CumlAliasFinder:  # importlib's meta path finder protocol
    """Finds ``cuml`` and its served submodules; last on ``sys.meta_path``, after any real cuML."""

    __sklearn_gpu_bridge__ = True  # catalogue.ALIAS_MARKER: real_cuml_importable passes it over

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        head, _, leaf = fullname.partition(".")
        if head != "cuml":
            return None
        if leaf and (leaf not in _submodules() and leaf not in FUNCTIONS and leaf != "common"):
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=not leaf)


def enable() -> None:
    """Serve ``import cuml`` from the bridge where no real cuML is importable (idempotent)."""
    if not any(isinstance(f, CumlAliasFinder) for f in sys.meta_path):
        sys.meta_path.append(CumlAliasFinder())


# ---------------------------------------------------------------- for an environment: a .pth file


def pth_path() -> Path:
    """The ``.pth`` file of the active environment (its site-packages: the virtualenv's, if one is active)."""
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def install_pth() -> Path:
    """Write the ``.pth`` that enables the alias at every start-up of this environment's Python.

    Mode 0644 whatever the umask; refused where a real cuML is importable, or where every user may write
    the site-packages folder (any of them could then replace the file that each start of Python runs).
    """
    import os
    import stat
    import tempfile

    from ..errors import ConfigurationError

    if real_cuml_importable():
        raise ConfigurationError("a real cuML is importable in this environment: `import cuml` already runs "
                                 "cuML itself, and the alias would never be used; nothing was installed")
    path = pth_path()
    folder = path.parent
    mode = folder.stat().st_mode
    if os.name == "posix" and mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise ConfigurationError(f"{folder} is writable by every user, who could replace the alias's .pth "
                                 f"(which every start of this Python runs); nothing was installed. Fix: "
                                 f"chmod o-w {folder}", f"chmod o-w {folder}")
    # a fresh file renamed over the old one: never a link another user left at the name, never the umask's mode
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".sklearn_gpu_bridge_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            if hasattr(os, "fchmod"):  # not on Windows before Python 3.13, where modes do not apply
                os.fchmod(f.fileno(), 0o644)
            f.write(PTH_LINE)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return path


def uninstall_pth() -> bool:
    """Remove the ``.pth``; True if there was one."""
    path = pth_path()
    if path.exists():
        path.unlink()
        return True
    return False
