"""scikit-learn's callbacks (``sklearn.callback``, 1.9 and later) on the ``GPU*`` estimators: a fit on the worker
is one task of theirs, and they run here, never on the worker."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV

import sklearn_gpu_bridge as sgb
from sklearn_gpu_bridge.config import ENV_CONNECTION_FILE

sklearn_callback = pytest.importorskip("sklearn.callback", reason="scikit-learn 1.9's callbacks")


class Recorder:
    """A FitCallback that writes down each hook it gets: (hook, estimator's class, task name, max_subtasks)."""

    def __init__(self):
        self.events = []
        self.fitted = []
        self.lock = threading.Lock()  # not picklable: a callback that travelled would fail

    def setup(self, estimator, context):
        self.events.append(("setup", type(estimator).__name__))

    def on_fit_task_begin(self, estimator, context, *, X=None, y=None, metadata=None):
        self.events.append(("begin", type(estimator).__name__, context.task_name, context.max_subtasks))
        self.shapes = (X.shape, None if y is None else len(y), metadata)

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
        self.events.append(("end", type(estimator).__name__, context.task_name, context.max_subtasks))
        self.fitted.append(fitted_estimator)

    def teardown(self, estimator, context):
        self.events.append(("teardown", type(estimator).__name__))


class Propagated(Recorder):
    """An auto-propagated callback: set on a meta-estimator, it reaches the estimators it fits."""

    max_propagation_depth = None

    def on_fit_task_begin(self, estimator, context, *, X=None, y=None, metadata=None):
        self.events.append(("begin", context.estimator_name, context.task_name, context.source_estimator_name))

    def on_fit_task_end(self, estimator, context):
        self.events.append(("end", context.estimator_name, context.task_name))


def test_a_fit_on_the_worker_is_one_task_of_the_callbacks_in_order(connection):
    X, y = make_classification(n_samples=120, n_features=5, random_state=0)
    recorder = Recorder()
    model = sgb.GPUSVC().set_callbacks(recorder)
    assert model.fit(X, y) is model
    assert recorder.events == [("setup", "GPUSVC"), ("begin", "GPUSVC", "fit", None), ("end", "GPUSVC", "fit", None),
                               ("teardown", "GPUSVC")]
    assert recorder.shapes == ((120, 5), 120, {"sample_weight": None})
    fitted = recorder.fitted[0]  # a copy of the model, fitted, as scikit-learn's fitted_estimator is
    assert fitted is not model and type(fitted) is sgb.GPUSVC
    np.testing.assert_array_equal(fitted.predict(X), model.predict(X))
    assert not hasattr(model, "_callback_fit_ctx")  # scikit-learn's bookkeeping is gone after the fit


def test_fit_transform_and_sample_weight_reach_the_callbacks(connection):
    X, y = make_classification(n_samples=80, n_features=4, random_state=1)
    weights = np.linspace(0.5, 1.5, len(X))
    recorder = Recorder()
    out = sgb.GPUStandardScaler().set_callbacks(recorder).fit_transform(X)
    assert out.shape == X.shape
    assert [event[0] for event in recorder.events] == ["setup", "begin", "end", "teardown"]
    recorder = Recorder()
    sgb.GPULogisticRegression().set_callbacks(recorder).fit(X, y, sample_weight=weights)
    np.testing.assert_array_equal(recorder.shapes[2]["sample_weight"], weights)


def test_callbacks_stay_here_and_a_clone_keeps_them(connection):
    """The recorder holds a lock, which cannot be pickled: it was never sent to the worker."""
    X, y = make_classification(n_samples=60, n_features=4, random_state=2)
    recorder = Recorder()
    model = sgb.GPULogisticRegression(C=0.5).set_callbacks(recorder)
    assert "callbacks" not in str(model.get_params())
    clone(model).fit(X, y)
    assert [event[0] for event in recorder.events] == ["setup", "begin", "end", "teardown"]


def test_teardown_runs_when_the_worker_refuses_the_fit(connection):
    X, y = make_classification(n_samples=60, n_features=4, random_state=3)
    recorder = Recorder()
    with pytest.raises(ValueError):
        sgb.GPUSVC(kernel="no such kernel").set_callbacks(recorder).fit(X, y)
    assert [event[0] for event in recorder.events] == ["setup", "begin", "teardown"]


def test_a_search_propagates_its_callbacks_to_each_fit_on_the_worker(connection):
    X, y = make_classification(n_samples=90, n_features=4, random_state=4)
    propagated = Propagated()
    search = GridSearchCV(sgb.GPUSVC(), {"C": [0.5, 1.0]}, cv=2).set_callbacks(propagated)
    search.fit(X, y)
    merged = [event for event in propagated.events if event[:2] == ("begin", "GPUSVC")]
    assert len(merged) == 2 * 2 + 1  # each fold's fit and the refit, as tasks of the search's tree
    assert all(event[3] == "GridSearchCV" for event in merged)
    assert propagated.events[0] == ("setup", "GridSearchCV") and propagated.events[-1] == ("teardown", "GridSearchCV")
    assert not hasattr(search.best_estimator_, "_parent_callback_ctx")


def test_under_accel_a_served_estimator_keeps_its_callbacks_around_its_fit_on_the_worker(accelerated, connection):
    """The user's scikit-learn estimator sees its own callbacks, though its fit ran on the worker."""
    from sklearn.linear_model import LogisticRegression

    from sklearn_gpu_bridge.accel import report

    X, y = make_classification(n_samples=60, n_features=4, random_state=5)
    recorder = Recorder()
    before = connection.status()["requests"].get("fit", 0)
    estimator = LogisticRegression().set_callbacks(recorder).fit(X, y)
    assert connection.status()["requests"].get("fit", 0) == before + 1
    assert report.calls()["LogisticRegression.fit"]["worker"] == 1
    assert [event[:2] for event in recorder.events] == [("setup", "LogisticRegression"), ("begin", "LogisticRegression"),
                                                        ("end", "LogisticRegression"), ("teardown", "LogisticRegression")]
    assert recorder.shapes == ((60, 4), 60, {"sample_weight": None})
    assert estimator.coef_.shape == (1, 4)


def test_without_sklearn_callback_the_wrappers_fit_as_before(tmp_path, connection):
    """scikit-learn before 1.9 has no sklearn.callback: no set_callbacks, and nothing else changes."""
    code = textwrap.dedent("""
        import sys
        import sklearn.datasets, sklearn.model_selection, sklearn.pipeline, sklearn.svm  # noqa: F401, E401
        from sklearn.datasets import make_classification
        sys.modules["sklearn.callback"] = None  # from here, import sklearn.callback fails, as before 1.9
        import sklearn_gpu_bridge as sgb
        X, y = make_classification(n_samples=60, n_features=4, random_state=0)
        model = sgb.GPUSVC().fit(X, y)
        print(hasattr(model, "set_callbacks"), model.score(X, y) > 0.5)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, ENV_CONNECTION_FILE: os.environ[ENV_CONNECTION_FILE],
                              "SKLEARN_GPU_BRIDGE_START_LOCAL_WORKER": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["False", "True"]


def test_under_accel_a_fit_that_falls_back_to_the_cpu_is_one_task(accelerated, tmp_path):
    """A served fit that cannot reach a worker runs scikit-learn's own on the CPU: its callbacks see one task,
    begun and ended (as for a fit on the worker), not a worker's task torn down and then the CPU's."""
    from sklearn.linear_model import LogisticRegression

    from sklearn_gpu_bridge.accel import report

    X, y = make_classification(n_samples=60, n_features=4, random_state=6)
    recorder = Recorder()
    with sgb.config_context(connection_file=str(tmp_path / "none.json"), start_local_worker=False):
        sgb.reset_connection()
        try:
            model = LogisticRegression().set_callbacks(recorder).fit(X, y)
        finally:
            sgb.reset_connection()
    assert report.calls()["LogisticRegression.fit"]["cpu"] == 1 and model.coef_.shape == (1, 4)
    assert [event[0] for event in recorder.events] == ["setup", "begin", "end", "teardown"]
