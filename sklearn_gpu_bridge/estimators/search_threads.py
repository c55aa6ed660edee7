"""Searches whose fits all run on a worker use threads, not processes.

``GridSearchCV(n_jobs=-1)``, ``cross_validate``, ``VotingClassifier`` and the
rest hand their fits to joblib, whose default starts a process per core
(loky): each imports scikit-learn and this package and connects to the
worker before its first fit, seconds in all, while its share of the work is
waiting for replies. When every estimator a task fits runs on a worker
(``GPU*`` estimators, or classes served under accel, inside any Pipeline or
other composite), threads of this process do the same waiting at no start
cost, over the one connection.

scikit-learn's :class:`sklearn.utils.parallel.Parallel` is patched in place,
and only its choice of backend changes, only where the user made none:
no ``backend=`` argument, no ``joblib.parallel_config(backend=...)``, no
``prefer``/``require`` hint, and the setting ``search_threads`` left at
``"auto"``. A task with any estimator that computes here (a plain
scikit-learn step) keeps joblib's processes.
"""

import functools
import itertools

import joblib.parallel
from sklearn.base import BaseEstimator
from sklearn.utils import parallel as sklearn_parallel

from ..config import get_setting
from .base import RemoteEstimator

#: set on scikit-learn's methods patched here (and by accel on the methods it serves)
MARK = "_sklearn_gpu_bridge"
SETTINGS = ("auto", "off")


def install():
    """Patch scikit-learn's Parallel (idempotent). Not with joblib < 1.3, which cannot tell a backend the
    user chose from its default."""
    cls = sklearn_parallel.Parallel
    if getattr(cls.__call__, MARK, False) or not hasattr(joblib.parallel, "default_parallel_config"):
        return
    cls.__init__ = _remember_choice(cls.__init__)
    cls.__call__ = _threads_for_worker_tasks(cls.__call__)


def _unset(value, name):
    return value is None or value is joblib.parallel.default_parallel_config[name]


def _remember_choice(init):
    @functools.wraps(init)
    def __init__(self, n_jobs=None, backend=None, *args, prefer=None, require=None, **kwargs):
        config = getattr(joblib.parallel._backend, "config", {})
        self._backend_is_default = (not args and _unset(backend, "backend") and _unset(prefer, "prefer")
                                    and _unset(require, "require")
                                    and all(_unset(config.get(name), name) for name in ("backend", "prefer", "require")))
        passed = {name: value for name, value in (("prefer", prefer), ("require", require)) if value is not None}
        init(self, n_jobs, backend, *args, **passed, **kwargs)

    setattr(__init__, MARK, True)
    return __init__


def _threads_for_worker_tasks(call):
    @functools.wraps(call)
    def __call__(self, iterable):
        if (not getattr(self, "_backend_is_default", False) or getattr(self._backend, "uses_threads", False)
                or self._effective_n_jobs() == 1):
            return call(self, iterable)
        if get_setting("search_threads") not in SETTINGS:
            raise ValueError(f"search_threads={get_setting('search_threads')!r}: choose one of {SETTINGS}")
        tasks = iter(iterable)
        first = next(tasks, None)
        tasks = itertools.chain([] if first is None else [first], tasks)
        if first is None or get_setting("search_threads") == "off" or not runs_on_a_worker(first):
            return call(self, tasks)
        # in its own Parallel: this one may be a search's ``with parallel:``, its processes not yet started
        threaded = type(self)(n_jobs=self.n_jobs, backend="threading", return_as=self.return_as,
                              verbose=self.verbose, timeout=self.timeout, pre_dispatch=self.pre_dispatch,
                              batch_size=self.batch_size)
        return call(threaded, tasks)

    setattr(__call__, MARK, True)
    return __call__


def runs_on_a_worker(task):
    """Whether a joblib task ``(function, args, kwargs)`` fits estimators, all of which run on a worker."""
    _, args, kwargs = task
    leaves = [leaf for value in itertools.chain(args, kwargs.values()) for leaf in _leaf_estimators(value)]
    return bool(leaves) and all(_on_a_worker(leaf) for leaf in leaves)


def _leaf_estimators(value):
    """The estimators inside ``value`` that hold no estimators: a Pipeline's steps, a search's estimator ..."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaf_estimators(item)
    elif isinstance(value, BaseEstimator):
        inner = [leaf for param in value.get_params(deep=False).values() for leaf in _leaf_estimators(param)]
        if inner:
            yield from inner
        else:
            yield value


def _on_a_worker(estimator):
    return isinstance(estimator, RemoteEstimator) or getattr(getattr(type(estimator), "fit", None), MARK, False)
