"""Unmodified scikit-learn code, run on the bridge's worker: ``cuml.accel``'s way, from any machine.

Three ways to switch it on, as with ``cuml.accel``::

    python -m sklearn_gpu_bridge.accel script.py [args]     # or -m module, or -c code
    %load_ext sklearn_gpu_bridge.accel                       # IPython / Jupyter
    import sklearn_gpu_bridge.accel; sklearn_gpu_bridge.accel.install()   # before the script's work

scikit-learn's classes that have a wrapper are then served by the worker
(:mod:`.serve`), falling back to scikit-learn on this CPU call by call where
the worker cannot serve them; ``report()`` (or ``-v``, or
``SKLEARN_GPU_BRIDGE_ACCEL_LOG=1``: a table at exit) says which ran where and
why. ``import cuml`` works too (:mod:`sklearn_gpu_bridge.accel.cuml_alias`), where
no real cuML is installed.

Processes that joblib starts for ``n_jobs`` inherit it: ``install()`` puts a
private folder with a ``sitecustomize`` on their ``PYTHONPATH`` that installs
accel in them too, and they reach the same worker.
"""

import atexit
import os
from typing import Any

from ..config import ENV_ACCEL as ENV_ENABLED
from . import report

_exit_hook = []


def install(log_level: int | str | None = None) -> None:
    """Serve scikit-learn's classes through the bridge in this process and in the ones it starts."""
    from . import cuml_alias, serve

    if log_level is not None:
        os.environ[report.ENV_LOG] = str(log_level)
    cuml_alias.enable()
    serve.install()
    os.environ[ENV_ENABLED] = "1"
    os.environ.setdefault(report.ENV_PARENT, str(os.getpid()))
    report.start()  # open before the first call: its time and bytes count too
    _children_inherit()
    if not _exit_hook:
        _exit_hook.append(atexit.register(report.print_at_exit))


def uninstall() -> None:
    """Put scikit-learn's classes back (the ``cuml`` alias stays: modules may hold it); the report stops
    recording and keeps its table."""
    from . import serve

    serve.uninstall()
    os.environ.pop(ENV_ENABLED, None)
    report.stop()


def is_installed() -> bool:
    """Whether scikit-learn's classes are served through the bridge in this process now."""
    from . import serve

    return serve.is_installed()


def report_table() -> str:
    """Where each call of an accelerated class ran, and why not on the worker: a text table."""
    return report.table()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext sklearn_gpu_bridge.accel``: install, and ``%accel_report`` prints the table."""
    install()
    ipython.register_magic_function(lambda line="": print(report.table()), "line", "accel_report")


_SITECUSTOMIZE = '''\
"""Installs sklearn-gpu-bridge's accel in processes started by one that has it (joblib's n_jobs)."""
import os, sys
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_this = sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401 - the environment's own, if it has one
except ImportError:
    pass
if _this is not None:  # the import system takes this module back from sys.modules when it has run
    sys.modules.setdefault("sitecustomize", _this)
if os.environ.get("SKLEARN_GPU_BRIDGE_ACCEL") == "1":
    try:
        import sklearn_gpu_bridge.accel
        sklearn_gpu_bridge.accel.install()
    except Exception as exc:  # noqa: BLE001 - a child without accel still runs, on its CPU
        print(f"sklearn-gpu-bridge.accel: not installed in this child process ({exc})", file=sys.stderr)
'''


def _children_inherit() -> None:
    """A private folder holding a ``sitecustomize`` that installs accel, first on children's PYTHONPATH."""
    from ..runtime.private_files import make_private_folder, runtime_folder, write_private_file

    folder = make_private_folder(runtime_folder() / "accel")
    write_private_file(folder / "sitecustomize.py", _SITECUSTOMIZE)
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *entries])
