"""Existing code, unchanged: scikit-learn scripts under accel, and ``import cuml`` without cuML.

Scripts run in fresh interpreters (``python -m sklearn_gpu_bridge.accel``)
against the session's worker, and their output is compared with the same
script under plain Python; in-process tests install accel and take it out
again. On the scikit-learn backend the answers are scikit-learn's exactly;
on a cuML worker within cuML's float32 tolerances (labels nearly all).
"""

import base64
import hashlib
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import click
import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.datasets import load_iris, make_blobs, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUStandardScaler, accel, catalogue, ledger
from sklearn_gpu_bridge.accel import cuml_alias, report, serve
from sklearn_gpu_bridge.catalogue import ESTIMATORS

from .conftest import BACKEND, assert_same, use_worker, wait_until

SCRIPT = textwrap.dedent("""
    import sys
    import joblib, numpy as np
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs, make_classification
    from sklearn.decomposition import PCA
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    X, y = make_classification(n_samples=600, n_features=20, random_state=0)
    grid = GridSearchCV(Pipeline([("sc", StandardScaler()), ("svm", SVC())]), {"svm__C": [0.1, 1, 10]}, cv=3,
                        n_jobs=int(sys.argv[2]))
    grid.fit(X, y)
    print("grid", grid.best_params_, np.round(grid.cv_results_["mean_test_score"], 3).tolist())
    pca = PCA(n_components=5).fit(X)
    lr = LogisticRegression().fit(pca.transform(X), y)
    print("pca+logistic", round(lr.score(pca.transform(X), y), 3))
    print("knn", round(KNeighborsClassifier().fit(X, y).score(X, y), 3))
    forest = RandomForestClassifier(n_estimators=20, random_state=0).fit(X, y)
    print("forest", forest.score(X, y) > 0.95)
    Xb, yb = make_blobs(n_samples=500, centers=3, random_state=0)
    km = KMeans(n_clusters=3, random_state=0, n_init=3).fit(Xb)
    print("kmeans", sorted(np.bincount(km.labels_).tolist()))
    print("types", type(grid.best_estimator_["svm"]).__module__, type(km).__name__)
    joblib.dump(grid.best_estimator_, sys.argv[1])
""")

QUICKSTART = textwrap.dedent("""
    import numpy as np
    import cuml
    from cuml.preprocessing import StandardScaler
    from cuml.svm import SVC

    X = np.random.rand(1000, 20).astype("float32")
    y = (X[:, 0] > 0.5).astype("float32")
    X_s = StandardScaler().fit_transform(X)
    model = SVC(kernel="rbf", C=1.0).fit(X_s, y)
    print(model.predict(X_s[:5]))
    print(cuml.__version__)
""")


#: sys.path of a client without cuML, for the scripts these tests start (on the GPU machine, where this
#: process imports cuML for the worker: on_gpu.sh sets it to a site of pyzmq, blake3 and this package only)
CLIENT_PATH = os.environ.get("SKLEARN_GPU_BRIDGE_TEST_CLIENT_PATH")
client_without_cuml = pytest.mark.skipif(
    CLIENT_PATH is None and catalogue.real_cuml_importable(),
    reason="about a client without cuML, and this process can import one: set SKLEARN_GPU_BRIDGE_TEST_CLIENT_PATH "
           "to a sys.path without cuML (benchmarks/on_gpu.sh does)")


def _client_env():
    return {"PYTHONPATH": CLIENT_PATH} if CLIENT_PATH is not None else {}


def _python(*args, tmp_path, env=None):
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, **_client_env(), **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _lines(text):
    return [line for line in text.splitlines() if line and not line.startswith(("/", " "))]


