"""The bridge's warnings: a category of their own, the user's line, and the CPU notice once per process tree.

- Warnings the bridge gives (the CPU notice, a CPU fallback, a pickle of another version) are
  ``sklearn_gpu_bridge.BridgeWarning``, a RuntimeWarning, so that they can be filtered as one.
- Each points at the line of the user's code that caused it, as scikit-learn's own warnings do: not
  into the bridge, nor into scikit-learn's Pipeline or joblib on the way. So do the worker's warnings
  warned again on the client (a ConvergenceWarning keeps its category).
- The CPU notice ("running on scikit-learn (CPU)") is given once in a process tree: joblib's children
  and processes started after it do not repeat it.
"""

import pickle
import subprocess
import sys
import textwrap
import warnings

import joblib
import pytest
from sklearn.datasets import load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPULogisticRegression, GPUStandardScaler
from sklearn_gpu_bridge.estimators import base

from .conftest import BACKEND, _has_cuml, bare_env, use_worker

X, Y = load_iris(return_X_y=True)


def _next_line():
    """The number of the line after the caller's: where the call under test is."""
    return sys._getframe(1).f_lineno + 1


def _only(caught, category):
    """The one warning of ``category`` among ``caught``."""
    found = [w for w in caught if issubclass(w.category, category)]
    assert len(found) == 1, [(w.category.__name__, str(w.message), w.filename) for w in caught]
    return found[0]


def _assert_here(warning, line):
    assert (warning.filename, warning.lineno) == (__file__, line), \
        f"{warning.category.__name__} points at {warning.filename}:{warning.lineno}, not at the caller's line"


def test_the_bridge_has_a_warning_category_of_its_own():
    category = getattr(sklearn_gpu_bridge, "BridgeWarning", None)
    assert category is not None and "BridgeWarning" in sklearn_gpu_bridge.__all__
    assert issubclass(category, RuntimeWarning)
    from sklearn_gpu_bridge.errors import BridgeWarning

    assert category is BridgeWarning


@pytest.mark.skipif(BACKEND != "sklearn", reason="a ConvergenceWarning at max_iter=1 is scikit-learn's; cuML may not warn")
def test_a_warning_of_the_worker_keeps_its_category_and_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        GPULogisticRegression(max_iter=1).fit(X, Y)
    _assert_here(_only(caught, ConvergenceWarning), line)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        make_pipeline(GPUStandardScaler(), GPULogisticRegression(max_iter=1)).fit(X, Y)
    _assert_here(_only(caught, ConvergenceWarning), line)


@pytest.fixture
def unreachable(tmp_path, worker):
    """After the test's models are fitted: a worker that does not exist, and the CPU fallback allowed."""

    def switch():
        sklearn_gpu_bridge.reset_connection()
        sklearn_gpu_bridge.set_config(connection_file=str(tmp_path / "absent.json"), start_local_worker=False,
                                      cpu_fallback=True)

    yield switch
    sklearn_gpu_bridge.set_config(cpu_fallback=None)
    use_worker(worker)


def test_a_cpu_fallback_warns_a_bridge_warning_at_the_callers_line(unreachable):
    model = pickle.dumps(GPULogisticRegression().fit(X, Y))
    pipeline = pickle.dumps(make_pipeline(GPUStandardScaler(), GPULogisticRegression()).fit(X, Y))
    unreachable()
    model, pipeline = pickle.loads(model), pickle.loads(pipeline)
    category = getattr(sklearn_gpu_bridge, "BridgeWarning", RuntimeWarning)
    assert category is not RuntimeWarning, "no BridgeWarning"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        model.predict(X)
    _assert_here(_only(caught, category), line)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        pipeline.predict_proba(X)
    assert {w.lineno for w in caught if issubclass(w.category, category)} == {line}  # the scaler's and the model's
    assert {w.filename for w in caught if issubclass(w.category, category)} == {__file__}


def test_a_pickle_of_another_version_warns_at_the_line_that_loads_it(monkeypatch, tmp_path):
    model = GPUStandardScaler().fit(X)
    monkeypatch.setattr(base, "__version__", "0.0.0+elsewhere")
    blob = pickle.dumps(model)
    joblib.dump(model, tmp_path / "model.joblib")
    monkeypatch.undo()
    category = getattr(sklearn_gpu_bridge, "BridgeWarning", None)
    assert category is not None, "no BridgeWarning"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        pickle.loads(blob)
    warning = _only(caught, category)
    _assert_here(warning, line)
    assert "0.0.0+elsewhere" in str(warning.message)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _next_line()
        joblib.load(tmp_path / "model.joblib")
    _assert_here(_only(caught, category), line)


_FIRST_FIVE_MINUTES = textwrap.dedent("""\
    import contextlib
    import subprocess
    import sys

    import joblib
    from sklearn.datasets import load_iris
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    from sklearn_gpu_bridge import GPULogisticRegression, GPUStandardScaler

    X, y = load_iris(return_X_y=True)
    search = GridSearchCV(make_pipeline(GPUStandardScaler(), GPULogisticRegression()),
                          {"gpulogisticregression__C": [0.5, 1.0]}, cv=2, n_jobs=2)
    with contextlib.nullcontext() if sys.argv[1] == "default" else joblib.parallel_config(backend=sys.argv[1]):
        search.fit(X, y)
    GPUStandardScaler().fit(X)
    subprocess.run([sys.executable, "-c", "from sklearn_gpu_bridge import GPUStandardScaler; "
                    "GPUStandardScaler().fit([[0.0], [1.0]])"], check=True)
""")


@pytest.mark.skipif(_has_cuml(), reason="with cuML a local worker runs on the GPU: there is no CPU notice")
@pytest.mark.parametrize("backend", ["default", "loky"])
def test_the_cpu_notice_is_given_once_per_process_tree_at_the_users_line(tmp_path, backend):
    """No worker configured and no cuML: the local worker runs scikit-learn, and the user is told so once, at
    the line of the search, although the search's threads (or joblib's children) use the worker first and a
    process it starts uses it too."""
    script = tmp_path / "first_five_minutes.py"
    script.write_text(_FIRST_FIVE_MINUTES)
    (tmp_path / "run").mkdir(mode=0o700)
    env = bare_env()
    env.update(SKLEARN_GPU_BRIDGE_LOCAL_BACKEND="auto", XDG_RUNTIME_DIR=str(tmp_path / "run"), HOME=str(tmp_path))
    env.pop("PYTHONWARNINGS", None)
    run = subprocess.run([sys.executable, str(script), backend], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    notices = [line for line in run.stderr.splitlines() if "running on scikit-learn (CPU)" in line]
    assert len(notices) == 1, run.stderr
    line = _FIRST_FIVE_MINUTES.splitlines().index("    search.fit(X, y)") + 1
    assert notices[0].startswith(f"{script}:{line}: BridgeWarning: sklearn-gpu-bridge: running on scikit-learn"), \
        notices[0]
