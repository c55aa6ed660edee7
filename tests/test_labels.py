"""A cuML worker encodes a classifier's labels on the host where they are their own codes (worker/labels.py).

The host's answer must be cuML's own, exactly: the same classes and codes, of the same dtypes, for every y it
answers for; every other y goes to cuML. The oracle on the CPU is ``np.unique`` (cuML's encoding is
``cupy.unique``); on the GPU machine, cuML's own ``check_y`` and the model cuML fits in process.
"""

import types

import numpy as np
import pytest

import sklearn_gpu_bridge
from sklearn_gpu_bridge import GPUSVC, GPULogisticRegression
from sklearn_gpu_bridge.worker.labels import HOST_MAX_SAMPLES, HostLabels, encode_on_host, own_codes

from .conftest import WorkerProcess, use_worker

rng = np.random.default_rng(0)

#: (what it is, y, whether its labels are their own codes)
LABELS = [
    ("two classes", rng.integers(0, 2, 5000).astype(np.int32), True),
    ("five classes, int64", rng.permutation(np.arange(1000) % 5), True),
    ("one class", np.zeros(10, np.int32), True),
    ("uint8", rng.integers(0, 3, 300).astype(np.uint8), True),
    ("as many classes as samples", rng.permutation(50).astype(np.int16), True),
    ("the most samples answered here", np.arange(HOST_MAX_SAMPLES) % 7, True),
    ("a class absent", np.array([0, 2, 2, 0], np.int32), False),
    ("from one", np.array([1, 2, 1, 2], np.int32), False),
    ("negative", np.array([-1, 0, 1, 0], np.int32), False),
    ("a label past the samples", np.array([0, 1, 1000], np.int64), False),
    ("one sample more than answered here", np.arange(HOST_MAX_SAMPLES + 1) % 7, False),
    ("two classes, more samples than that", (np.arange(HOST_MAX_SAMPLES + 1) % 2).astype(np.int32), True),
    ("one class, more samples than that", np.zeros(HOST_MAX_SAMPLES + 1, np.uint8), True),
    ("two classes from one, more samples than that", np.arange(HOST_MAX_SAMPLES + 1) % 2 + 1, False),
    ("three classes, more samples than that", (np.arange(HOST_MAX_SAMPLES + 1) % 3).astype(np.int32), False),
    ("int8", rng.integers(0, 4, 400).astype(np.int8), True),
    ("uint32", rng.integers(0, 2, 400).astype(np.uint32), True),
    ("every other of codes", np.arange(600) % 3, True),  # made a view of every other one below
    ("uint64", np.array([0, 1], np.uint64), False),
    ("big-endian", np.array([0, 1, 0], ">i4"), False),
    ("floats", np.array([0.0, 1.0, 0.0]), False),
    ("booleans", np.array([True, False]), False),
    ("strings", np.array(["a", "b"]), False),
    ("a column", np.array([[0], [1]], np.int32), False),
    ("empty", np.array([], np.int32), False),
    ("a list", [0, 1, 0], False),
]
LABELS = [(what, y[::2] if what.startswith("every other") else y, own) for what, y, own in LABELS]


@pytest.mark.parametrize("what, y, own", LABELS, ids=[case[0] for case in LABELS])
def test_labels_that_are_their_own_codes_are_told_from_all_others(what, y, own):
    """Where ``own_codes`` says k, ``np.unique(y, return_inverse=True)`` is ``(arange(k), y)``: what the host
    answers. Where it says None, the labels go to cuML; those that are their own codes are not answered only where
    the host would not be the faster (past HOST_MAX_SAMPLES, of more than two classes) or cannot count them
    (uint64)."""
    k = own_codes(y)
    assert (k is not None) == own
    if own:
        classes, codes = np.unique(y, return_inverse=True)
        np.testing.assert_array_equal(classes, np.arange(k))
        np.testing.assert_array_equal(codes, y)


def test_every_other_y_and_call_goes_to_cuml_s_own_check_y_with_its_arguments():
    """What the host does not answer reaches cuML's ``check_y`` as it was asked (its arguments unchanged)."""
    calls = []

    def check_y(y, **kwargs):  # stands in for cuML's, which this process does not have
        calls.append((y, kwargs))
        return "cuML's answer"

    host = HostLabels(check_y)
    own = np.array([0, 1, 1, 0], np.int32)
    asked = [(np.array([1, 2]), {"return_classes": True}), (own, {"return_classes": False}),
             (own, {"return_classes": True, "mem_type": "host"}), (own, {"return_classes": True, "return_index": True}),
             (own, {"return_classes": True, "order": "X"}), (own, {"return_classes": np.array([0, 1])})]
    for y, kwargs in asked:
        assert host(y, **kwargs) == "cuML's answer"
        passed_y, passed = calls[-1]
        assert passed_y is y and all(passed[name] is value for name, value in kwargs.items())
    assert len(calls) == len(asked) and host.taken == 0


