"""scikit-learn's callbacks (``sklearn.callback``, scikit-learn 1.9 and later) on the ``GPU*`` estimators.

A wrapper takes callbacks as scikit-learn's estimators do (``set_callbacks(ProgressBar())``, or propagated
from a meta-estimator such as ``GridSearchCV``), and a fit on the worker is one task of theirs: ``setup``,
``on_fit_task_begin`` before the request leaves, ``on_fit_task_end`` when the worker's answer is back,
``teardown`` whatever happens. The task has no known number of subtasks, so a ``ProgressBar`` shows the
wait for the worker as a bar in motion, then done. Callbacks are the user's objects: they run here, in the
client, and never travel to the worker.

Where scikit-learn has no ``sklearn.callback`` (before 1.9), the wrappers have no ``set_callbacks`` and fit
as they always did.
"""

import contextlib
import functools

try:
    from sklearn.callback import CallbackSupportMixin, with_callbacks
except ImportError:  # scikit-learn before 1.9
    CallbackSupportMixin = with_callbacks = None

#: the base classes that give an estimator ``set_callbacks`` (none without ``sklearn.callback``)
BASES = (CallbackSupportMixin,) if CallbackSupportMixin is not None else ()


def wanted(estimator):
    """Whether a fit of ``estimator`` is a task of callbacks: its own, or those of a meta-estimator fitting it."""
    state = estimator.__dict__
    return ("_skl_callbacks" in state or "_parent_callback_ctx" in state) and hasattr(
        estimator, "_init_callback_context")


def fit_task(estimator, run, *, X=None, y=None, metadata=None):
    """``run()`` (a fit on the worker) as one task of ``estimator``'s callbacks; its result.

    ``estimator`` is the one the user sees: a ``GPU*`` wrapper, or under accel the scikit-learn estimator that
    the worker serves. ``on_fit_task_end`` gets ``fitted_estimator`` (a copy of ``estimator``, fitted) where
    a callback asks for it.
    """
    if with_callbacks is None or not wanted(estimator):
        return run()
    return _managed(estimator, run, X, y, metadata)


def _run_task(estimator, run, X, y, metadata):
    context = estimator._init_callback_context(task_name="fit", max_subtasks=None)
    context.call_on_fit_task_begin(estimator=estimator, X=X, y=y, metadata=metadata)
    result = run()
    context.call_on_fit_task_end(estimator=estimator, X=X, y=y, metadata=metadata, reconstruction_attributes=dict)
    return result


# scikit-learn's own management: teardown of what was set up, also when the fit fails
_managed = with_callbacks(_run_task) if with_callbacks is not None else None


#: what scikit-learn keeps on an estimator for its callbacks and its fit's task
_STATE = ("_skl_callbacks", "_parent_callback_ctx", "_callback_fit_ctx", "_skl_callbacks_to_teardown")


@contextlib.contextmanager
def hidden(estimator):
    """``estimator``'s callbacks and its task out of sight, then back: scikit-learn's own fit, run within a task
    of :func:`fit_task` (accel's fallback to the CPU), starts no second task and tears nothing down."""
    state = estimator.__dict__
    kept = {name: state.pop(name) for name in _STATE if name in state}
    try:
        yield
    finally:
        for name in _STATE:
            state.pop(name, None)
        state.update(kept)


def fitting(function):
    """A wrapper's ``_fit_prepared(method, X, y, fit_kwargs, ...)`` as one task of its callbacks."""

    @functools.wraps(function)
    def fit(self, method, X, y, fit_kwargs, *args, **kwargs):
        if with_callbacks is None or not wanted(self):
            return function(self, method, X, y, fit_kwargs, *args, **kwargs)
        metadata = {"sample_weight": fit_kwargs.get("sample_weight")}
        return fit_task(self, lambda: function(self, method, X, y, fit_kwargs, *args, **kwargs), X=X, y=y,
                        metadata=metadata)

    return fit