# ---------------------------------------------------------------- scripts, unmodified


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_scikit_learn_script_runs_unmodified_with_the_same_answers(tmp_path, connection, n_jobs):
    (tmp_path / "script.py").write_text(SCRIPT)
    before = connection.status()["requests"].get("fit", 0)
    served = _python("-m", "sklearn_gpu_bridge.accel", "-v", "script.py", "served.joblib", str(n_jobs),
                     tmp_path=tmp_path)
    plain = _python("script.py", "plain.joblib", str(n_jobs), tmp_path=tmp_path)
    fits = connection.status()["requests"].get("fit", 0) - before
    assert fits >= 3 * 3 * 2 + 5  # every fold's scaler and SVC (in joblib's children too), and the other five
    got, want = _lines(served.stdout), _lines(plain.stdout)
    if BACKEND == "sklearn":  # every number printed is an accuracy (a ratio of label counts) or a label count
        assert got == want
    else:  # cuML: the same choices; scores within a few points
        assert got[0].split("[")[0] == want[0].split("[")[0] and got[-1] == want[-1]
    table = served.stderr[served.stderr.index("call "):]
    for row in ("SVC.fit", "StandardScaler.fit_transform", "PCA.fit", "LogisticRegression.fit", "KMeans.fit",
                "KNeighborsClassifier.predict", "RandomForestClassifier.fit"):
        line = next(line for line in table.splitlines() if line.startswith(row + " "))
        assert int(line.split()[1]) >= 1, table  # ran on the worker
    assert "types sklearn.svm._classes KMeans" in served.stdout


_CHILDREN = textwrap.dedent("""
    import joblib

    def served_here():
        import sklearn_gpu_bridge.accel
        return sklearn_gpu_bridge.accel.is_installed()

    print(joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(served_here)() for _ in range(4)))
""")


def test_the_processes_a_script_starts_are_accelerated_too_and_say_nothing_of_it(tmp_path, connection):
    """joblib's processes import accel's ``sitecustomize`` first: accel is installed there, silently."""
    (tmp_path / "children.py").write_text(_CHILDREN)
    run = _python("-m", "sklearn_gpu_bridge.accel", "children.py", tmp_path=tmp_path)
    assert run.stdout.strip() == "[True, True, True, True]"
    assert "sitecustomize" not in run.stderr, run.stderr


_MODULE = textwrap.dedent("""
    import sys
    import numpy as np, scipy.sparse as sp
    from sklearn.cluster import KMeans
    from sklearn.preprocessing import StandardScaler
    X = np.random.default_rng(0).standard_normal((60, 3))
    print("scaled", StandardScaler().fit_transform(X).shape, sys.argv[1:])
    KMeans(n_clusters=2, n_init=1, random_state=0).fit(sp.csr_matrix(X))  # cuML's KMeans: dense only, CPU
""")


@pytest.mark.parametrize("how", ["-m", "-c"])
def test_a_module_or_a_string_runs_under_accel_and_vv_tells_each_cpu_call(tmp_path, connection, how):
    """``-m module`` and ``-c code`` run as ``python -m``/``-c`` do; ``-vv`` says each CPU call as it happens."""
    (tmp_path / "served_module.py").write_text(_MODULE)
    target = "served_module" if how == "-m" else _MODULE
    before = connection.status()["requests"].get("fit", 0)
    run = _python("-m", "sklearn_gpu_bridge.accel", "-vv", how, target, "an-arg", tmp_path=tmp_path)
    assert "scaled (60, 3) ['an-arg']" in run.stdout
    assert connection.status()["requests"].get("fit", 0) > before  # the scaler ran on the worker
    assert "KMeans.fit ran on the CPU (fell back: TypeError" in run.stderr  # as it happens
    assert "served on the worker" in run.stderr  # and the table at exit