def test_cuml_keeps_its_own_encoding_where_its_check_y_is_not_the_one_known():
    """The host answers only for a ``check_y`` of the parameters and defaults it assumes, once per process; where
    it does not, ``check_y`` is left as it was."""
    def other_check_y(y, *, dtype=None, mem_type="host", order="A", return_classes=False, return_index=False):
        return y

    validation = types.SimpleNamespace(check_y=other_check_y)
    assert encode_on_host(validation) is None and validation.check_y is other_check_y
    installed = HostLabels(other_check_y)
    validation.check_y = installed
    assert encode_on_host(validation) is installed  # installed already: the same, not wrapped twice


@pytest.mark.gpu
@pytest.mark.parametrize("what, y, own", LABELS, ids=[case[0] for case in LABELS])
@pytest.mark.parametrize("kwargs", [{"return_classes": True}, {"return_classes": True, "dtype": ["float32"]},
                                    {"return_classes": True, "dtype": "int32"}, {"return_classes": True, "order": "F"},
                                    {"return_classes": True, "order": "C"}, {"return_classes": True, "mem_type": "host"},
                                    {"return_classes": True, "return_index": True},
                                    {"return_classes": True, "accept_multi_output": True},
                                    {"return_classes": True, "ensure_discrete_classes": False},
                                    {"return_classes": False}],
                         ids=["classes", "codes as float32", "codes as int32", "order F", "order C", "on the host",
                              "with the index", "multi-output accepted", "classes not checked", "no classes"])
def test_the_host_answers_cuml_s_check_y_as_cuml_does(what, y, own, kwargs):
    """Arrays of the same type, dtype, shape and values as cuML's own ``check_y`` gives, or its error; and the host
    answers exactly where the labels are their own codes and cuML is asked for codes on the device."""
    import cupy
    from cuml.internals import validation

    original = validation.check_y
    if isinstance(original, HostLabels):  # installed in this process already
        original = original.original
    host = HostLabels(original)

    def outcome(check):
        try:
            out = check(y, **kwargs)
        except Exception as exc:  # noqa: BLE001 - cuML's refusal must be the host's too
            return type(exc), str(exc)
        return out if kwargs["return_classes"] else (out,)

    expected, got = outcome(original), outcome(host)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        if theirs is None:  # the index of an array, asked for
            assert mine is None
        elif isinstance(theirs, (type, str)):  # an error's type and words
            assert mine == theirs
        else:
            assert (type(mine), mine.dtype, mine.shape) == (type(theirs), theirs.dtype, theirs.shape)
            np.testing.assert_array_equal(cupy.asnumpy(mine), cupy.asnumpy(theirs))
    answered = (own and kwargs["return_classes"] is True and kwargs.get("mem_type", "device") == "device"
                and not kwargs.get("return_index"))
    assert host.taken == int(answered)


@pytest.mark.gpu
def test_a_cuml_worker_fits_classifiers_on_labels_encoded_on_the_host(tmp_path, worker):
    """Through a cuML worker, LogisticRegression and SVC predict as cuML fitted in this process does with its own
    encoding (``check_y`` is replaced only in a worker's process), their labels encoded on the host (the worker's
    status counts the fits)."""
    from cuml.internals import validation
    from cuml.linear_model import LogisticRegression
    from cuml.svm import SVC

    assert not isinstance(validation.check_y, HostLabels)  # the encoding the host's replaces
    data = np.random.default_rng(1)
    X = data.standard_normal((2000, 8)).astype(np.float32)
    y = np.where(X[:, 0] + 0.3 * data.standard_normal(2000) > 0, 7, 3)  # the client sends them as codes 1 and 0
    process = WorkerProcess(tmp_path)
    try:
        use_worker(process)
        connection = sklearn_gpu_bridge.get_connection()
        before = connection.status()["labels_on_host"]  # the worker's warm-up fits count too
        for bridged, in_process in ((GPULogisticRegression(), LogisticRegression()), (GPUSVC(), SVC())):
            bridged.fit(X, y)
            in_process.fit(X, y)
            np.testing.assert_array_equal(bridged.classes_, [3, 7])
            scores = in_process.decision_function(X)
            np.testing.assert_allclose(bridged.decision_function(X), scores, rtol=1e-3, atol=1e-3)  # float32 solvers
            clear = np.abs(scores) > 1e-3  # the labels of points not on the boundary, exactly
            np.testing.assert_array_equal(bridged.predict(X)[clear], in_process.predict(X)[clear])
        after = connection.status()["labels_on_host"]
        assert before is not None and after - before == 2
    finally:
        sklearn_gpu_bridge.reset_connection()
        process.stop()
        use_worker(worker)
