"""The GPU* estimators: scikit-learn estimators whose work runs on the worker.

Each is declared in the module named after its cuML module (see spec.py),
and is imported on first use: ``from sklearn_gpu_bridge.estimators import GPUSVC``
loads ``svm.py`` alone.
"""

import importlib

from ..catalogue import ESTIMATORS

#: GPU<name> -> the module that declares it (cuML's module name)
MODULES = {f"GPU{row.name}": row.module for row in ESTIMATORS.values()}
__all__ = sorted(MODULES)


def __getattr__(name):
    module = MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_all():
    """Every wrapper, by class name (tests and docs walk them)."""
    return {name: __getattr__(name) for name in __all__}