def test_a_worker_never_runs_accel_whatever_its_environment_says(tmp_path, worker, connection):
    """A worker started with accel's sitecustomize and SKLEARN_GPU_BRIDGE_ACCEL=1 (as a child of an accelerated
    process would be) takes accel out: its scikit-learn fits run there, not on the worker its environment names."""
    from sklearn_gpu_bridge.accel import _SITECUSTOMIZE

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {**os.environ, "SKLEARN_GPU_BRIDGE_ACCEL": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))}
    assert env["SKLEARN_GPU_BRIDGE_CONNECTION_FILE"] == str(worker.connection_file)  # where accel would send
    connection_file = tmp_path / "accel-env-worker.json"
    process = subprocess.Popen([sys.executable, "-m", "sklearn_gpu_bridge.worker", "--backend", "sklearn",
                                "--connection-file", str(connection_file), "--log-level", "WARNING"],
                               env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(connection_file.exists, 120), process.stderr.read() if process.poll() is not None else ""
        before = connection.status()["requests"].get("fit", 0)
        sklearn_gpu_bridge.reset_connection()
        sklearn_gpu_bridge.set_config(connection_file=str(connection_file))
        X = np.random.default_rng(0).standard_normal((30, 3))
        assert_same(GPUStandardScaler().fit_transform(X), StandardScaler().fit_transform(X))
        assert sklearn_gpu_bridge.get_connection().status()["requests"].get("fit", 0) == 1
    finally:
        sklearn_gpu_bridge.reset_connection()
        process.terminate()
        process.wait(30)
    use_worker(worker)
    assert sklearn_gpu_bridge.get_connection().status()["requests"].get("fit", 0) == before  # no fit went there


USED = textwrap.dedent("""
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression, SGDClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    X, y = make_classification(n_samples=200, n_features=6, random_state=0)
    HistGradientBoostingClassifier(max_iter=5).fit(X, y).predict(X)
    make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    SGDClassifier().fit(X, y)
    SVC().fit(X, np.arange(len(y)) % 3)
    try:
        LogisticRegression(C=-1.0).fit(X, y)
    except ValueError as exc:
        print("refused", type(exc).__name__)
""")


def test_v_lists_every_scikit_learn_class_the_script_used_and_why_it_ran_where_it_ran(tmp_path):
    (tmp_path / "script.py").write_text(USED)
    run = _python("-m", "sklearn_gpu_bridge.accel", "-v", "script.py", tmp_path=tmp_path)
    assert run.stdout == "refused InvalidParameterError\n"  # scikit-learn's own error, raised on the CPU
    table = run.stderr[run.stderr.index("call "):].splitlines()[2:]
    rows = {line.split()[0]: (int(line.split()[1]), int(line.split()[2]), line) for line in table}
    expected = {  # call: (on the worker, on the CPU, why)
        "HistGradientBoostingClassifier.fit": (0, 1, "not served: cuML has no counterpart"),
        "Pipeline.fit": (0, 1, "not served: it holds estimators"),
        "StandardScaler.fit_transform": (1, 0, "served on the worker"),
        "SGDClassifier.fit": (0, 1, "not served: cuML's MBSGD is another algorithm"),
        "SVC.fit": (1, 0, "served on the worker"),  # three classes: scikit-learn's SVC from the worker's pairs
        "LogisticRegression.fit": (1, 1, "served on the worker; refused by the worker: "),
    }
    for call, (worker, cpu, why) in expected.items():
        assert call in rows, f"{call} is not in the table:\n{run.stderr}"
        assert rows[call][:2] == (worker, cpu) and why in rows[call][2], rows[call][2]
    assert not set(rows) - set(expected), table  # HistGradientBoosting's predict: not counted (no fit)


@pytest.mark.parametrize("args, code", [(["missing.py"], 2), (["-m", "no_such_module_here"], 1)],
                         ids=["script", "module"])
def test_code_that_cannot_be_found_is_said_in_one_line_as_python_says_it(tmp_path, args, code):
    served = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge.accel", *args], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert served.returncode == plain.returncode == code
    assert served.stdout == "" and len(served.stderr.splitlines()) == 1, served.stderr
    # python's words, after the program's name ("/usr/bin/python: can't open file ...")
    assert served.stderr.split(": ", 1)[1] == plain.stderr.split(": ", 1)[1]
    if code == 2:
        assert f"can't open file {str(tmp_path / 'missing.py')!r}: [Errno 2]" in served.stderr


@pytest.mark.parametrize("args", [["broken.py"], ["-c", "import broken"]], ids=["script", "-c"])
def test_the_codes_own_error_shows_its_own_traceback_as_python_shows_it(tmp_path, args):
    (tmp_path / "broken.py").write_text("def divide():\n    return 1 / 0\n\n\ndivide()\n")
    served = subprocess.run([sys.executable, "-m", "sklearn_gpu_bridge.accel", *args], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    plain = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert served.returncode == plain.returncode == 1
    assert served.stderr == plain.stderr and "ZeroDivisionError" in served.stderr


def test_a_model_fitted_under_accel_loads_where_the_bridge_is_not_installed(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    _python("-m", "sklearn_gpu_bridge.accel", "script.py", "served.joblib", "1", tmp_path=tmp_path)
    check = textwrap.dedent("""
        import sys
        sys.modules["sklearn_gpu_bridge"] = None  # not installed, as far as this process can tell
        sys.modules["cuml"] = None
        import joblib, numpy as np
        from sklearn.datasets import make_classification
        X, y = make_classification(n_samples=600, n_features=20, random_state=0)
        model = joblib.load("served.joblib")
        print(type(model).__name__, model.score(X, y))
    """)
    out = _python("-c", check, tmp_path=tmp_path).stdout.split()
    model = joblib.load(tmp_path / "served.joblib")  # here, accel is not installed: plain scikit-learn too
    X, y = make_classification(n_samples=600, n_features=20, random_state=0)
    assert out[0] == "Pipeline" and abs(float(out[1]) - model.score(X, y)) < 1e-12


# ---------------------------------------------------------------- in process: still scikit-learn's classes


def test_served_objects_stay_scikit_learns(accelerated, connection):
    X, y = load_iris(return_X_y=True)
    model = LogisticRegression(C=0.5, max_iter=500)
    assert type(model) is LogisticRegression and repr(model) == "LogisticRegression(C=0.5, max_iter=500)"
    before = connection.status()["requests"].get("fit", 0)
    model.fit(X, y)
    assert connection.status()["requests"].get("fit", 0) == before + 1
    assert isinstance(model, LogisticRegression) and model.get_params()["C"] == 0.5
    assert clone(model).get_params() == model.get_params() and not hasattr(clone(model), "coef_")
    assert model.coef_.shape == (3, 4) and list(model.classes_) == [0, 1, 2]
    loaded = pickle.loads(pickle.dumps(model))
    assert type(loaded) is LogisticRegression
    accel.uninstall()
    direct = LogisticRegression(C=0.5, max_iter=500).fit(X, y)
    np.testing.assert_array_equal(loaded.predict(X), direct.predict(X))
    if BACKEND == "sklearn":
        np.testing.assert_allclose(loaded.predict_proba(X), direct.predict_proba(X), rtol=1e-10, atol=1e-12)


def test_uninstall_stops_the_report_and_keeps_its_table(accelerated, connection, monkeypatch):
    """Taken out, accel stops recording: the report's folder (where its processes append) goes, the table stays,
    and scikit-learn's own classes are not counted; installed again, it counts on."""
    monkeypatch.setenv(report.ENV_LOG, "1")  # -v: the report that counts the processes too
    report.start()
    X, y = load_iris(return_X_y=True)
    LogisticRegression(max_iter=500).fit(X, y)
    folder = ledger._folder_of(os.environ[ledger.ENV_REPORT])
    assert folder.is_dir()
    accel.uninstall()
    assert not folder.exists()
    counted = report.calls()
    LogisticRegression(max_iter=500).fit(X, y)
    assert report.calls() == counted and counted["LogisticRegression.fit"]["worker"] == 1
    accel.install()
    LogisticRegression(max_iter=500).fit(X, y)
    assert folder.is_dir() and report.calls()["LogisticRegression.fit"]["worker"] == 2


def test_without_v_nothing_is_kept_per_call(accelerated, connection):
    """Without ``-v`` accel counts this process's calls and keeps no report: no folder for its processes, no
    record per call (a long-running accelerated program does not grow)."""
    X, y = load_iris(return_X_y=True)
    for _ in range(3):
        LogisticRegression(max_iter=500).fit(X, y).predict(X)
    assert not ledger.recording() and ledger._records == []
    assert report.calls()["LogisticRegression.fit"] == {"worker": 3, "cpu": 0, "reasons": {}}


def test_set_output_pandas_still_works_on_a_served_transformer(accelerated):
    pd = pytest.importorskip("pandas")
    X = pd.DataFrame(load_iris().data, columns=list("abcd"))
    out = StandardScaler().set_output(transform="pandas").fit_transform(X)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == list("abcd")
    assert report.calls()["StandardScaler.fit_transform"]["worker"] == 1


def test_labels_come_back_as_given(accelerated):
    X, y = load_iris(return_X_y=True)
    labels = np.array(["setosa", "versicolor", "virginica"])[y]
    model = LogisticRegression(max_iter=500).fit(X, labels)
    assert model.predict(X[:3]).tolist() == ["setosa"] * 3
    assert report.calls()["LogisticRegression.predict"]["worker"] == 1


# ---------------------------------------------------------------- per call, the CPU where the worker cannot


def test_what_the_worker_cannot_do_runs_on_the_cpu_and_the_report_says_why(accelerated):
    from sklearn.metrics.pairwise import linear_kernel

    X, y = load_iris(return_X_y=True)
    assert SVC(kernel=linear_kernel).fit(X, y).score(X, y) > 0.9  # three classes, a kernel the worker cannot name
    assert "callable kernel" in next(iter(report.calls()["SVC.fit"]["reasons"]))
    import scipy.sparse as sp

    Xb, _ = make_blobs(n_samples=200, centers=3, random_state=0)
    km = KMeans(n_clusters=3, n_init=2, random_state=0).fit(sp.csr_matrix(Xb))  # cuML's KMeans: dense only
    assert km.cluster_centers_.shape == (3, 2)
    assert "Sparse data" in next(iter(report.calls()["KMeans.fit"]["reasons"]))
    assert report.calls()["SVC.fit"]["cpu"] == 1 and report.calls()["KMeans.fit"]["cpu"] == 1
    model = SVC(kernel=linear_kernel, decision_function_shape="ovo").fit(X, y=y)  # y by keyword: refused alike
    assert report.calls()["SVC.fit"]["cpu"] == 2
    assert model.decision_function(X).shape == (len(X), 3)  # scikit-learn's pairs (3 of them for 3 classes)
    assert "refused by the worker: " in report.table() and "callable kernel" in report.table()


def test_no_worker_at_all_runs_everything_on_the_cpu(accelerated, tmp_path):
    X, y = make_classification(n_samples=200, n_features=6, random_state=0)
    with sklearn_gpu_bridge.config_context(connection_file=str(tmp_path / "none.json"), start_local_worker=False):
        sklearn_gpu_bridge.reset_connection()
        pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
        served = pipe.predict(X)
    sklearn_gpu_bridge.reset_connection()
    accel.uninstall()
    np.testing.assert_array_equal(served, make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y).predict(X))
    assert "WorkerUnavailable" in next(iter(report.calls()["LogisticRegression.fit"]["reasons"]))


def test_a_search_with_threads_is_served(accelerated, connection):
    X, y = make_classification(n_samples=300, n_features=8, random_state=1)
    before = connection.status()["requests"].get("fit", 0)
    with joblib.parallel_config(backend="threading", n_jobs=3):
        search = GridSearchCV(SVC(), {"C": [0.5, 1, 2]}, cv=3).fit(X, y)
    assert connection.status()["requests"].get("fit", 0) - before == 3 * 3 + 1
    assert search.best_params_["C"] in (0.5, 1, 2)


def test_ipython_extension_installs_and_adds_a_report_magic():
    saved = dict(os.environ)
    magics = {}

    class Shell:
        def register_magic_function(self, function, kind, name):
            magics[name] = (function, kind)

    try:
        accel.load_ipython_extension(Shell())
        assert accel.is_installed() and magics["accel_report"][1] == "line"
    finally:
        accel.uninstall()
        report.reset()  # the report install opened (its folder goes)
        os.environ.clear()
        os.environ.update(saved)


def test_every_served_class_is_scikit_learns_and_has_a_wrapper():
    classes = serve.served_classes()
    assert len(classes) >= 30
    for name, cls in classes.items():
        assert cls.__module__.startswith("sklearn.") and name in ESTIMATORS


# ---------------------------------------------------------------- import cuml


def test_the_original_quickstart_runs_through_the_cuml_alias(tmp_path):
    (tmp_path / "quickstart.py").write_text(QUICKSTART)
    out = _python("-m", "sklearn_gpu_bridge.accel", "quickstart.py", tmp_path=tmp_path).stdout.splitlines()
    predictions = np.array(out[0].strip("[]").split(), dtype=np.float32)
    assert predictions.shape == (5,) and set(predictions) <= {0.0, 1.0}  # float32 labels come back as given
    assert out[1].startswith("26.")  # the worker's cuML, or the cuML whose API the alias serves


@client_without_cuml
def test_cuml_version_is_a_version_string_and_bridge_says_what_serves_it(tmp_path):
    """Code parses ``cuml.__version__`` (``packaging.version.Version``); what serves cuml is said elsewhere."""
    code = "import cuml, packaging.version as v; print(v.Version(cuml.__version__)); print(cuml.__bridge__)"
    version, bridge = _python("-m", "sklearn_gpu_bridge.accel", "-c", code, tmp_path=tmp_path).stdout.splitlines()
    if BACKEND == "sklearn":
        assert version == "26.10.0" and "running scikit-learn on the CPU" in bridge, bridge
    else:
        assert version.startswith("26.") and "running cuML 26." in bridge, bridge
    assert bridge.startswith(f"sklearn-gpu-bridge {sklearn_gpu_bridge.__version__}: cuML 26.10.00's API")


# every import path of cuML 26.10 that the alias serves (cuml/__init__.py and the submodules)
IMPORT_PATHS = [("cuml", name) for name in sorted(ESTIMATORS) if name not in cuml_alias.NOT_AT_TOP_LEVEL] + [
    (f"cuml.{row.module}", name) for name, row in sorted(ESTIMATORS.items())]


@client_without_cuml
def test_every_cuml_import_path_of_a_wrapped_class_works(tmp_path):
    code = "import importlib\n" + "".join(
        f"assert importlib.import_module({module!r}).{name}.__name__ == {name!r}\n" for module, name in IMPORT_PATHS)
    code += textwrap.dedent("""
        import cuml
        from cuml.common import set_global_output_type, using_output_type
        from cuml.model_selection import train_test_split
        from cuml.metrics import accuracy_score
        m = cuml.LogisticRegression(output_type="numpy", verbose=False, handle=None)
        assert m.get_params()["output_type"] == "numpy" and type(m).__module__ == "cuml.linear_model"
        print("ok", len(dir(cuml)))
    """)
    out = _python("-c", f"import sklearn_gpu_bridge.accel.cuml_alias as a; a.enable()\n{code}", tmp_path=tmp_path)
    assert out.stdout.startswith("ok")


@client_without_cuml
def test_output_types_numpy_pandas_and_input(tmp_path):
    code = textwrap.dedent("""
        import sklearn_gpu_bridge.accel.cuml_alias as a; a.enable()
        import warnings, numpy as np, pandas as pd, cuml
        X = pd.DataFrame(np.random.default_rng(0).random((50, 3)), columns=list("abc"))
        km = cuml.KMeans(n_clusters=2, random_state=0, n_init=1).fit(X)
        print(type(km.predict(X)).__name__)                     # "input": pandas in, pandas out
        print(type(km.predict(X.to_numpy())).__name__)
        cuml.set_global_output_type("numpy"); print(type(km.predict(X)).__name__)
        with cuml.using_output_type("pandas"): print(type(km.predict(X.to_numpy())).__name__)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cuml.KMeans(n_clusters=2, n_init=1, output_type="cupy").fit(X).predict(X)
        print(type(km.predict(X)).__name__, any("numpy arrays instead" in str(w.message) for w in seen))
    """)
    out = _python("-c", code, tmp_path=tmp_path).stdout.split()
    assert out == ["Series", "ndarray", "ndarray", "Series", "ndarray", "True"]


def test_the_alias_never_shadows_a_real_cuml(tmp_path):
    fake = tmp_path / "site" / "cuml"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    code = textwrap.dedent("""
        import sklearn_gpu_bridge.accel.cuml_alias as a; a.enable()
        import cuml
        print(getattr(cuml, "REAL", False), a.real_cuml_importable())
        try:
            a.install_pth()
        except Exception as exc:
            print(type(exc).__name__)
    """)
    client_path = CLIENT_PATH if CLIENT_PATH is not None else os.environ.get("PYTHONPATH", "")
    out = _python("-c", code, tmp_path=tmp_path,
                  env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), client_path]))})
    out = out.stdout.split()
    assert out == ["True", "True", "ConfigurationError"]


