"""Searches whose fits all run on a worker use threads of this process instead of joblib's processes."""

import os

import joblib
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPULogisticRegression, GPUStandardScaler
from sklearn_gpu_bridge.estimators.search_threads import runs_on_a_worker

pytestmark = pytest.mark.usefixtures("worker")

X = np.random.default_rng(0).standard_normal((120, 4))
y = (X[:, 0] + X[:, 1] > 0).astype(int)


def _pid_scorer(estimator, X, y):
    """The process a fit was scored in, as its score."""
    return float(os.getpid())


def _search_pids(pipe, **options):
    search = GridSearchCV(pipe, {"m__C": [0.1, 1.0, 10.0]}, cv=2, n_jobs=2, scoring=_pid_scorer, **options)
    search.fit(X, y)
    return set(search.cv_results_["mean_test_score"])


def _bridged():
    return Pipeline([("sc", GPUStandardScaler()), ("m", GPULogisticRegression())])


def test_a_search_of_bridged_estimators_runs_in_threads_of_this_process():
    assert _search_pids(_bridged()) == {float(os.getpid())}


def test_its_answers_are_those_of_a_search_without_jobs():
    grid = {"m__C": [0.01, 1.0, 100.0]}
    one = GridSearchCV(_bridged(), grid, cv=3).fit(X, y)
    threads = GridSearchCV(_bridged(), grid, cv=3, n_jobs=2).fit(X, y)
    assert one.best_params_ == threads.best_params_
    np.testing.assert_allclose(one.cv_results_["mean_test_score"], threads.cv_results_["mean_test_score"],
                               rtol=1e-6)


def test_a_step_that_computes_here_keeps_joblibs_processes():
    mixed = Pipeline([("sc", StandardScaler()), ("m", GPULogisticRegression())])
    assert float(os.getpid()) not in _search_pids(mixed)


def test_a_backend_the_user_chose_is_kept():
    with joblib.parallel_config(backend="loky"):
        assert float(os.getpid()) not in _search_pids(_bridged())


def test_the_setting_off_keeps_joblibs_processes():
    with sklearn_gpu_bridge.config_context(search_threads="off"):
        assert float(os.getpid()) not in _search_pids(_bridged())


def test_which_tasks_count_as_running_on_a_worker():
    bridged = joblib.delayed(cross_val_score)(_bridged(), X, y)
    assert runs_on_a_worker(bridged)
    assert not runs_on_a_worker(joblib.delayed(cross_val_score)(LogisticRegression(), X, y))
    assert not runs_on_a_worker(joblib.delayed(np.sum)(X))  # no estimator: joblib's choice
    nested = GridSearchCV(_bridged(), {"m__C": [1.0]})
    assert runs_on_a_worker(joblib.delayed(cross_val_score)(nested, X, y))
