"""Every fitted model predicts where there is no worker and no cuML: joblib.dump here, load on a laptop.

Each wrapper is fitted on the worker and dumped with joblib; a fresh Python
process, where importing cuML fails and no worker can be reached, loads them
all and calls every method with ``cpu_fallback`` on. Its answers must be the
worker's (on a cuML worker: the portable forms built from cuML's fitted parts,
in float64 on the CPU, against cuML's float32 answers on the GPU).
"""

import subprocess
import sys
import textwrap
import warnings

import joblib
import numpy as np
import pytest

from .conftest import BACKEND, assert_same
from .test_coverage import CASES, REGISTRY, X_METHODS, _fit_args

_LOAD_AND_ANSWER = textwrap.dedent("""
    import sys, warnings
    sys.modules["cuml"] = None  # importing cuML fails here, as on a laptop
    import joblib, numpy as np, sklearn_gpu_bridge
    sklearn_gpu_bridge.set_config(connection_file=sys.argv[3], start_local_worker=False, cpu_fallback=True)
    warnings.simplefilter("ignore")
    models, X = joblib.load(sys.argv[1]), joblib.load(sys.argv[2])
    answers = {}
    for (name, method), data in X.items():
        model = models[name]
        answers[name, method] = (model.kneighbors(data) if method == "kneighbors"
                                 else getattr(model, method)(data))
    joblib.dump(answers, sys.argv[1] + ".answers")
    print(sorted(m for m, module in sys.modules.items() if module is not None and m.split(".")[0] == "cuml"))
""")


def _methods(model):
    names = [m for m in X_METHODS if hasattr(model, m)]
    return names + (["kneighbors"] if hasattr(model, "kneighbors") else [])


def _available(name):
    """UMAP's portable form is umap-learn's UMAP: without umap-learn there is none (cuML's either)."""
    if name == "GPUUMAP":
        try:
            import umap  # noqa: F401
        except ImportError:
            return False
    return True


def test_every_fitted_model_answers_without_a_worker_or_cuml(connection, tmp_path):
    models, inputs, expected = {}, {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(CASES):
            if not _available(name):
                continue
            params, (X, y) = CASES[name]
            model = REGISTRY[name](**params).fit(*_fit_args(name, X, y))
            for method in _methods(model):
                data = X[:7] if method == "kneighbors" else X
                inputs[name, method] = data
                expected[name, method] = model.kneighbors(data) if method == "kneighbors" else \
                    getattr(model, method)(data)
            models[name] = model
    assert len({name for name, _ in inputs}) >= 30  # every class with a method that takes X
    joblib.dump(models, tmp_path / "models.joblib")
    joblib.dump(inputs, tmp_path / "inputs.joblib")
    run = subprocess.run([sys.executable, "-c", _LOAD_AND_ANSWER, str(tmp_path / "models.joblib"),
                          str(tmp_path / "inputs.joblib"), str(tmp_path / "no-worker.json")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"  # cuML was never imported
    answers = joblib.load(tmp_path / "models.joblib.answers")
    assert set(answers) == set(expected)
    for key, want in expected.items():
        got = answers[key]
        for g, w in zip(got, want) if key[1] == "kneighbors" else [(got, want)]:
            try:
                _same_answer(key, g, w)
            except AssertionError as exc:
                raise AssertionError(f"{key}: {exc}") from None


def _same_answer(key, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype.kind == want.dtype.kind, (got.dtype, want.dtype)
    if BACKEND == "sklearn" or got.dtype.kind not in "fc":
        if got.dtype.kind in "fc":
            assert_same(got, want)
        elif BACKEND == "sklearn" or key[1] != "predict":
            np.testing.assert_array_equal(got, want)
        else:  # cuML's float32 near a boundary: nearly every label
            assert np.mean(got == want) >= 0.98
    else:  # float64 on the CPU against cuML's float32
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["GPUSVC", "GPUTargetEncoder", "GPUIsolationForest"])
def test_the_portable_form_is_a_plain_estimator(connection, name):
    """The classes whose cuML form has no scikit-learn twin carry one of sklearn_gpu_bridge.portable (or
    scikit-learn's own class): something that pickles and predicts with scikit-learn alone."""
    params, (X, y) = CASES[name]
    model = REGISTRY[name](**params).fit(*_fit_args(name, X, y))
    form = model.sklearn_model_
    assert type(form).__module__.split(".")[0] in ("sklearn", "sklearn_gpu_bridge")
    assert not type(form).__module__.startswith("sklearn_gpu_bridge") or \
        type(form).__module__ == "sklearn_gpu_bridge.portable"