@client_without_cuml
def test_alias_install_makes_import_cuml_work_in_the_environment_and_uninstall_removes_it(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # this interpreter's path (the new environment sees only the base one's packages); for a client without
    # cuML, its own site first and no folder that holds a real cuML
    path = [p for p in sys.path if p]
    if CLIENT_PATH is not None:
        path = [CLIENT_PATH] + [p for p in path if not os.path.isdir(os.path.join(p, "cuml"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    probe = [python, "-c", "import cuml; print(cuml.__name__, cuml.__sklearn_gpu_bridge__)"]
    assert subprocess.run(probe, capture_output=True, env=env, timeout=60).returncode != 0
    install = subprocess.run([python, "-m", "sklearn_gpu_bridge", "alias", "install"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert install.returncode == 0, install.stderr
    assert str(venv) in install.stdout
    assert subprocess.run(probe, capture_output=True, text=True, env=env, timeout=60).stdout.split() == \
        ["cuml", "True"]
    subprocess.run([python, "-m", "sklearn_gpu_bridge", "alias", "uninstall"], check=True, env=env, timeout=60)
    assert subprocess.run(probe, capture_output=True, env=env, timeout=60).returncode != 0
    assert not list(venv.rglob(cuml_alias.PTH_NAME))


def _wheel(folder):
    """A wheel of this checkout, laid out as pyproject.toml says, zipped here (no build backend, no network)."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parent.parent
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    version = sklearn_gpu_bridge.__version__
    info = f"sklearn_gpu_bridge-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: sklearn-gpu-bridge\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{info}/entry_points.txt": "[console_scripts]\nsklearn-gpu-bridge = sklearn_gpu_bridge.cli:main\n"}
    for package in setup["packages"]:  # each package's own files; its subpackages are listed too
        source = root / setup["package-dir"].get(package, package.replace(".", "/"))
        for path in sorted(source.iterdir()):
            if path.is_file() and path.suffix in (".py", ".typed"):
                files[f"{package.replace('.', '/')}/{path.name}"] = path.read_text()
    record = []
    for name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = Path(folder) / f"sklearn_gpu_bridge-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def _bare_venv(folder):
    """A virtualenv of this Python's base, without pip, and a folder holding click alone for its PYTHONPATH."""
    venv = Path(folder) / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    deps = Path(folder) / "deps"
    deps.mkdir()
    (deps / "click").symlink_to(Path(click.__file__).parent)  # all that `alias install` needs besides the package
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return venv, Path(site), {**os.environ, "PYTHONPATH": str(deps)}


def test_the_alias_pth_does_nothing_once_the_package_is_uninstalled(tmp_path):
    """``pip uninstall`` leaves the alias's .pth (no package owns it); each start of Python must stay silent."""
    venv, site, env = _bare_venv(tmp_path)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", str(_wheel(tmp_path))], check=True, env=env,
                   timeout=300, capture_output=True)
    install = subprocess.run([str(venv / "bin" / "sklearn-gpu-bridge"), "alias", "install"], capture_output=True,
                             text=True, env=env, timeout=60)
    assert install.returncode == 0, install.stderr
    probe = [python, "-c", "import cuml; print(cuml.__sklearn_gpu_bridge__)"]
    assert subprocess.run(probe, capture_output=True, text=True, env=env, timeout=60).stdout == "True\n"
    subprocess.run([*pip, "uninstall", "-y", "sklearn-gpu-bridge"], check=True, env=env, timeout=300,
                   capture_output=True)
    assert (site / cuml_alias.PTH_NAME).exists() and not (site / "sklearn_gpu_bridge").exists()
    start = subprocess.run([python, "-c", "pass"], capture_output=True, text=True, env=env, timeout=60)
    assert (start.returncode, start.stdout, start.stderr) == (0, "", "")


def test_alias_install_writes_the_pth_0644_whatever_the_umask_and_never_into_a_folder_all_may_write(tmp_path):
    venv, site, env = _bare_venv(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *[p for p in sys.path if p]])  # the package too
    install = [str(venv / "bin" / "python"), "-m", "sklearn_gpu_bridge", "alias", "install"]
    site.chmod(site.stat().st_mode | stat.S_IWOTH)
    try:
        refused = subprocess.run(install, capture_output=True, text=True, env=env, timeout=60)
    finally:
        site.chmod(site.stat().st_mode & ~stat.S_IWOTH)
    assert refused.returncode == 1 and f"chmod o-w {site}" in refused.stderr, refused.stderr
    assert not (site / cuml_alias.PTH_NAME).exists()
    run = subprocess.run(install, capture_output=True, text=True, env=env, timeout=60, umask=0)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE((site / cuml_alias.PTH_NAME).stat().st_mode) == 0o644
    assert [p.name for p in site.iterdir() if p.name.startswith(".")] == []  # no temporary file left
